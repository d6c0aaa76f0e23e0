"""Per-file results kept between runs in `.dplint_cache/`, keyed by content hash.

One cache file per dplint version and configuration. A file whose size and mtime are unchanged is
trusted without being read; otherwise it is read, hashed and rescanned, and its findings are reused
only if its content hash and the project-level facts they depend on are unchanged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Dict, Optional, Tuple

from dplint import __version__
from dplint.engine import FileResult
from dplint.analysis.facts import FileFacts, Wrap

CACHE_DIR = ".dplint_cache"
# Pickled facts from another layout would load with missing fields silently defaulted: the layout is
# part of the format.
FORMAT = (2, tuple(f.name for f in fields(FileFacts)), tuple(f.name for f in fields(Wrap)))


def code_stamp() -> str:
    """A digest of the size and mtime of dplint's own source files: an install from a clone keeps its
    version number through a `git pull`, and must not reuse findings of the rules it had before."""
    folders = [os.path.dirname(__file__)]
    rules = importlib.util.find_spec("dplint.rules")  # found, not imported: that would load libcst
    folders += list(rules.submodule_search_locations or ()) if rules is not None else []
    stamps = []
    for folder in folders:
        for directory, dirnames, filenames in os.walk(folder):
            dirnames[:] = [name for name in dirnames if name != "__pycache__"]
            for name in filenames:
                if name.endswith(".py"):
                    stat = os.stat(os.path.join(directory, name))
                    stamps.append((os.path.join(directory, name), stat.st_size, stat.st_mtime_ns))
    return hashlib.blake2b(repr(sorted(stamps)).encode(), digest_size=16).hexdigest()


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
    facts_digest: str = ""  # `fact_digest(facts)`: a warm run's project digest reads these, not the facts


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
    # The layout of the facts and the stamp of dplint's sources: a stored cache must match both.
    format: Tuple[object, ...] = ()

    @classmethod
    def open(cls, root: Path, settings_digest: str, enabled: bool) -> "Cache":
        if not enabled:
            return cls(None)
        path = root / CACHE_DIR / __version__ / f"{settings_digest}.pickle"
        cache = cls(path, format=(FORMAT, code_stamp()))
        try:
            with path.open("rb") as handle:
                stored_format, cache.scanned, cache.checked = pickle.load(handle)
            if stored_format != cache.format:
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
                pickle.dump((self.format, self.scanned, self.checked), stream, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, self.path)
        except OSError:
            pass  # a read-only checkout still lints, just without a cache
