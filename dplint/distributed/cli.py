"""`dplint run`: torchrun's interface, on N CPU ranks in a gloo group, with dplint's checks."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from dplint.distributed.checks import ALL_CHECKS
from dplint.distributed.launcher import DEFAULT_TIMEOUT, run_script


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dplint run",
        description="Run a torchrun training script on N CPU processes joined in a gloo process group, with "
        "dplint's distributed checks. NCCL runs as gloo; CUDA is hidden, so scripts take their CPU path.",
        epilog="Exit status: 0 the ranks finished with no findings, 1 findings or a failed rank, 2 usage error.",
    )
    parser.add_argument("--nproc-per-node", "--nproc_per_node", dest="nprocs", type=int, default=2, metavar="N",
                        help="processes (ranks) to start (default: 2)")  # fmt: skip
    parser.add_argument("--nnodes", default="1", help="accepted for torchrun compatibility; only 1 node is run")
    parser.add_argument("--standalone", action="store_true", help="accepted for torchrun compatibility (always standalone)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"longest wait on a peer (a collective, the rendezvous) before it is a hang (default: {DEFAULT_TIMEOUT:g})")  # fmt: skip
    parser.add_argument("--checks", metavar="NAMES", help=f"comma-separated checks to run (default: all of {','.join(ALL_CHECKS)})")
    parser.add_argument("-m", "--module", action="store_true", help="run the target as a module, like `python -m`")
    parser.add_argument("training_script", help="the script (or, with -m, the module) to run")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.nnodes not in ("1", "1:1"):
        parser.error(f"only one node is run on CPU; got --nnodes {args.nnodes}")
    if args.nprocs < 1:
        parser.error(f"--nproc-per-node must be at least 1, got {args.nprocs}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout:g}")
    checks = [name.strip() for name in args.checks.split(",") if name.strip()] if args.checks else list(ALL_CHECKS)
    unknown = sorted(set(checks) - set(ALL_CHECKS))
    if unknown:
        parser.error(f"unknown checks {', '.join(unknown)}; choose from {', '.join(ALL_CHECKS)}")
    if not args.module and not os.path.isfile(args.training_script):
        parser.error(f"no such script: {args.training_script}")
    target = ["-m", args.training_script] if args.module else [args.training_script]
    outcome = run_script([*target, *args.training_script_args], args.nprocs, args.timeout, checks)
    error = outcome.error()
    for finding in outcome.findings:
        print(finding)
    if error is not None and error.failure is not None:
        print(f"dplint run: {error.failure_text()}", file=sys.stderr)
        return 1
    if outcome.findings:
        return 1
    print(f"dplint run: {args.nprocs} rank{'s' * (args.nprocs != 1)} finished; no distributed pitfalls found", file=sys.stderr)
    return 0
