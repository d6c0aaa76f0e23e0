"""Per-file results kept between runs in `.dplint_cache/`, keyed by content hash.

One cache file per dplint version and configuration. A file whose size and mtime are unchanged is
trusted without being read; otherwise it is read, hashed and rescanned, and its findings are reused
only if its content hash and the project-level facts they depend on are unchanged.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Dict, Optional

from dplint import __version__
from dplint.engine import FileResult
from dplint.analysis.facts import FileFacts, Wrap

CACHE_DIR = ".dplint_cache"
# Pickled facts from another layout would load with missing fields silently defaulted: the layout is
# part of the format.
FORMAT = (2, tuple(f.name for f in fields(FileFacts)), tuple(f.name for f in fields(Wrap)))


@dataclass(frozen=True)
class Stamp:
    mtime_ns: int
    size: int

    @classmethod
    def of(cls, filename: str) -> Optional["Stamp"]:
        try:
            stat = os.stat(filename)
        except OSError:
            return None
        return cls(stat.st_mtime_ns, stat.st_size)


@dataclass
class Scanned:
    stamp: Stamp
    content_hash: str
    facts: Optional[FileFacts]


@dataclass
class Checked:
    content_hash: str
    project_digest: str
    result: FileResult


@dataclass
class Cache:
    path: Optional[Path]  # None: caching is off
    scanned: Dict[str, Scanned] = field(default_factory=dict)
    checked: Dict[str, Checked] = field(default_factory=dict)
    dirty: bool = False  # whether this run added anything worth writing back

    @classmethod
    def open(cls, root: Path, settings_digest: str, enabled: bool) -> "Cache":
        if not enabled:
            return cls(None)
        path = root / CACHE_DIR / __version__ / f"{settings_digest}.pickle"
        cache = cls(path)
        try:
            with path.open("rb") as handle:
                stored_format, cache.scanned, cache.checked = pickle.load(handle)
            if stored_format != FORMAT:
                cache.scanned, cache.checked = {}, {}
        except Exception:  # missing, truncated or from another format: start afresh
            cache.scanned, cache.checked = {}, {}
        return cache

    def scan_entry(self, filename: str, stamp: Optional[Stamp]) -> Optional[Scanned]:
        entry = self.scanned.get(filename)
        return entry if entry is not None and stamp is not None and entry.stamp == stamp else None

    def check_entry(self, filename: str, content_hash: str, project_digest: str) -> Optional[FileResult]:
        entry = self.checked.get(filename)
        if entry is None or entry.content_hash != content_hash or entry.project_digest != project_digest:
            return None
        return entry.result

    def store_scan(self, filename: str, entry: Scanned) -> None:
        self.scanned[filename] = entry
        self.dirty = True

    def store_check(self, filename: str, entry: Checked) -> None:
        self.checked[filename] = entry
        self.dirty = True

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            top = self.path.parent.parent
            for name, content in ((".gitignore", "# Created by dplint.\n*\n"), ("CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n")):
                if not (top / name).exists():
                    (top / name).write_text(content)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(handle, "wb") as stream:
                pickle.dump((FORMAT, self.scanned, self.checked), stream, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, self.path)
        except OSError:
            pass  # a read-only checkout still lints, just without a cache
