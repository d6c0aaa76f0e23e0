"""Output formats. Human formats may use colour on a terminal; machine formats are plain text always."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, TextIO, Tuple

from dplint.docs import reference_url
from dplint.finding import Finding, Fix, Location, display_path

FORMATS = ("full", "concise", "json", "json-lines", "github", "sarif", "junit", "gitlab")
HUMAN_FORMATS = ("full", "concise")


def use_colour(choice: str, out: TextIO) -> bool:
    """--color always/never decide; auto follows NO_COLOR (any value), then FORCE_COLOR, then the terminal."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return out.isatty() and os.environ.get("TERM") != "dumb"


SourceLines = Callable[[str], Optional[List[str]]]


def is_fixable(finding: Finding, unsafe: bool = False) -> bool:
    return finding.fix is not None and (unsafe or finding.fix.applicability == "safe")


def summary(findings: Sequence[Finding], unsafe: bool = False, not_parsing: Sequence[str] = ()) -> str:
    """The last line of the human formats. Files that do not parse, where no rule looks, are named there:
    such a run is never "All checks passed!"."""
    unchecked = _unchecked(not_parsing)
    if not findings:
        return f"No findings; {unchecked}" if unchecked else "All checks passed!"
    fixable = sum(1 for f in findings if is_fixable(f, unsafe))
    hint = f"\n[*] {fixable} fixable with the `--fix` option." if fixable else ""
    warnings = sum(1 for f in findings if f.severity == "warning")
    errors = len(findings) - warnings
    parts = [f"{errors} error{'s' * (errors != 1)}"] if errors else []
    if warnings:
        parts.append(f"{warnings} warning{'s' * (warnings != 1)}")
    files = len({f.filename for f in findings})
    found = f"Found {' and '.join(parts)} in {files} file{'s' * (files != 1)}"
    return (f"{found}; {unchecked}" if unchecked else f"{found}.") + hint


def _unchecked(not_parsing: Sequence[str]) -> str:
    if not not_parsing:
        return ""
    shown = ", ".join(not_parsing[:3]) + (f" and {len(not_parsing) - 3} more" if len(not_parsing) > 3 else "")
    if len(not_parsing) == 1:
        return f"1 file does not parse and was not checked: {shown}."
    return f"{len(not_parsing)} files do not parse and were not checked: {shown}."


def shown_here(filename: str) -> str:
    """A path as the human and JSON formats show the finding's own: relative to the current folder."""
    return display_path(Path(filename))


def concise_line(finding: Finding, unsafe: bool = False) -> str:
    marker = " [*]" if is_fixable(finding, unsafe) else ""
    return f"{finding.path}:{finding.location.row}:{finding.location.column}: {finding.code}{marker} {finding.message_for(shown_here)}"


def write_concise(
    findings: Sequence[Finding], out: TextIO, unsafe: bool = False, show_summary: bool = True, not_parsing: Sequence[str] = ()
) -> None:
    for finding in findings:
        out.write(concise_line(finding, unsafe) + "\n")
    if show_summary:
        out.write(summary(findings, unsafe, not_parsing) + "\n")


def _location(location: Location) -> Dict[str, int]:
    return {"row": location.row, "column": location.column}


def finding_to_json(finding: Finding) -> Dict[str, object]:
    fix = None
    if finding.fix is not None:
        fix = {
            "applicability": finding.fix.applicability,
            "message": finding.fix.message,
            "edits": [
                {"content": e.content, "location": _location(e.location), "end_location": _location(e.end_location)}
                for e in finding.fix.edits
            ],
        }
    return {
        "code": finding.code,
        "name": finding.name,
        "message": finding.message_for(shown_here),
        "help": finding.help,
        "severity": finding.severity,
        "filename": finding.filename,
        "location": _location(finding.location),
        "end_location": _location(finding.end_location),
        "noqa_row": finding.noqa_row or finding.location.row,
        "fix": fix,
        "url": reference_url(finding.code, finding.name),
        **({"ranks": list(finding.ranks)} if finding.ranks else {}),
    }


