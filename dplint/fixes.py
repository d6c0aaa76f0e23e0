"""Apply the edits that findings carry to the source they were found in."""

from __future__ import annotations

from typing import List, Sequence, Tuple

from dplint.finding import Finding, Location


def _offset(line_starts: List[int], location: Location) -> int:
    return line_starts[location.row - 1] + location.column - 1


def apply_fixes(source: str, findings: Sequence[Finding], *, unsafe: bool = False) -> Tuple[str, List[Finding]]:
    """The source with every offered fix applied in one pass, and the findings whose fix was applied.

    A fix whose edits overlap one already chosen is skipped (a second run picks it up); an edit equal to
    one already chosen is shared (two saves fixed in one file both add `import torch.distributed as dist`)."""
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    fixable = [f for f in findings if f.fix is not None and (unsafe or f.fix.applicability == "safe")]
    chosen: List[Tuple[int, int, str]] = []
    applied: List[Finding] = []
    for finding in sorted(fixable, key=lambda f: min(e.location for e in f.fix.edits)):  # type: ignore[union-attr]
        edits = finding.fix.edits  # type: ignore[union-attr]
        spans = [(_offset(line_starts, e.location), _offset(line_starts, e.end_location), e.content) for e in edits]
        spans = [span for span in spans if span not in chosen]
        if any(start < end_ and end > start_ or start == start_ for start, end, _ in spans for start_, end_, _ in chosen):
            continue
        chosen.extend(spans)
        applied.append(finding)
    for start, end, content in sorted(chosen, reverse=True):
        source = source[:start] + content + source[end:]
    return source, applied


def read_for_fixing(filename: str) -> Tuple[str, str]:
    """The file's text, decoded as Python would, and the encoding to write it back with."""
    from dplint.engine import decode_with_encoding, read_bytes

    return decode_with_encoding(read_bytes(filename))


def write_fixed(filename: str, text: str, encoding: str) -> None:
    with open(filename, "w", encoding=encoding, newline="") as handle:
        handle.write(text)
