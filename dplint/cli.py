"""`dplint [PATHS...]`: exit 0 when clean, 1 with findings, 2 on usage, configuration or internal errors."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, TextIO

from dplint import __version__
from dplint.config import ConfigError, Settings, parse_per_file_ignores, resolve_settings
from dplint.finding import Finding

FORMATS = ("full", "concise", "json")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dplint",
        description="Find PyTorch multi-GPU pitfalls (DataParallel, devices, CUDA_VISIBLE_DEVICES) in Python source.",
        epilog="Exit status: 0 no findings, 1 findings, 2 usage, configuration or internal error.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or folders to lint (default: .); `-` reads standard input")
    parser.add_argument("--format", choices=FORMATS, help="output format (default: full on a terminal, concise otherwise)")
    parser.add_argument("--select", metavar="CODES", help="comma-separated codes or prefixes to enable (ALL for every rule)")
    parser.add_argument("--ignore", metavar="CODES", help="comma-separated codes or prefixes to disable")
    parser.add_argument("--extend-select", metavar="CODES", help="codes or prefixes to enable on top of the selection")
    parser.add_argument(
        "--per-file-ignores", metavar="PATTERN:CODES", action="append", help="ignore codes in files matching a glob (repeatable)"
    )
    parser.add_argument("--exclude", metavar="PATTERNS", help="comma-separated patterns to skip, replacing the defaults")
    parser.add_argument("--extend-exclude", metavar="PATTERNS", help="comma-separated patterns to skip besides the defaults")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    parser.add_argument("--statistics", action="store_true", help="print the number of findings per rule instead of the findings")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write .dplint_cache/")
    parser.add_argument("-j", "--jobs", type=int, metavar="N", help="worker processes (default: all cores)")
    parser.add_argument("--stdin-filename", metavar="NAME", help="the name to report for code read from standard input")
    parser.add_argument("--explain", metavar="CODE", help="print a rule's documentation and exit")
    parser.add_argument("--list-rules", action="store_true", help="list every rule with its default state and exit")
    parser.add_argument("--version", action="version", version=f"dplint {__version__}")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ConfigError as error:
        print(f"dplint: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `dplint src | head`
        sys.stderr.close()
        return 1


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if args.explain:
        return explain(args.explain, out)
    if args.list_rules:
        return list_rules(out, as_json=args.format == "json")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError("--jobs must be at least 1.")

    paths = [Path(p) for p in (args.paths or ["."])]
    reading_stdin = [str(p) for p in paths] == ["-"]
    start = Path(args.stdin_filename) if reading_stdin and args.stdin_filename else (Path.cwd() if reading_stdin else paths[0])
    settings = resolve_settings(start, overrides(args))

    if reading_stdin:
        findings, errors, sources = lint_stdin(args.stdin_filename or "<stdin>", settings)
    else:
        from dplint.api import lint_paths

        result = lint_paths(paths, settings, jobs=args.jobs, cache=not args.no_cache)
        findings, errors, sources = result.findings, result.internal_errors, {}

    report(findings, args, out, sources)
    for error in errors:
        print(f"dplint: internal error in rule {error.code} while linting {error.path}:\n{error.details}", file=sys.stderr)
    if errors:
        print(
            f"dplint: {len(errors)} internal error(s): this is a bug in dplint, not in your code; please report it.",
            file=sys.stderr,
        )
        return 2
    return 0 if args.exit_zero or not findings else 1


def overrides(args: argparse.Namespace) -> Dict[str, object]:
    per_file = parse_per_file_ignores(args.per_file_ignores) if args.per_file_ignores else None
    return {
        "select": args.select,
        "ignore": args.ignore,
        "extend-select": args.extend_select,
        "per-file-ignores": per_file,
        "exclude": args.exclude,
        "extend-exclude": args.extend_exclude,
    }


def lint_stdin(name: str, settings: Settings):
    from dplint.engine import SourceFile, Unreadable, check_file, decode, parse_error_finding
    from dplint.facts import ProjectFacts, collect_file_facts, module_identity

    path = Path(name)
    source = SourceFile(str(path.absolute()), name, *module_identity(path.absolute()))
    try:
        text = decode(sys.stdin.buffer.read())
    except Unreadable as error:
        return [parse_error_finding(source, error)], [], {}
    facts = collect_file_facts(text, source.module_name, source.package, name)
    result = check_file(source, text, settings, ProjectFacts.build([facts]), facts)
    return sorted(result.findings, key=Finding.sort_key), list(result.internal_errors), {source.filename: text}


def report(findings: List[Finding], args: argparse.Namespace, out: TextIO, sources: Dict[str, str]) -> None:
    from dplint import reporters

    terminal = out.isatty()
    output_format = args.format or ("full" if terminal else "concise")
    if args.statistics:
        reporters.write_statistics(findings, out, as_json=output_format == "json")
    elif output_format == "json":
        reporters.write_json(findings, out)
    elif output_format == "concise":
        reporters.write_concise(findings, out)
    else:
        colour = terminal and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        reporters.write_full(findings, out, _source_lines(sources), colour)


def _source_lines(sources: Dict[str, str]):
    cache: Dict[str, Optional[List[str]]] = {}

    def lines(filename: str) -> Optional[List[str]]:
        if filename not in cache:
            if filename in sources:
                cache[filename] = sources[filename].splitlines()
            else:
                try:
                    cache[filename] = Path(filename).read_text(encoding="utf-8", errors="replace").splitlines()
                except OSError:
                    cache[filename] = None
        return cache[filename]

    return lines


def explain(code: str, out: TextIO) -> int:
    from dplint.rules import BY_CODE

    rule = BY_CODE.get(code.strip().upper())
    if rule is None:
        raise ConfigError(f"--explain: unknown rule code `{code}`; see `dplint --list-rules`.")
    out.write(rule.explain())
    return 0


def list_rules(out: TextIO, as_json: bool) -> int:
    from dplint.rules import ALL_RULES

    rows = [
        {
            "code": rule.code,
            "name": rule.name,
            "severity": rule.severity,
            "enabled_by_default": rule.enabled_by_default and not rule.runtime_only,
            "runtime_only": rule.runtime_only,
            "summary": rule.summary,
        }
        for rule in ALL_RULES
    ]
    if as_json:
        json.dump(rows, out, indent=2)
        out.write("\n")
        return 0
    width = max(len(row["name"]) for row in rows)  # type: ignore[arg-type]
    for row in rows:
        state = "runtime" if row["runtime_only"] else "on" if row["enabled_by_default"] else "off"
        out.write(f"{row['code']}  {row['name']:<{width}}  {row['severity']:<7}  {state:<7}  {row['summary']}\n")
    return 0