def write_json(findings: Sequence[Finding], out: TextIO) -> None:
    json.dump([finding_to_json(f) for f in findings], out, indent=2)
    out.write("\n")


def statistics(findings: Sequence[Finding], unsafe: bool = False) -> List[Dict[str, object]]:
    """Findings per rule, most first; `fixable`: how many of them `--fix` would fix."""
    counts = Counter((f.code, f.name) for f in findings)
    fixable = Counter((f.code, f.name) for f in findings if is_fixable(f, unsafe))
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [{"code": code, "name": name, "count": count, "fixable": fixable[code, name]} for (code, name), count in ordered]


def write_statistics(findings: Sequence[Finding], out: TextIO, as_json: bool, unsafe: bool = False) -> None:
    rows = statistics(findings, unsafe)
    if as_json:
        json.dump(rows, out, indent=2)
        out.write("\n")
        return
    # Ruff's layout: `[*]` before a rule with fixable findings, `[ ]` before the others when any has one.
    any_fixable = any(row["fixable"] for row in rows)
    for row in rows:
        marker = ("[*] " if row["fixable"] else "[ ] ") if any_fixable else ""
        out.write(f"{row['count']:>5}\t{row['code']}\t{marker}{row['name']}\n")


def full_frame(finding: Finding, lines: Optional[List[str]], unsafe: bool = False) -> List[str]:
    """A code frame in Ruff's layout: the line, its neighbours, a caret under the span, and help."""
    row = finding.location.row
    header = concise_line(finding, unsafe)
    if not lines or not 0 < row <= len(lines):
        return [header, f"  = help: {finding.help}", ""]
    first, last = max(1, row - 1), min(len(lines), row + 1)
    width = len(str(last))
    gutter = " " * width + " |"
    frame = [header, gutter]
    for number in range(first, last + 1):
        frame.append(f"{number:>{width}} | {lines[number - 1]}".rstrip())
        if number == row:
            start = finding.location.column - 1
            line_length = len(lines[row - 1].rstrip())
            end = finding.end_location.column - 1 if finding.end_location.row == row else line_length
            carets = "^" * max(1, end - start)
            frame.append(f"{gutter} {' ' * start}{carets} {finding.code}")
    frame += [gutter, f"{' ' * width} = help: {finding.help}", ""]
    return frame


def write_full(
    findings: Sequence[Finding],
    out: TextIO,
    source_lines: SourceLines,
    colour: bool,
    unsafe: bool = False,
    show_summary: bool = True,
    not_parsing: Sequence[str] = (),
) -> None:
    if colour:
        _write_full_coloured(findings, out, source_lines, unsafe, show_summary, not_parsing)
        return
    for finding in findings:
        out.write("\n".join(full_frame(finding, source_lines(finding.filename), unsafe)) + "\n")
    if show_summary:
        out.write(summary(findings, unsafe, not_parsing) + "\n")


def _write_full_coloured(
    findings: Sequence[Finding], out: TextIO, source_lines: SourceLines, unsafe: bool, show_summary: bool, not_parsing: Sequence[str]
) -> None:
    from rich.console import Console
    from rich.markup import escape

    # The caller decided on colour (--color, NO_COLOR, FORCE_COLOR): rich must not decide again.
    console = Console(file=out, highlight=False, soft_wrap=True, force_terminal=True, no_color=False, color_system="standard")
    for finding in findings:
        lines = full_frame(finding, source_lines(finding.filename), unsafe)
        prefix = f"{finding.path}:{finding.location.row}:{finding.location.column}:"
        colour = "yellow" if finding.severity == "warning" else "red"
        head = lines[0][len(prefix) :]
        console.print(f"[bold]{escape(prefix)}[/bold] [bold {colour}]{finding.code}[/]{escape(head[len(finding.code) + 1 :])}")
        for line in lines[1:]:
            if line.strip().startswith("= help:"):
                console.print(f"[cyan]{escape(line)}[/cyan]")
            elif line.endswith(f"^ {finding.code}"):
                console.print(f"[bold {colour}]{escape(line)}[/]")
            else:
                console.print(escape(line))
    if show_summary:
        console.print(f"[bold]{escape(summary(findings, unsafe, not_parsing))}[/bold]")


