"""`# noqa: DPL101` on a line, and `# dplint: noqa` / `# dplint: noqa: DPL101` for a whole file.

The suppression pass also records which line directives suppressed something, so that the noqa
hygiene rules (DPL001, DPL002) can report directives that are unused or name unknown codes.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from typing import FrozenSet, Iterable, List, Optional, Set, Tuple

from dplint.finding import Finding

_CODES = r"(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)"
LINE_NOQA = re.compile(r"#\s*noqa(?::\s?" + _CODES + r")?", re.I)
FILE_NOQA = re.compile(r"^[ \t]*#[ \t]*dplint:[ \t]*noqa(?::[ \t]?" + _CODES + r")?[ \t]*$", re.M | re.I)
_ONE_CODE = re.compile(r"[A-Z]+[0-9]+", re.I)
DPL_CODE = re.compile(r"DPL[0-9]+", re.I)
ALL = frozenset({"*"})


def _codes(match: "re.Match[str]") -> FrozenSet[str]:
    codes = match.group("codes")
    return frozenset(re.split(r"[\s,]+", codes.upper())) if codes else ALL


@dataclass(frozen=True)
class NoqaCode:
    """One code named by a directive, as written, and where: 1-based columns, end exclusive."""

    text: str
    column: int
    end_column: int

    @property
    def code(self) -> str:
        return self.text.upper()


@dataclass(frozen=True)
class NoqaDirective:
    """A `# noqa[: CODES]` (or, with `file_level`, `# dplint: noqa[: CODES]`) inside a real comment."""

    row: int
    column: int  # where the directive's `#` is
    end_column: int  # just after its last code (or after `noqa`)
    codes: Tuple[NoqaCode, ...]  # empty for a bare `# noqa`
    line: str  # the whole physical line, for fixes
    comment_column: int  # where the comment holding the directive starts
    file_level: bool = False


def noqa_directives(text: str) -> List[NoqaDirective]:
    """Every noqa directive in the comments of `text` (text inside strings is not a directive)."""
    directives: List[NoqaDirective] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT and "noqa" in token.string.lower():
                directives.extend(_directives_in(token))
    except (tokenize.TokenError, SyntaxError):  # only parsed files get here; be safe anyway
        pass
    return directives


def _directives_in(token: tokenize.TokenInfo) -> Iterable[NoqaDirective]:
    row, start = token.start
    file_match = FILE_NOQA.match(token.string)
    matches = [file_match] if file_match else list(LINE_NOQA.finditer(token.string))
    for match in matches:
        codes: Tuple[NoqaCode, ...] = ()
        if match.group("codes"):
            offset = start + match.start("codes") + 1
            codes = tuple(NoqaCode(m.group(), offset + m.start(), offset + m.end()) for m in _ONE_CODE.finditer(match.group("codes")))
        end = match.end("codes") if match.group("codes") else match.end()
        column = start + (token.string.index("#") if file_match else match.start()) + 1
        yield NoqaDirective(row, column, start + end + 1, codes, token.line.rstrip("\r\n"), start + 1, file_match is not None)


class Suppressions:
    def __init__(self, text: str) -> None:
        self._text = text
        self._has_noqa = "noqa" in text  # searched once: a search per finding is quadratic
        self._lines: Optional[List[str]] = None
        self._file: FrozenSet[str] = frozenset()
        # (row, code) of each line directive that suppressed a finding; "*" for a bare `# noqa`.
        self.used: Set[Tuple[int, str]] = set()
        # Codes whose rule failed on this file: whether their directives are used is unknown.
        self.undecided: Set[str] = set()
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
            self._lines = self._text.split("\n")  # rows as tokenize counts them: a form feed is no line break
        for row in {finding.location.row, finding.noqa_row or finding.location.row}:
            line = self._lines[row - 1] if 0 < row <= len(self._lines) else ""
            for match in LINE_NOQA.finditer(line):
                codes = _codes(match)
                if codes is ALL or finding.code in codes:
                    self.used.add((row, "*" if codes is ALL else finding.code))
                    return True
        return False

    def named_codes(self) -> FrozenSet[str]:
        """The codes that line directives name (a cheap superset: strings count too)."""
        if not self._has_noqa:
            return frozenset()
        named: Set[str] = set()
        for match in LINE_NOQA.finditer(self._text):
            named |= _codes(match) - ALL
        return frozenset(named)
