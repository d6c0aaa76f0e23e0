"""Apply the edits that findings carry to the source they were found in."""

from __future__ import annotations

from typing import List, Sequence, Tuple

from dplint.finding import Finding, Location


def _offset(line_starts: List[int], location: Location) -> int:
    return line_starts[location.row - 1] + location.column - 1


def apply_fixes(source: str, findings: Sequence[Finding], *, unsafe: bool = False) -> str:
    """The source with every offered fix applied; a fix that overlaps an earlier one is skipped."""
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    fixes = [f.fix for f in findings if f.fix is not None and (unsafe or f.fix.applicability == "safe")]
    chosen: List[Tuple[int, int, str]] = []
    for fix in sorted(fixes, key=lambda fix: min(e.location for e in fix.edits)):
        spans = [(_offset(line_starts, e.location), _offset(line_starts, e.end_location), e.content) for e in fix.edits]
        if any(start < end_ and end > start_ for start, end, _ in spans for start_, end_, _ in chosen) or any(
            start == start_ for start, _, _ in spans for start_, _, _ in chosen
        ):
            continue
        chosen.extend(spans)
    for start, end, content in sorted(chosen, reverse=True):
        source = source[:start] + content + source[end:]
    return source
