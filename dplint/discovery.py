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

    # Paths relative to the project root, as posix strings: a big tree has thousands of them.
    root_relative = settings.relative(root).as_posix()
    root_prefix = "" if root_relative == "." else root_relative + "/"
    top = os.fspath(root)
    for directory, dirnames, filenames in os.walk(top, onerror=on_error):
        below = directory[len(top) :].strip(os.sep).replace(os.sep, "/")  # os.walk joins onto `top`
        prefix = f"{root_prefix}{below}/" if below else root_prefix
        dirnames[:] = sorted(
            name
            for name in dirnames
            if not settings.is_excluded(prefix + name) and not os.path.exists(os.path.join(directory, name, "pyvenv.cfg"))
        )
        base = Path(directory)
        for name in sorted(filenames):
            if name.endswith(SOURCE_SUFFIXES) and not settings.is_excluded(prefix + name):
                files.append(base / name)
