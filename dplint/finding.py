"""The data a lint run produces: findings, their locations and the fixes they offer."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple


@dataclass(frozen=True, order=True)
class Location:
    """A 1-based row and a 1-based column counted in characters."""

    row: int
    column: int


@dataclass(frozen=True)
class Edit:
    content: str
    location: Location
    end_location: Location


@dataclass(frozen=True)
class Fix:
    applicability: str  # "safe" or "unsafe"
    message: str
    edits: Tuple[Edit, ...]


@dataclass(frozen=True)
class FileReference:
    """A place in another (or the same) file that a message names, as `text` shows it: `train.py:104`.

    Each output format shows it the way it shows the finding's own path (see `Finding.message_for`)."""

    filename: str  # absolute
    line: int
    text: str

    @classmethod
    def to(cls, filename: str, shown_path: str, line: int) -> "FileReference":
        return cls(filename, line, f"{shown_path}:{line}")


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: str  # "error" or "warning"
    message: str
    help: str
    path: str  # as shown to the user
    filename: str  # absolute
    location: Location
    end_location: Location
    fix: Optional[Fix] = None
    noqa_row: int = field(default=0, compare=False)
    references: Tuple[FileReference, ...] = ()
    # The ranks that saw it, for a finding of `dplint run` (a static finding has none); JSON lists them.
    ranks: Tuple[int, ...] = ()

    def message_for(self, show_path: Callable[[str], str]) -> str:
        """The message with every file it names shown by `show_path(absolute filename)`."""
        message = self.message
        for reference in self.references:
            if reference.filename:
                message = message.replace(reference.text, f"{show_path(reference.filename)}:{reference.line}", 1)
        return message

    def sort_key(self):
        return (self.path, self.location, self.code)


def display_path(path: "os.PathLike[str] | str", cwd: Optional[str] = None) -> str:
    """A path as findings show it: relative to the current folder when inside it, else as it was given."""
    cwd = cwd or os.getcwd()
    absolute = os.path.abspath(path)
    if absolute == cwd:
        return "."
    if absolute.startswith(cwd + os.sep):
        return absolute[len(cwd) + 1 :]
    return absolute if os.path.isabs(path) else os.path.normpath(path)
