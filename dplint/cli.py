"""`dplint [PATHS...]`: exit 0 when clean, 1 with findings, 2 on usage, configuration or internal errors."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, TextIO, Tuple

from dplint import __version__
from dplint.config import (
    ConfigError,
    Settings,
    parse_per_file_ignores,
    resolve_settings,
)
from dplint.finding import Finding
from dplint.reporters import FORMATS, HUMAN_FORMATS, is_fixable, reading, use_colour, write_report, write_statistics

if TYPE_CHECKING:
    from dplint.engine import InternalError

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dplint",
        description="Find PyTorch multi-GPU pitfalls (DataParallel, devices, CUDA_VISIBLE_DEVICES) in Python source.",
        epilog="Exit status: 0 no findings, 1 findings, 2 usage, configuration or internal error. "
        "`dplint server` starts the language server on stdio (install with `pip install '.[server]'` in a clone of dplint).",
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="files or folders to lint (default: .); `-` (or --stdin-filename) reads standard input"
    )
    parser.add_argument("--format", choices=FORMATS, help="output format (default: full on a terminal, concise otherwise)")
    parser.add_argument("-o", "--output-file", metavar="PATH", help="write the report to PATH instead of standard output")
    parser.add_argument(
        "--fix", action="store_true", help="apply the fixes rules offer (safe ones only, unless --unsafe-fixes); on stdin, print the fixed source"
    )
    parser.add_argument("--unsafe-fixes", action="store_true", help="also offer and apply fixes marked unsafe")
    parser.add_argument("--diff", action="store_true", help="print the fixes as a unified diff and change nothing")
    parser.add_argument("--show-fixes", action="store_true", help="with --fix: list what was fixed")
    parser.add_argument(
        "--select", metavar="CODES", help="comma-separated codes, prefixes or rule names to enable (ALL for every rule)"
    )
    parser.add_argument("--ignore", metavar="CODES", help="comma-separated codes, prefixes or rule names to disable")
    parser.add_argument("--extend-select", metavar="CODES", help="codes, prefixes or rule names to enable on top of the selection")
    parser.add_argument(
        "--preview", action="store_true", help="also run the preview rules (not yet precise enough to be on by default)"
    )
    parser.add_argument(
        "--per-file-ignores",
        metavar="PATTERN:CODES",
        action="append",
        help="ignore codes in files matching a glob, relative to the current folder or to the pyproject.toml's folder "
        "(repeatable; replaces [tool.dplint.per-file-ignores], whose patterns are relative to the pyproject.toml's folder)",
    )
    parser.add_argument("--exclude", metavar="PATTERNS", help="comma-separated patterns to skip, replacing the defaults")
    parser.add_argument("--extend-exclude", metavar="PATTERNS", help="comma-separated patterns to skip besides the defaults")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    parser.add_argument(
        "--exit-zero-on-warnings", action="store_true", help="exit 0 when every finding is a warning (errors still exit 1)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print the findings only: no summary, no progress")
    parser.add_argument("-s", "--silent", action="store_true", help="print nothing (errors in dplint's use excepted); the exit status tells")
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the full format (default: auto, on a terminal unless NO_COLOR is set, or when FORCE_COLOR is)",
    )
    parser.add_argument("--statistics", action="store_true", help="print the number of findings per rule instead of the findings")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write .dplint_cache/")
    parser.add_argument(
        "--project-root", metavar="DIR", help="where cross-file facts come from (default: the nearest folder with pyproject.toml, setup.cfg, setup.py or .git)"
    )
    parser.add_argument("-j", "--jobs", type=int, metavar="N", help="worker processes (default: all cores)")
    parser.add_argument("--stdin-filename", metavar="NAME", help="read the code from standard input and report it as the file NAME")
    parser.add_argument("--explain", metavar="RULE", help="print a rule's documentation (by code or name) and exit")
    parser.add_argument(
        "--list-rules",
        action="store_true",
        help="list every rule (code, name, default, tier, fix: safe/unsafe/none, static/runtime) and exit; with --format json as JSON",
    )
    parser.add_argument(
        "--show-settings", action="store_true", help="print the resolved settings and the file they came from, and exit"
    )
    parser.add_argument("--show-files", action="store_true", help="print the files a run would check, one a line, and exit")
    parser.add_argument("--version", action="version", version=f"dplint {__version__}")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["server"]:
        return serve(argv[1:])
    if argv[:1] == ["run"]:  # `dplint run --nproc-per-node N script.py`: the distributed runtime
        from dplint.run_cli import main as run_main

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


def entry_point() -> None:
    """The `dplint` command. A lint ends without tearing down its objects, as mypy does: freeing a big
    project's cached facts one by one is a tenth of a run answered from the cache. `dplint run` and
    `dplint server` exit normally: their child processes are cleaned up at exit."""
    status = main()
    if sys.argv[1:2] in (["run"], ["server"]):
        sys.exit(status)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be written
            pass
    os._exit(status)


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
        print(
            f"dplint: error: `dplint server` needs the server extra: pip install '.[server]' in a clone of dplint "
            f"(pip install 'dplint[server]' once it is published) ({error})",
            file=sys.stderr,
        )
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

    reading_stdin = args.paths == ["-"] or (args.stdin_filename is not None and not args.paths)
    if args.stdin_filename is not None and not reading_stdin:
        raise ConfigError("--stdin-filename reads standard input: give it no paths (or only `-`).")
    paths = [Path(p) for p in (args.paths or ["."])]
    start = Path(args.stdin_filename) if reading_stdin and args.stdin_filename else (Path.cwd() if reading_stdin else paths[0])
    settings = resolve_settings(start, overrides(args))
    if args.show_settings:
        return show_settings(settings, out)
    if args.show_files and reading_stdin:  # the one file checked is standard input, by the name it is given
        out.write((args.stdin_filename or "-") + "\n")
        return 0
    if args.show_files:
        return show_files(paths, settings, out)
    if not (args.quiet or args.silent):
        for warning in settings.warnings:
            print(f"dplint: warning: {warning}", file=sys.stderr)

    nothing_checked = False
    not_parsing: Sequence[str] = ()
    if reading_stdin:
        findings, errors, sources = lint_stdin(args.stdin_filename or "<stdin>", settings)
        if args.diff and sources and not errors:
            return diff_stdin(findings, sources, args, out)
        if args.fix:
            findings, errors, sources = fix_stdin(findings, errors, sources, settings, args, out)
            out = sys.stderr  # stdout holds the source: what remains is reported beside it, never in it
    else:
        from dplint.api import lint_paths

        progress = ProgressBar(sys.stderr) if shows_progress(args, out) else None
        try:
            result = lint_paths(paths, settings, jobs=args.jobs, cache=not args.no_cache, progress=progress)
        finally:
            if progress is not None:
                progress.close()
        findings, errors, sources = result.findings, result.internal_errors, {}
        not_parsing = result.not_parsing
        nothing_checked = result.files == 0 and not findings
        if nothing_checked and not args.silent and not args.quiet:
            print("No Python files found under the given path(s)", file=sys.stderr)
        if not (args.quiet or args.silent):
            if result.unparsed:
                plural = "s" if result.unparsed != 1 else ""
                print(f"dplint: {result.unparsed} file{plural} of torch's own sources not parsed: no rule looks at them, so their syntax is unchecked.", file=sys.stderr)
            for pattern in unmatched_per_file_ignores(settings, result.checked):
                print(f"dplint: warning: per-file-ignores pattern `{pattern}` matches no file checked.", file=sys.stderr)
        if args.diff and not errors:
            return show_diff(findings, args, out)
        if args.fix and not errors:
            fixed = fix_files(findings, args.unsafe_fixes)
            if fixed:
                result = lint_paths(paths, settings, jobs=args.jobs, cache=not args.no_cache)
                findings, errors = result.findings, result.internal_errors
            if not (args.quiet or args.silent):
                report_fixes(fixed, len(findings), args.show_fixes)

    if args.output_file:
        try:
            with open(args.output_file, "w", encoding="utf-8") as handle:
                report(findings, args, handle, sources, show_summary=not nothing_checked, not_parsing=not_parsing)
        except OSError as error:
            raise ConfigError(f"cannot write {args.output_file}: {error.strerror or error}") from None
    elif not args.silent:
        # "All checks passed!" would claim a check that never ran: stderr already says no file was found.
        report(findings, args, out, sources, show_summary=not nothing_checked, not_parsing=not_parsing)
    for error in errors:
        print(f"dplint: internal error in rule {error.code} while linting {error.path}:\n{error.details}", file=sys.stderr)
    if errors:
        print(
            f"dplint: {len(errors)} internal error(s): this is a bug in dplint, not in your code; please report it.",
            file=sys.stderr,
        )
        return 2
    return exit_status(findings, args)


def exit_status(findings: Sequence[Finding], args: argparse.Namespace) -> int:
    if args.exit_zero_on_warnings:
        findings = [f for f in findings if f.severity != "warning"]
    return 0 if args.exit_zero or not findings else 1


# Formats a person reads; the others are parsed by tools, and nothing else may appear beside them.
# A short run shows no progress bar: it would only flicker.
PROGRESS_DELAY_S = 0.5


def output_format(args: argparse.Namespace, out: TextIO) -> str:
    return args.format or ("full" if out.isatty() else "concise")


def shows_progress(args: argparse.Namespace, out: TextIO) -> bool:
    return sys.stderr.isatty() and not (args.quiet or args.silent) and output_format(args, out) in HUMAN_FORMATS


class ProgressBar:
    """The pass under way ("Reading project", then "Checking"), its files done of total and the time
    elapsed, on a terminal's stderr, once the run has lasted PROGRESS_DELAY_S; erased when the run ends."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._started = time.monotonic()
        self._bar = None
        self._task = None
        self._phase = ""

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self._bar is None:
            if time.monotonic() - self._started < PROGRESS_DELAY_S:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("files"), TimeElapsedColumn())
            self._bar = Progress(*columns, console=Console(file=self._stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(phase, total=total)
        # A new pass is drawn at once: between the bar's periodic redraws a fast pass would never show.
        self._bar.update(self._task, description=phase, completed=done, total=total, refresh=phase != self._phase)
        self._phase = phase

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


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
        "preview": True if args.preview else None,
    }


def unmatched_per_file_ignores(settings: Settings, checked: Sequence[Path]) -> List[str]:
    """The per-file-ignores patterns that match no file checked nor, under a pyproject.toml, any file of
    its folder: a run over one staged file must not warn about the patterns for the others."""
    unmatched = settings.unmatched_per_file_ignores(checked)
    if unmatched and settings.config_file is not None:
        from dplint.discovery import discover

        everything = discover([settings.root], settings)[0]
        unmatched = [p for p in settings.unmatched_per_file_ignores(everything) if p in unmatched]
    return unmatched


def show_settings(settings: Settings, out: TextIO) -> int:
    """--show-settings: what a run would use, and where it came from, in `[tool.dplint]`'s terms."""
    source = str(settings.config_file) if settings.config_file else "none found (dplint's defaults)"
    lines = [
        f"configuration file: {source}",
        f"enabled ({len(settings.enabled)}): {', '.join(sorted(settings.enabled)) or '(none)'}",
        f"preview: {'true' if settings.preview else 'false'}",
        "per-file-ignores:" + ("" if settings.per_file_ignores else " (none)"),
    ]
    for entry in settings.per_file_ignores:
        bases = " or ".join(str(base) for base in entry.bases)
        lines.append(f"  {entry.pattern}: {', '.join(sorted(entry.codes))} (relative to {bases})")
    project_root = str(settings.project_root) if settings.project_root else "none (the named paths are the project)"
    lines += [f"exclude: {', '.join(settings.exclude)}", f"project root: {project_root}"]
    out.write("\n".join(lines) + "\n")
    return 0


def show_files(paths: Sequence[Path], settings: Settings, out: TextIO) -> int:
    """--show-files: the files a run would check, as it shows them; unreadable paths said on stderr."""
    from dplint.discovery import discover
    from dplint.engine import source_files

    files, problems = discover(paths, settings)
    for source in source_files(files):
        out.write(source.path + "\n")
    for shown, (_, reason) in zip(source_files([path for path, _ in problems]), problems):
        print(f"dplint: warning: {shown.path}: {reason}", file=sys.stderr)
    return 0


def lint_stdin(name: str, settings: Settings, text: Optional[str] = None):
    """Lint standard input (or `text`, the fixed version of it) as the file `name`."""
    from dplint.api import lint_text
    from dplint.engine import SourceFile, Unreadable, decode, parse_error_finding
    from dplint.analysis.facts import module_identity

    path = Path(name)
    source = SourceFile(str(path.absolute()), name, *module_identity(path.absolute()))
    try:
        if text is None:
            text = decode(sys.stdin.buffer.read())
    except Unreadable as error:
        return [parse_error_finding(source, error)], [], {}
    result = lint_text(text, source, settings)
    return sorted(result.findings, key=Finding.sort_key), list(result.internal_errors), {source.filename: text}


def fixed_stdin(findings: List[Finding], sources: Dict[str, str], unsafe: bool) -> Tuple[str, str, List[Finding]]:
    """Standard input's text, that text with its fixes applied (only if the result parses), and the
    findings whose fix was applied."""
    from dplint.engine import Unreadable, parse
    from dplint.fixes import apply_fixes

    [(filename, text)] = sources.items()
    fixed, applied = apply_fixes(text, [f for f in findings if f.filename == filename], unsafe=unsafe)
    try:
        parse(fixed)
    except Unreadable as error:
        print(f"dplint: not fixing standard input: the fixed code would not parse ({error}); please report this.", file=sys.stderr)
        return text, text, []
    return text, fixed, applied


def diff_stdin(findings: List[Finding], sources: Dict[str, str], args: argparse.Namespace, out: TextIO) -> int:
    """--diff on stdin: the diff on stdout, exit 1 when there is something to change; no file is written."""
    import difflib

    text, fixed, applied = fixed_stdin(findings, sources, args.unsafe_fixes)
    name = args.stdin_filename or "<stdin>"
    out.writelines(difflib.unified_diff(text.splitlines(True), fixed.splitlines(True), f"a/{name}", f"b/{name}"))
    if not (args.quiet or args.silent):
        print(would_fix(len(applied)), file=sys.stderr)
    return 1 if applied else 0


def fix_stdin(findings: List[Finding], errors: List[InternalError], sources: Dict[str, str], settings: Settings, args: argparse.Namespace, out: TextIO):
    """--fix on stdin: the whole source, fixed, on stdout (editors replace the buffer with it; unchanged
    when it cannot be fixed); no file is written. Returns what remains to report, beside it."""
    if not sources:  # undecodable input: there is no source to print
        return findings, errors, sources
    if errors:  # a rule failed on it: change nothing
        fixed, applied = next(iter(sources.values())), []
    else:
        _, fixed, applied = fixed_stdin(findings, sources, args.unsafe_fixes)
    out.write(fixed)
    out.flush()
    if not applied:
        return findings, errors, sources
    return lint_stdin(args.stdin_filename or "<stdin>", settings, fixed)


def report(
    findings: List[Finding], args: argparse.Namespace, out: TextIO, sources: Dict[str, str], show_summary: bool = True, not_parsing: Sequence[str] = ()
) -> None:

    chosen = output_format(args, out)
    if args.statistics:
        write_statistics(findings, out, as_json=chosen == "json", unsafe=args.unsafe_fixes)
        return
    write_report(
        chosen, findings, out, reading(sources), use_colour(args.color, out), args.unsafe_fixes, show_summary and not args.quiet, not_parsing
    )


def _by_file(findings: List[Finding], unsafe: bool) -> Dict[str, List[Finding]]:

    grouped: Dict[str, List[Finding]] = {}
    for finding in findings:
        if is_fixable(finding, unsafe):
            grouped.setdefault(finding.filename, []).append(finding)
    return grouped


def show_diff(findings: List[Finding], args: argparse.Namespace, out: TextIO) -> int:
    """--diff: what --fix would change, as a unified diff; exit 1 when there is something to change."""
    import difflib

    from dplint.fixes import apply_fixes, read_for_fixing

    count = 0
    for filename, group in _by_file(findings, args.unsafe_fixes).items():
        text, _ = read_for_fixing(filename)
        fixed, applied = apply_fixes(text, group, unsafe=args.unsafe_fixes)
        count += len(applied)
        path = group[0].path
        out.writelines(difflib.unified_diff(text.splitlines(True), fixed.splitlines(True), f"a/{path}", f"b/{path}"))
    if not (args.quiet or args.silent):
        print(would_fix(count), file=sys.stderr)
    return 1 if count else 0


def would_fix(count: int) -> str:
    # Findings, not errors: a fix may address a warning (DPL001), and the summary counts both.
    return f"Would fix {count} finding{'s' * (count != 1)}." if count else "No fixes available."


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
    print(f"Fixed {len(fixed)} finding{'s' * (len(fixed) != 1)} ({remaining} remaining).", file=sys.stderr)
    if not show:
        return
    from collections import Counter

    for path in sorted({f.path for f in fixed}):
        print(f"- {path}:", file=sys.stderr)
        for (code, name), count in sorted(Counter((f.code, f.name) for f in fixed if f.path == path).items()):
            print(f"    {count} × {code} ({name})", file=sys.stderr)


def explain(code_or_name: str, out: TextIO) -> int:
    from dplint.docs import explain as render
    from dplint.rules import ALL_RULES, BY_CODE

    wanted = code_or_name.strip()
    rule = BY_CODE.get(wanted.upper()) or next((r for r in ALL_RULES if r.name == wanted.lower()), None)
    if rule is None:
        raise ConfigError(f"--explain: no rule has the code or name `{code_or_name}`; see `dplint --list-rules`.")
    out.write(render(rule))
    return 0


def list_rules(out: TextIO, as_json: bool) -> int:
    from dplint.rules import ALL_RULES

    rows = [
        {
            "code": rule.code,
            "name": rule.name,
            "severity": rule.severity,
            "enabled_by_default": rule.enabled_by_default,
            "preview": rule.preview,
            "fix": list(rule.fix_applicability),
            "checked": "runtime" if rule.runtime_only else "static",
            "summary": rule.summary,
        }
        for rule in ALL_RULES
    ]
    if as_json:
        json.dump(rows, out, indent=2)
        out.write("\n")
        return 0
    table = [("CODE", "NAME", "DEFAULT", "TIER", "FIX", "CHECKED", "SEVERITY", "SUMMARY")]
    for row in rows:
        default = "on" if row["enabled_by_default"] else "off"
        tier = "preview" if row["preview"] else "stable"
        # `safe/unsafe`: a rule whose fix is one or the other, case by case (its `--explain` says which).
        fix = "/".join(row["fix"]) or "none"  # type: ignore[arg-type]
        table.append((row["code"], row["name"], default, tier, fix, row["checked"], row["severity"], row["summary"]))  # type: ignore[arg-type]
    widths = [max(len(cells[column]) for cells in table) for column in range(len(table[0]) - 1)]
    for cells in table:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + "  " + cells[-1] + "\n")
    return 0
