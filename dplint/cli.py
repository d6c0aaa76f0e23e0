"""`dplint [PATHS...]`: exit 0 when clean, 1 with findings, 2 on usage, configuration or internal errors."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, TextIO

from dplint import __version__
from dplint.config import (
    ConfigError,
    Settings,
    parse_per_file_ignores,
    resolve_settings,
)
from dplint.finding import Finding

FORMATS = ("full", "concise", "json", "json-lines", "github", "sarif", "junit", "gitlab")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dplint",
        description="Find PyTorch multi-GPU pitfalls (DataParallel, devices, CUDA_VISIBLE_DEVICES) in Python source.",
        epilog="Exit status: 0 no findings, 1 findings, 2 usage, configuration or internal error. "
        "`dplint server` starts the language server on stdio (install with `pip install 'dplint[server]'`).",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or folders to lint (default: .); `-` reads standard input")
    parser.add_argument("--format", choices=FORMATS, help="output format (default: full on a terminal, concise otherwise)")
    parser.add_argument("-o", "--output-file", metavar="PATH", help="write the report to PATH instead of standard output")
    parser.add_argument("--fix", action="store_true", help="apply the fixes rules offer (safe ones only, unless --unsafe-fixes)")
    parser.add_argument("--unsafe-fixes", action="store_true", help="also offer and apply fixes marked unsafe")
    parser.add_argument("--diff", action="store_true", help="print the fixes as a unified diff and change nothing")
    parser.add_argument("--show-fixes", action="store_true", help="with --fix: list what was fixed")
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
    parser.add_argument(
        "--project-root", metavar="DIR", help="where cross-file facts come from (default: the nearest folder with pyproject.toml, setup.cfg, setup.py or .git)"
    )
    parser.add_argument("-j", "--jobs", type=int, metavar="N", help="worker processes (default: all cores)")
    parser.add_argument("--stdin-filename", metavar="NAME", help="the name to report for code read from standard input")
    parser.add_argument("--explain", metavar="CODE", help="print a rule's documentation and exit")
    parser.add_argument("--list-rules", action="store_true", help="list every rule with its default state and exit")
    parser.add_argument("--version", action="version", version=f"dplint {__version__}")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["server"]:
        return serve(argv[1:])
    if argv[:1] == ["run"]:  # `dplint run --nproc-per-node N script.py`: the distributed runtime
        from dplint.distributed.cli import main as run_main

        return run_main(argv[1:])
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


def serve(options: Sequence[str]) -> int:
    """`dplint server [--stdio]`: the language server, on stdio (a folder named `server` is linted as `./server`)."""
    if any(option != "--stdio" for option in options):
        print(f"dplint: error: `dplint server` takes no arguments but --stdio, got {' '.join(options)}", file=sys.stderr)
        return 2
    try:
        from dplint.server.server import main as run_server
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in ("pygls", "lsprotocol", "cattrs"):
            raise
        print(f"dplint: error: `dplint server` needs the server extra: pip install 'dplint[server]' ({error})", file=sys.stderr)
        return 2
    return run_server()


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
        if args.fix or args.diff:
            raise ConfigError("--fix and --diff change files; they cannot be used with standard input.")
        findings, errors, sources = lint_stdin(args.stdin_filename or "<stdin>", settings)
    else:
        from dplint.api import lint_paths

        result = lint_paths(paths, settings, jobs=args.jobs, cache=not args.no_cache)
        findings, errors, sources = result.findings, result.internal_errors, {}
        if args.diff and not errors:
            return show_diff(findings, args.unsafe_fixes, out)
        if args.fix and not errors:
            fixed = fix_files(findings, args.unsafe_fixes)
            if fixed:
                result = lint_paths(paths, settings, jobs=args.jobs, cache=not args.no_cache)
                findings, errors = result.findings, result.internal_errors
            report_fixes(fixed, len(findings), args.show_fixes)

    if args.output_file:
        try:
            with open(args.output_file, "w", encoding="utf-8") as handle:
                report(findings, args, handle, sources)
        except OSError as error:
            raise ConfigError(f"cannot write {args.output_file}: {error.strerror or error}") from None
    else:
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
        "project-root": args.project_root,
    }


def lint_stdin(name: str, settings: Settings):
    from dplint.api import lint_text
    from dplint.engine import SourceFile, Unreadable, decode, parse_error_finding
    from dplint.analysis.facts import module_identity

    path = Path(name)
    source = SourceFile(str(path.absolute()), name, *module_identity(path.absolute()))
    try:
        text = decode(sys.stdin.buffer.read())
    except Unreadable as error:
        return [parse_error_finding(source, error)], [], {}
    result = lint_text(text, source, settings)
    return sorted(result.findings, key=Finding.sort_key), list(result.internal_errors), {source.filename: text}


def report(findings: List[Finding], args: argparse.Namespace, out: TextIO, sources: Dict[str, str]) -> None:
    from dplint import reporters

    terminal = out.isatty()
    output_format = args.format or ("full" if terminal else "concise")
    lines = _source_lines(sources)
    if args.statistics:
        reporters.write_statistics(findings, out, as_json=output_format == "json")
    elif output_format == "json":
        reporters.write_json(findings, out)
    elif output_format == "json-lines":
        reporters.write_json_lines(findings, out)
    elif output_format == "github":
        reporters.write_github(findings, out)
    elif output_format == "sarif":
        reporters.write_sarif(findings, out, lines)
    elif output_format == "junit":
        reporters.write_junit(findings, out)
    elif output_format == "gitlab":
        reporters.write_gitlab(findings, out, lines)
    elif output_format == "concise":
        reporters.write_concise(findings, out, args.unsafe_fixes)
    else:
        colour = terminal and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        reporters.write_full(findings, out, lines, colour, args.unsafe_fixes)


def _by_file(findings: List[Finding], unsafe: bool) -> Dict[str, List[Finding]]:
    from dplint.reporters import is_fixable

    grouped: Dict[str, List[Finding]] = {}
    for finding in findings:
        if is_fixable(finding, unsafe):
            grouped.setdefault(finding.filename, []).append(finding)
    return grouped


def show_diff(findings: List[Finding], unsafe: bool, out: TextIO) -> int:
    """--diff: what --fix would change, as a unified diff; exit 1 when there is something to change."""
    import difflib

    from dplint.fixes import apply_fixes, read_for_fixing

    count = 0
    for filename, group in _by_file(findings, unsafe).items():
        text, _ = read_for_fixing(filename)
        fixed, applied = apply_fixes(text, group, unsafe=unsafe)
        count += len(applied)
        path = group[0].path
        out.writelines(difflib.unified_diff(text.splitlines(True), fixed.splitlines(True), f"a/{path}", f"b/{path}"))
    print(f"Would fix {count} error{'s' * (count != 1)}." if count else "No fixes available.", file=sys.stderr)
    return 1 if count else 0


def fix_files(findings: List[Finding], unsafe: bool) -> List[Finding]:
    """--fix: apply every file's fixes in one pass, only where the result still parses."""
    from dplint.engine import Unreadable, parse
    from dplint.fixes import apply_fixes, read_for_fixing, write_fixed

    fixed: List[Finding] = []
    for filename, group in _by_file(findings, unsafe).items():
        text, encoding = read_for_fixing(filename)
        new_text, applied = apply_fixes(text, group, unsafe=unsafe)
        try:
            parse(new_text)
        except Unreadable as error:
            print(f"dplint: not fixing {group[0].path}: the fixed code would not parse ({error}); please report this.", file=sys.stderr)
            continue
        write_fixed(filename, new_text, encoding)
        fixed.extend(applied)
    return fixed


def report_fixes(fixed: List[Finding], remaining: int, show: bool) -> None:
    if not fixed:
        return
    print(f"Fixed {len(fixed)} error{'s' * (len(fixed) != 1)} ({remaining} remaining).", file=sys.stderr)
    if not show:
        return
    from collections import Counter

    for path in sorted({f.path for f in fixed}):
        print(f"- {path}:", file=sys.stderr)
        for (code, name), count in sorted(Counter((f.code, f.name) for f in fixed if f.path == path).items()):
            print(f"    {count} × {code} ({name})", file=sys.stderr)


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
    from dplint.docs import explain as render
    from dplint.rules import BY_CODE

    rule = BY_CODE.get(code.strip().upper())
    if rule is None:
        raise ConfigError(f"--explain: unknown rule code `{code}`; see `dplint --list-rules`.")
    out.write(render(rule))
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
