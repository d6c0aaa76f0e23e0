"""Findings in LSP terms: ranges in the client's position encoding, diagnostics, text edits.

dplint's locations are 1-based rows and 1-based columns counted in code points; LSP positions are
0-based lines and, unless the client negotiated otherwise, 0-based UTF-16 code units.
"""

from __future__ import annotations

import functools
import io
import tokenize
from typing import Iterable, List, Optional, Set

from lsprotocol import types
from pygls.workspace.position_codec import PositionCodec, ServerTextPosition

from dplint.docs import reference_url
from dplint.finding import Finding, Location
from dplint.noqa import LINE_NOQA

SOURCE = "dplint"


def split_lines(text: str) -> List[str]:
    """The lines as LSP and libcst count them (`\\n`, `\\r\\n`, `\\r`), each with its terminator."""
    return io.StringIO(text, newline="").readlines()


class Converter:
    """Positions of one text, in the client's encoding."""

    def __init__(self, text: str, codec: PositionCodec) -> None:
        self.lines = split_lines(text)
        self.codec = codec

    def position(self, location: Location) -> types.Position:
        return self.codec.position_to_client_units(self.lines, ServerTextPosition(location.row - 1, location.column - 1))

    def range(self, start: Location, end: Location) -> types.Range:
        return types.Range(self.position(start), self.position(end))

    def diagnostic(self, finding: Finding) -> types.Diagnostic:
        severity = types.DiagnosticSeverity.Warning if finding.severity == "warning" else types.DiagnosticSeverity.Error
        fix = None
        if finding.fix is not None:
            fix = {
                "message": finding.fix.message,
                "applicability": finding.fix.applicability,
                "edits": [_edit_json(edit) for edit in self.fix_edits([finding])],
            }
        href = reference_url(finding.code, finding.name)
        return types.Diagnostic(
            range=self.range(finding.location, finding.end_location),
            message=finding.message,
            severity=severity,
            code=finding.code,
            code_description=types.CodeDescription(href=href) if href is not None else None,
            source=SOURCE,
            data={"fix": fix, "noqaRow": finding.noqa_row or finding.location.row},
        )

    def fix_edits(self, findings: Iterable[Finding]) -> List[types.TextEdit]:
        return [
            types.TextEdit(self.range(edit.location, edit.end_location), edit.content)
            for finding in findings
            if finding.fix is not None
            for edit in finding.fix.edits
        ]

    def noqa_edit(self, finding: Finding) -> Optional[types.TextEdit]:
        """Adds `# noqa: CODE` to the finding's line or its statement's first line, or extends the `# noqa: ...` there.

        Only where a comment can end the line: never inside a multi-line string or after a backslash."""
        rows = self._rows_taking_comments()
        for row in dict.fromkeys((finding.location.row, finding.noqa_row or finding.location.row)):
            if row not in rows:
                continue
            body = self.lines[row - 1].rstrip("\r\n")
            match = next((m for m in LINE_NOQA.finditer(body) if m.group("codes")), None)
            if match is not None:
                column, content = match.end("codes"), f", {finding.code}"
            else:
                column, content = len(body), f"  # noqa: {finding.code}"
            where = Location(row, column + 1)
            return types.TextEdit(self.range(where, where), content)
        return None

    def _rows_taking_comments(self) -> Set[int]:
        """Rows whose end is outside any string: where tokenize sees a NEWLINE or NL."""
        readline = functools.partial(next, iter(self.lines), "")
        rows: Set[int] = set()
        try:
            for token in tokenize.generate_tokens(readline):
                if token.type in (tokenize.NEWLINE, tokenize.NL):
                    rows.add(token.start[0])
        except (tokenize.TokenError, SyntaxError):
            return set()
        return rows


def _edit_json(edit: types.TextEdit) -> dict:
    start, end = edit.range.start, edit.range.end
    return {
        "range": {
            "start": {"line": start.line, "character": start.character},
            "end": {"line": end.line, "character": end.character},
        },
        "newText": edit.new_text,
    }


def overlaps(a: types.Range, b: types.Range) -> bool:
    """Whether two ranges share a position (touching counts: a cursor at a finding's end is on it)."""
    return (a.start.line, a.start.character) <= (b.end.line, b.end.character) and (b.start.line, b.start.character) <= (
        a.end.line,
        a.end.character,
    )


def contains(outer: types.Range, position: types.Position) -> bool:
    point = (position.line, position.character)
    return (outer.start.line, outer.start.character) <= point <= (outer.end.line, outer.end.character)

