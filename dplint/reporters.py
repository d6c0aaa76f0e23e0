"""Output formats. Human formats may use colour on a terminal; machine formats are plain text always."""

from __future__ import annotations

import json
from collections import Counter
from typing import Callable, Dict, List, Optional, Sequence, TextIO

from dplint.finding import Finding, Location

SourceLines = Callable[[str], Optional[List[str]]]


def summary(findings: Sequence[Finding]) -> str:
    if not findings:
        return "All checks passed!"
    warnings = sum(1 for f in findings if f.severity == "warning")
    errors = len(findings) - warnings
    parts = [f"{errors} error{'s' * (errors != 1)}"] if errors else []
    if warnings:
        parts.append(f"{warnings} warning{'s' * (warnings != 1)}")
    files = len({f.filename for f in findings})
    return f"Found {' and '.join(parts)} in {files} file{'s' * (files != 1)}."


def concise_line(finding: Finding) -> str:
    return f"{finding.path}:{finding.location.row}:{finding.location.column}: {finding.code} {finding.message}"


def write_concise(findings: Sequence[Finding], out: TextIO) -> None:
    for finding in findings:
        out.write(concise_line(finding) + "\n")
    out.write(summary(findings) + "\n")


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
        "message": finding.message,
        "help": finding.help,
        "severity": finding.severity,
        "filename": finding.filename,
        "location": _location(finding.location),
        "end_location": _location(finding.end_location),
        "noqa_row": finding.noqa_row or finding.location.row,
        "fix": fix,
        "url": finding.url,
    }


def write_json(findings: Sequence[Finding], out: TextIO) -> None:
    json.dump([finding_to_json(f) for f in findings], out, indent=2)
    out.write("\n")


def statistics(findings: Sequence[Finding]) -> List[Dict[str, object]]:
    counts = Counter((f.code, f.name) for f in findings)
    return [{"code": code, "name": name, "count": count} for (code, name), count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def write_statistics(findings: Sequence[Finding], out: TextIO, as_json: bool) -> None:
    rows = statistics(findings)
    if as_json:
        json.dump(rows, out, indent=2)
        out.write("\n")
        return
    for row in rows:
        out.write(f"{row['count']:>5}\t{row['code']}\t{row['name']}\n")


def full_frame(finding: Finding, lines: Optional[List[str]]) -> List[str]:
    """A code frame in Ruff's layout: the line, its neighbours, a caret under the span, and help."""
    row = finding.location.row
    header = concise_line(finding)
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


def write_full(findings: Sequence[Finding], out: TextIO, source_lines: SourceLines, colour: bool) -> None:
    if colour:
        _write_full_coloured(findings, out, source_lines)
        return
    for finding in findings:
        out.write("\n".join(full_frame(finding, source_lines(finding.filename))) + "\n")
    out.write(summary(findings) + "\n")


def _write_full_coloured(findings: Sequence[Finding], out: TextIO, source_lines: SourceLines) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(file=out, highlight=False, soft_wrap=True)
    for finding in findings:
        lines = full_frame(finding, source_lines(finding.filename))
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
    console.print(f"[bold]{escape(summary(findings))}[/bold]")
