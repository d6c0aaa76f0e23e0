"""Which files a run lints: named files always, folders walked for .py/.pyi minus the excluded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Sequence, Tuple

from dplint.config import Settings

SOURCE_SUFFIXES = (".py", ".pyi")


def discover(paths: Sequence[Path], settings: Settings) -> Tuple[List[Path], List[Tuple[Path, str]]]:
    """The files to lint, in a stable order, and the paths that could not be read (with why)."""
    files: List[Path] = []
    problems: List[Tuple[Path, str]] = []
    for path in paths:
        if path.is_dir():
            _walk(path, settings, files, problems)
        elif path.exists() or path.is_symlink():
            files.append(path)  # named explicitly: linted even when excluded or oddly named
        else:
            problems.append((path, "No such file or directory"))
    return sorted(dict.fromkeys(files)), problems


def _walk(root: Path, settings: Settings, files: List[Path], problems: List[Tuple[Path, str]]) -> None:
    def on_error(error: OSError) -> None:
        problems.append((Path(error.filename or root), error.strerror or str(error)))

    root_relative = settings.relative(root)
    for directory, dirnames, filenames in os.walk(root, onerror=on_error):
        base = Path(directory)
        relative = root_relative / base.relative_to(root).as_posix()
        dirnames[:] = sorted(
            name
            for name in dirnames
            if not settings.is_excluded(relative / name) and not (base / name / "pyvenv.cfg").exists()
        )
        for name in sorted(filenames):
            if name.endswith(SOURCE_SUFFIXES) and not settings.is_excluded(relative / name):
                files.append(base / name)