# ----- formats for CI systems ---------------------------------------------------------------------------


def workspace_root() -> str:
    """Where repository-relative paths start: $GITHUB_WORKSPACE, else the enclosing git checkout, else here."""
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if workspace:
        return os.path.abspath(workspace)
    here = os.path.abspath(os.getcwd())
    for directory in (here, *(str(p) for p in Path(here).parents)):
        if os.path.exists(os.path.join(directory, ".git")):
            return directory
    return here


def relative_uri(filename: str, root: str) -> str:
    relative = os.path.relpath(filename, root)
    return Path(relative).as_posix() if not relative.startswith("..") else Path(filename).as_posix()


def fingerprints(findings: Sequence[Finding], source_lines: SourceLines, root: str) -> Dict[int, str]:
    """A fingerprint per finding that survives unrelated edits: code, path, the text of its line, and
    how many identical (code, line text) pairs come before it in the file; not the line number."""
    seen: Counter = Counter()
    result: Dict[int, str] = {}
    for index, finding in enumerate(findings):
        lines = source_lines(finding.filename) or []
        row = finding.location.row
        text = " ".join(lines[row - 1].split()) if 0 < row <= len(lines) else ""
        key = (finding.code, relative_uri(finding.filename, root), text)
        seen[key] += 1
        digest = hashlib.blake2b(repr((*key, seen[key])).encode(), digest_size=16).hexdigest()
        result[index] = digest
    return result


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_command(level: str, properties: Sequence[Tuple[str, object]], message: str) -> str:
    """A GitHub workflow command (`::error file=…,line=…::message`), escaped as GitHub requires."""
    rendered = ",".join(f"{key}={_escape_property(str(value))}" for key, value in properties)
    return f"::{level} {rendered}::{_escape_data(message)}"


def github_annotation(finding: Finding, root: str) -> str:
    """The workflow command that annotates the finding's line in a GitHub check run."""
    path = relative_uri(finding.filename, root)
    properties = [
        ("title", f"dplint ({finding.code})"),
        ("file", path),
        ("line", finding.location.row),
        ("col", finding.location.column),
        ("endLine", finding.end_location.row),
        ("endColumn", finding.end_location.column),
    ]
    message = finding.message_for(lambda filename: relative_uri(filename, root))
    text = f"{path}:{finding.location.row}:{finding.location.column}: {finding.code} {message}"
    return github_command(finding.severity, properties, text)


def write_github(findings: Sequence[Finding], out: TextIO) -> None:
    root = workspace_root()
    for finding in findings:
        out.write(github_annotation(finding, root) + "\n")
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_file:
        with open(summary_file, "a", encoding="utf-8") as handle:
            handle.write(step_summary(findings, root))


