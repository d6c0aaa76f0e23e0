"""`dplint run`: torchrun's interface, on N CPU ranks in a gloo group, with dplint's checks.

Outside `dplint.runtime`, whose import imports torch (seconds): the command line is read and checked,
and `--help` answered, without torch; the runtime is imported once a run starts.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, List, Optional, Sequence, TextIO

from dplint.reporters import FORMATS, HUMAN_FORMATS, use_colour
from dplint.finding import Finding
from dplint.run_options import ALL_CHECKS, CHECKS_HELP, DEFAULT_TIMEOUT

# torchrun's rendezvous and restart flags: accepted and ignored (every node runs here, at dplint's own store), said once.
_RENDEZVOUS = ("rdzv-id", "rdzv-endpoint", "rdzv-backend", "rdzv-conf", "master-addr", "master-port", "node-rank", "max-restarts")
_RUNTIME_EXTRA = "pip install '.[runtime]' in a clone of dplint (pip install 'dplint[runtime]' once it is published)"


def build_parser() -> argparse.ArgumentParser:
    width = max(map(len, ALL_CHECKS))
    listed = "\n".join(f"  {name:<{width}}  {CHECKS_HELP[name]}" for name in ALL_CHECKS)
    parser = argparse.ArgumentParser(
        prog="dplint run",
        description="Run a torchrun training script on N CPU processes joined in a gloo process group, with "
        "dplint's distributed checks. NCCL runs as gloo; the GPUs are emulated, with the data on the CPU.",
        epilog=f"checks (--checks, default all):\n{listed}\n\n"
        "The findings are the linter's, in its formats (--format); a rank's own error goes to stderr with its traceback.\n"
        "With a machine format (json, json-lines, sarif, junit, gitlab, github) and no -o, stdout holds the report\n"
        "alone: what the script and its ranks print goes to stderr.\n"
        "torchrun's rendezvous flags (--rdzv-id, --rdzv-endpoint, --rdzv-backend, --rdzv-conf, --master-addr,\n"
        "--master-port, --node-rank, --max-restarts) are accepted and ignored: every node runs here, at dplint's own store.\n"
        "Exit status: 0 every rank joined the process group and finished with no findings, 1 findings or a\n"
        "failed rank, 2 usage error or ranks that did not join, 130 interrupted.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nproc-per-node", "--nproc_per_node", dest="nprocs", type=int, metavar="N",
                        help="processes (ranks) to start (default: 2)")  # fmt: skip
    parser.add_argument("--gpus-per-node", dest="gpus", type=int, metavar="N",
                        help="GPUs each rank sees, emulated on the CPU (default: one per rank; 0: none, CUDA hidden)")  # fmt: skip
    parser.add_argument("--devices", type=int, metavar="N",
                        help="a DataParallel script: one process, as `python script.py`, with N emulated GPUs and its "
                        "DataParallel forwards simulated on them, with the DataParallel checks")  # fmt: skip
    parser.add_argument("--nnodes", default="1", metavar="N",
                        help="nodes to emulate on this machine, each with --nproc-per-node ranks and its own GPUs, "
                        "ranks numbered node by node as torchrun numbers them (default: 1)")  # fmt: skip
    parser.add_argument("--standalone", action="store_true", help="accepted for torchrun compatibility (always standalone)")
    for flag in _RENDEZVOUS:
        parser.add_argument(f"--{flag}", f"--{flag.replace('-', '_')}", dest=f"rendezvous_{flag.replace('-', '_')}",
                            metavar="VALUE", help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"longest wait on a peer (a collective, the rendezvous) before it is a hang (default: {DEFAULT_TIMEOUT:g})")  # fmt: skip
    parser.add_argument("--checks", metavar="NAMES", help="comma-separated checks to run (default: all; listed below)")
    parser.add_argument("--format", choices=FORMATS, help="how the findings are written (default: full on a terminal, concise otherwise)")
    parser.add_argument("-o", "--output-file", metavar="PATH", help="write the findings to PATH instead of standard output")
    parser.add_argument("-m", "--module", action="store_true", help="run the target as a module, like `python -m`")
    parser.add_argument("training_script", help="the script (or, with -m, the module) to run")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the launcher, which stops the ranks


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.nnodes = _nodes(parser, args.nnodes)
    given = [f"--{flag}" for flag in _RENDEZVOUS if getattr(args, f"rendezvous_{flag.replace('-', '_')}") is not None]
    if given:
        print(f"dplint: {', '.join(given)} ignored: the ranks of every node meet at dplint's own store, on this machine", file=sys.stderr)
    if args.nprocs is not None and args.nprocs < 1:
        parser.error(f"--nproc-per-node must be at least 1, got {args.nprocs}")
    if args.devices is not None:
        if args.devices < 1:
            parser.error(f"--devices must be at least 1, got {args.devices}")
        if args.nprocs is not None or args.gpus is not None or args.nnodes != 1:
            parser.error("--devices runs one process with N GPUs: it takes no --nproc-per-node, --gpus-per-node or --nnodes")
        args.nprocs, args.gpus = 1, args.devices
    elif args.nprocs is None:
        args.nprocs = 2
    if args.gpus is not None and args.gpus < 0:
        parser.error(f"--gpus-per-node must be 0 or more, got {args.gpus}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout:g}")
    checks = list(ALL_CHECKS)
    if args.checks is not None:
        checks = [name.strip() for name in args.checks.split(",") if name.strip()]
        if not checks:
            parser.error(f"--checks names no check; choose from {', '.join(ALL_CHECKS)}")
    unknown = sorted(set(checks) - set(ALL_CHECKS))
    if unknown:
        parser.error(f"unknown checks {', '.join(unknown)}; choose from {', '.join(ALL_CHECKS)}")
    if not args.module and not os.path.isfile(args.training_script):
        parser.error(f"no such script: {args.training_script}")
    try:
        import torch  # noqa: F401 - only to say clearly that it is missing
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "torch":
            raise
        print(f"dplint run: error: `dplint run` needs the runtime extra: {_RUNTIME_EXTRA} ({error})", file=sys.stderr)
        return 2
    from dplint.runtime.distributed.launcher import run_script

    target = ["-m", args.training_script] if args.module else [args.training_script]
    terminate = signal.signal(signal.SIGTERM, _terminated)
    try:
        # A machine format on stdout is parsed whole: the script's own prints go to stderr, beside dplint's notes.
        prints_to_stderr = args.format not in (None, *HUMAN_FORMATS) and not args.output_file
        outcome = run_script(
            [*target, *args.training_script_args], args.nprocs, args.timeout, checks, args.gpus, args.devices is not None, prints_to_stderr,
            args.nnodes,
        )  # fmt: skip
    except KeyboardInterrupt:  # before the ranks started
        print("dplint run: interrupted; the ranks were stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, terminate)
    if outcome.interrupted is not None:
        return _interrupted(outcome, args)
    error = outcome.error()
    findings = outcome.reported()
    if not _report(findings, args):
        return 2
    if error is not None and error.failure is not None and not error.failure.code:
        print(f"dplint run: {error.failure_text(alone=args.devices is not None)}", file=sys.stderr)
        return 2 if error.failure.kind == "SetupError" else 1
    if error is not None and error.incomplete:
        print(f"dplint run: {error.incomplete}", file=sys.stderr)
        return 2
    if findings:
        return 1
    if args.devices is not None:
        print(f"dplint run: the script finished on {args.devices} emulated GPUs; no pitfalls found", file=sys.stderr)
        return 0
    world = args.nprocs * args.nnodes
    nodes = f" on {args.nnodes} emulated nodes" if args.nnodes > 1 else ""
    print(f"dplint run: {world} rank{'s' * (world != 1)}{nodes} finished; no distributed pitfalls found", file=sys.stderr)
    return 0


def _nodes(parser: argparse.ArgumentParser, given: str) -> int:
    """torchrun's `--nnodes N` (or `N:N`); an elastic range `MIN:MAX` has no one size to emulate."""
    low, _, high = given.partition(":")
    if not (low.isdigit() and (not high or high.isdigit())):
        parser.error(f"--nnodes takes a number of nodes, got {given}")
    if high and high != low:
        parser.error(f"--nnodes {given} is an elastic range; dplint emulates a fixed number of nodes: give one (--nnodes {high})")
    if int(low) < 1:
        parser.error(f"--nnodes must be at least 1, got {given}")
    return int(low)


