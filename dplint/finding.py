"""The data a lint run produces: findings, their locations and the fixes they offer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

DOCS_URL = "https://github.com/dplint/dplint/blob/main/docs/rules.md"


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

    @property
    def url(self) -> str:
        return f"{DOCS_URL}#{self.code.lower()}-{self.name}"

    def sort_key(self):
        return (self.path, self.location, self.code)