def step_summary(findings: Sequence[Finding], root: str) -> str:
    """Markdown for $GITHUB_STEP_SUMMARY: every finding (GitHub shows only a few annotations a step)."""
    if not findings:
        return "## dplint\n\nAll checks passed!\n\n"
    lines = ["## dplint", "", summary(findings), ""]
    by_code: Dict[str, List[Finding]] = {}
    for finding in findings:
        by_code.setdefault(finding.code, []).append(finding)
    for code, group in sorted(by_code.items()):
        # A job summary is read in the browser, where a link to the runner's files leads nowhere.
        lines += [f"### {code} {group[0].name} ({len(group)})", "", "| location | message |", "|---|---|"]
        for finding in group:
            where = f"{relative_uri(finding.filename, root)}:{finding.location.row}:{finding.location.column}"
            message = finding.message_for(lambda filename: relative_uri(filename, root))
            lines.append(f"| `{where}` | {message.replace('|', '&#124;')} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def write_sarif(findings: Sequence[Finding], out: TextIO, source_lines: SourceLines) -> None:
    from dplint import __version__
    from dplint.rules import BY_CODE

    root = workspace_root()
    codes = sorted({f.code for f in findings})
    rules = []
    for code in codes:
        rule = BY_CODE[code]
        docs = rule.docs()
        descriptor = {
            "id": code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": _section(docs, "What it does") or rule.summary},
            "help": {"text": docs, "markdown": docs},
            "defaultConfiguration": {"level": "warning" if rule.severity == "warning" else "error"},
            "properties": {"tags": ["multi-gpu", "pytorch"]},
        }
        help_uri = reference_url(code, rule.name)
        if help_uri is not None:  # the help text above is the whole page; the link is a convenience
            descriptor["helpUri"] = help_uri
        rules.append(descriptor)
    prints = fingerprints(findings, source_lines, root)
    results = []
    for index, finding in enumerate(findings):
        results.append(
            {
                "ruleId": finding.code,
                "ruleIndex": codes.index(finding.code),
                "level": "warning" if finding.severity == "warning" else "error",
                "message": {"text": finding.message_for(lambda filename: relative_uri(filename, root))},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": artifact_location(finding.filename, root),
                            "region": {
                                "startLine": finding.location.row,
                                "startColumn": finding.location.column,
                                "endLine": finding.end_location.row,
                                "endColumn": max(finding.end_location.column, finding.location.column + 1)
                                if finding.end_location.row == finding.location.row
                                else finding.end_location.column,
                            },
                        }
                    }
                ],
                "partialFingerprints": {"dplint/v1": prints[index]},
                **({"fixes": [sarif_fix(finding.fix, finding.filename, root)]} if finding.fix is not None else {}),
            }
        )
    document = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "dplint",
                        "version": __version__,
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": Path(root).as_uri() + "/"}},
                "results": results,
                "columnKind": "unicodeCodePoints",
            }
        ],
    }
    json.dump(document, out, indent=2)
    out.write("\n")


def sarif_fix(fix: Fix, filename: str, root: str) -> Dict[str, object]:
    """A finding's fix as a SARIF `fix`: an insertion is a region whose start and end are the same
    point. Unsafe fixes are included, marked as such: a viewer offers them as `--unsafe-fixes` does."""
    replacements = [
        {
            "deletedRegion": {
                "startLine": edit.location.row,
                "startColumn": edit.location.column,
                "endLine": edit.end_location.row,
                "endColumn": edit.end_location.column,
            },
            "insertedContent": {"text": edit.content},
        }
        for edit in fix.edits
    ]
    return {
        "description": {"text": f"{fix.message} ({fix.applicability} fix)"},
        "artifactChanges": [{"artifactLocation": artifact_location(filename, root), "replacements": replacements}],
        "properties": {"applicability": fix.applicability},
    }


def artifact_location(filename: str, root: str) -> Dict[str, str]:
    """A percent-encoded URI (`my%20dir/a%2Cb.py`) relative to %SRCROOT%, or a file URI outside it."""
    from urllib.parse import quote

    relative = os.path.relpath(filename, root)
    if relative.startswith(".."):
        return {"uri": Path(filename).as_uri()}
    return {"uri": quote(Path(relative).as_posix(), safe="/"), "uriBaseId": "%SRCROOT%"}


def _section(docs: str, heading: str) -> str:
    """The first paragraph under a `## heading` of a rule's docs."""
    lines = docs.splitlines()
    try:
        start = lines.index(f"## {heading}") + 1
    except ValueError:
        return ""
    paragraph: List[str] = []
    for line in lines[start:]:
        if line.startswith("## ") or (not line.strip() and paragraph):
            break
        if line.strip():
            paragraph.append(line.strip())
    return " ".join(paragraph)