def _interrupted(outcome: Any, args: argparse.Namespace) -> int:
    """A run stopped by Ctrl-C or a signal: the findings the ranks made so far, then how it ended."""
    stopped = outcome.interrupted
    status = 130 if isinstance(stopped, KeyboardInterrupt) else (stopped.code if isinstance(stopped.code, int) else 1)
    how = "interrupted" if isinstance(stopped, KeyboardInterrupt) else f"stopped by signal {status - 128}"
    findings = outcome.findings
    _report(findings, args)
    so_far = f"; {len(findings)} finding{'s' * (len(findings) != 1)} so far" if findings else "; no findings so far"
    print(f"dplint run: {how}; the ranks were stopped{so_far}", file=sys.stderr)
    return status


def _report(findings: List[Finding], args: argparse.Namespace) -> bool:
    """The findings through the linter's reporters (False: the output file could not be written). A human
    format with nothing to say writes nothing, and ends with no summary: the exit line says it; a machine
    format or an output file is written even when clean."""
    from dplint import reporters

    if not (findings or args.output_file or (args.format or "concise") not in ("full", "concise")):
        return True

    def write(out: TextIO) -> None:
        chosen = args.format or ("full" if out.isatty() else "concise")
        reporters.write_report(chosen, findings, out, reporters.reading(), use_colour("auto", out), show_summary=False)

    try:
        if args.output_file:
            with open(args.output_file, "w", encoding="utf-8") as handle:
                write(handle)
        else:
            write(sys.stdout)
    except OSError as problem:
        print(f"dplint run: error: cannot write {args.output_file}: {problem.strerror or problem}", file=sys.stderr)
        return False
    return True