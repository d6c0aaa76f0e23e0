"""`# noqa: DPL101` on a line, and `# dplint: noqa` / `# dplint: noqa: DPL101` for a whole file."""

from __future__ import annotations

import re
from typing import FrozenSet, List, Optional

from dplint.finding import Finding

_CODES = r"(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)"
LINE_NOQA = re.compile(r"#\s*noqa(?::\s?" + _CODES + r")?", re.I)
FILE_NOQA = re.compile(r"^[ \t]*#[ \t]*dplint:[ \t]*noqa(?::[ \t]?" + _CODES + r")?[ \t]*$", re.M | re.I)
ALL = frozenset({"*"})


def _codes(match: "re.Match[str]") -> FrozenSet[str]:
    codes = match.group("codes")
    return frozenset(re.split(r"[\s,]+", codes.upper())) if codes else ALL


class Suppressions:
    def __init__(self, text: str) -> None:
        self._text = text
        self._has_noqa = "noqa" in text  # searched once: a search per finding is quadratic
        self._lines: Optional[List[str]] = None
        self._file: FrozenSet[str] = frozenset()
        if "dplint" in text:
            for match in FILE_NOQA.finditer(text):
                self._file |= _codes(match)

    def file_ignores(self, code: str) -> bool:
        return "*" in self._file or code in self._file

    def line_ignores(self, finding: Finding) -> bool:
        """A `# noqa` on the reported line, or on the first line of the statement that holds it."""
        if not self._has_noqa:
            return False
        if self._lines is None:
            self._lines = self._text.splitlines()
        for row in {finding.location.row, finding.noqa_row or finding.location.row}:
            line = self._lines[row - 1] if 0 < row <= len(self._lines) else ""
            for match in LINE_NOQA.finditer(line):
                codes = _codes(match)
                if codes is ALL or finding.code in codes:
                    return True
        return False