def write_gitlab(findings: Sequence[Finding], out: TextIO, source_lines: SourceLines) -> None:
    """GitLab Code Quality report."""
    root = workspace_root()
    prints = fingerprints(findings, source_lines, root)
    report = [
        {
            "description": f"{finding.code} {finding.message_for(lambda filename: relative_uri(filename, root))}",
            "check_name": finding.code,
            "fingerprint": prints[index],
            "severity": "minor" if finding.severity == "warning" else "major",
            "location": {"path": relative_uri(finding.filename, root), "lines": {"begin": finding.location.row}},
        }
        for index, finding in enumerate(findings)
    ]
    json.dump(report, out, indent=2)
    out.write("\n")


def write_junit(findings: Sequence[Finding], out: TextIO) -> None:
    """JUnit XML: one test case per finding, grouped per file; one passing case when clean."""
    from xml.etree import ElementTree

    suites = ElementTree.Element("testsuites", name="dplint", tests=str(max(1, len(findings))), failures=str(len(findings)), errors="0")
    if not findings:
        suite = ElementTree.SubElement(suites, "testsuite", name="dplint", tests="1", failures="0", errors="0")
        ElementTree.SubElement(suite, "testcase", name="No errors found", classname="dplint")
    by_file: Dict[str, List[Finding]] = {}
    for finding in findings:
        by_file.setdefault(finding.path, []).append(finding)
    for path, group in by_file.items():
        suite = ElementTree.SubElement(
            suites, "testsuite", name=path, tests=str(len(group)), failures=str(len(group)), errors="0", package="org.dplint"
        )
        for finding in group:
            case = ElementTree.SubElement(
                suite,
                "testcase",
                name=f"org.dplint.{finding.code}",
                classname=path,
                line=str(finding.location.row),
                column=str(finding.location.column),
            )
            message = finding.message_for(shown_here)
            failure = ElementTree.SubElement(case, "failure", message=message)
            failure.text = f"line {finding.location.row}, col {finding.location.column}, {message}"
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(ElementTree.tostring(suites, encoding="unicode"))
    out.write("\n")


def write_json_lines(findings: Sequence[Finding], out: TextIO) -> None:
    for finding in findings:
        out.write(json.dumps(finding_to_json(finding)) + "\n")


def reading(sources: Optional[Dict[str, str]] = None) -> SourceLines:
    """The lines of a file as the report shows them: from `sources` (what was linted), else from disk."""
    cache: Dict[str, Optional[List[str]]] = {}

    def lines(filename: str) -> Optional[List[str]]:
        if filename not in cache:
            if sources and filename in sources:
                cache[filename] = sources[filename].splitlines()
            else:
                try:
                    cache[filename] = Path(filename).read_text(encoding="utf-8", errors="replace").splitlines()
                except OSError:
                    cache[filename] = None
        return cache[filename]

    return lines


def write_report(
    chosen: str,
    findings: Sequence[Finding],
    out: TextIO,
    source_lines: SourceLines,
    colour: bool,
    unsafe: bool = False,
    show_summary: bool = True,
    not_parsing: Sequence[str] = (),
) -> None:
    """The findings in the format `chosen` (one of the CLI's `--format` choices but statistics)."""
    if chosen == "json":
        write_json(findings, out)
    elif chosen == "json-lines":
        write_json_lines(findings, out)
    elif chosen == "github":
        write_github(findings, out)
    elif chosen == "sarif":
        write_sarif(findings, out, source_lines)
    elif chosen == "junit":
        write_junit(findings, out)
    elif chosen == "gitlab":
        write_gitlab(findings, out, source_lines)
    elif chosen == "concise":
        write_concise(findings, out, unsafe, show_summary, not_parsing)
    else:
        write_full(findings, out, source_lines, colour, unsafe, show_summary, not_parsing)
