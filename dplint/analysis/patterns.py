"""Regexes searched over every file of a project, where Python's `re` alone would be slow."""

from __future__ import annotations

import re
from typing import Iterator, Optional, Sequence, Tuple


class GuardedPattern:
    """A regex searched only in a text holding one of `words`, strings that every match contains (as
    real code spells them, for a case-insensitive regex).

    Python's `re` tries a pattern that opens with `\\b`, a class, a lookbehind, an alternation or
    IGNORECASE at every position of the text: about 2 s over torch's 49 MB of sources for one trigger.
    `in` finds a word at memory speed, and most files hold none.

    With `one_line`, every match lies within one line (the pattern cannot match a newline), and only
    the lines holding a word are searched: a word common in the files that do hold it (`rank`,
    `noqa`) then costs what its lines cost, not what the file does.
    """

    def __init__(self, pattern: str, words: Sequence[str], flags: int = 0, *, one_line: bool = False) -> None:
        self.regex = re.compile(pattern, flags)
        self.words = tuple(words)
        self.one_line = one_line

    def _holds_a_word(self, text: str) -> bool:
        return any(word in text for word in self.words)

    def search(self, text: str) -> Optional["re.Match[str]"]:
        return next(self.finditer(text), None)

    def finditer(self, text: str) -> Iterator["re.Match[str]"]:
        if not self.one_line:
            return self.regex.finditer(text) if self._holds_a_word(text) else iter(())
        return (match for start, end in self._lines_with_a_word(text) for match in self.regex.finditer(text, start, end))

    def _lines_with_a_word(self, text: str) -> Iterator[Tuple[int, int]]:
        """(start, end) of each line holding a word, in order, found as they are needed (a search
        stops at its first match); `end` is the line's newline."""
        upcoming = {word: text.find(word) for word in self.words}
        position = 0
        while True:
            upcoming = {word: found for word, found in upcoming.items() if found >= 0}
            if not upcoming:
                return
            nearest = min(upcoming.values())
            start = text.rfind("\n", 0, nearest) + 1
            end = text.find("\n", nearest)
            end = len(text) if end < 0 else end
            yield start, end
            position = end + 1
            for word, found in upcoming.items():
                if found < position:
                    upcoming[word] = text.find(word, position)
