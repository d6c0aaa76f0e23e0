"""Which project file an import names, resolved the way Python would for the importing file.

A repository often holds several independent programs (one folder per experiment), each with its own
`models/` or `utils.py`. An import is resolved from the importing file's own folder (a script's folder
is `sys.path[0]`), then the folder holding its top-level package (`python -m pkg.train`), then the
ancestors up to the project root (running from the root, or PYTHONPATH set to an ancestor), then the
project's `src/` folder. A
same-named module in a sibling program is never chosen: when no candidate folder holds the module it is
not a project module, and every fact that would depend on it is unknown.
"""

from __future__ import annotations

import os
from pathlib import Path
from functools import cached_property
from typing import Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

PROJECT_MARKERS = ("pyproject.toml", "setup.cfg", "setup.py", ".git")


def find_project_root(start: Path, is_boundary: Callable[[Path], bool] = lambda folder: False) -> Optional[Path]:
    """The nearest folder at or above `start` holding a project marker, else None.

    The search stops at a boundary folder (one the project excludes, such as `site-packages` or a
    virtualenv): what lies inside it is not part of any project above it.
    """
    directory = Path(os.path.abspath(start))
    if not directory.is_dir():
        directory = directory.parent
    for candidate in (directory, *directory.parents):
        if any((candidate / marker).exists() for marker in PROJECT_MARKERS):
            return candidate
        if is_boundary(candidate):
            return None
    return None


def absolute_module(package: str, level: int, module: str) -> str:
    """The module `from <level dots><module> import …` names, seen from `package`."""
    if not level:
        return module
    parts = package.split(".") if package else []
    parts = parts[: max(0, len(parts) - (level - 1))]
    return ".".join(p for p in (*parts, module) if p)


class ModuleIndex:
    """The project's source files, and the file a dotted module name means from a given file."""

    def __init__(self, filenames: Iterable[str], root: Optional[str] = None, path_names: Optional[Mapping[str, FrozenSet[str]]] = None) -> None:
        """`path_names`: for a folder, the names of the folders its scripts put on `sys.path` at run time
        (`sys.path.insert(0, "subtools/pytorch")`: `pytorch`)."""
        self.files: FrozenSet[str] = frozenset(filenames)
        self.root = root
        self._path_names = path_names or {}
        self._resolved: Dict[Tuple[str, str], Optional[str]] = {}
        self._folders: Dict[str, Tuple[str, ...]] = {}

    def resolve(self, module: str, from_file: str) -> Optional[str]:
        """The project file `import module` loads when run from `from_file`, or None (not a project module)."""
        directory = os.path.dirname(from_file)
        key = (module, directory)
        if key not in self._resolved:
            self._resolved[key] = self._find_in_parent(module, from_file)
        return self._resolved[key]

    def _find_in_parent(self, module: str, from_file: str) -> Optional[str]:
        """The file of `module`, unless a script's own plain module shadows the package it names:
        beside `train.py` (a folder that is no package, first on `sys.path`), `ImageReward.py` makes
        `from ImageReward import ImageReward` take its attribute, whatever `ImageReward/` holds elsewhere."""
        directory = os.path.dirname(from_file)
        found = self._find(module.replace(".", os.sep), directory)
        parent = module.rpartition(".")[0]
        if found is None or not parent or os.path.join(directory, "__init__.py") in self.files:
            return found
        shadow = self.resolve(parent, from_file)
        plain = shadow is not None and os.path.splitext(os.path.basename(shadow))[0] != "__init__"
        return None if plain and os.path.dirname(shadow) == directory else found

    def resolve_chain(self, module: str, from_file: str) -> Tuple[str, ...]:
        """Every project file that `import a.b.c` runs: a/__init__.py, a/b/__init__.py, a/b/c.py."""
        parts = module.split(".")
        found = (self.resolve(".".join(parts[: i + 1]), from_file) for i in range(len(parts)))
        return tuple(f for f in found if f is not None)

    def _find(self, relative: str, directory: str) -> Optional[str]:
        for folder in self._search_folders(directory):
            base = os.path.join(folder, relative)
            for candidate in (base + ".py", os.path.join(base, "__init__.py"), base + ".pyi"):
                if candidate in self.files:
                    return candidate
        # The folder a script puts on `sys.path` at run time (`sys.path.insert(0, "subtools/pytorch")`),
        # found by its name: the one project file under a folder of that name with this path.
        names = self._path_names.get(directory)
        if names:
            found = [filename for filename, folder in self._by_suffix.get(relative, ()) if os.path.basename(folder) in names]
            if len(found) == 1:
                return found[0]
        return None

    @cached_property
    def _by_suffix(self) -> Dict[str, Tuple[Tuple[str, str], ...]]:
        """Every module path (`libs/training/trainer`, no extension) → (file, the folder holding that path) of each file ending so."""
        found: Dict[str, List[Tuple[str, str]]] = {}
        for filename in self.files:
            stem, extension = os.path.splitext(filename)
            if extension not in (".py", ".pyi"):
                continue
            parts = stem.split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            for start in range(len(parts) - 1, 0, -1):
                found.setdefault(os.sep.join(parts[start:]), []).append((filename, os.sep.join(parts[:start])))
        return {suffix: tuple(sorted(set(names))) for suffix, names in found.items()}

    def _search_folders(self, directory: str) -> Sequence[str]:
        folders = self._folders.get(directory)
        if folders is None:
            package_base = directory
            while os.path.join(package_base, "__init__.py") in self.files and os.path.dirname(package_base) != package_base:
                package_base = os.path.dirname(package_base)
            found = [directory, package_base]
            if self.root is not None and _is_within(directory, self.root):
                # The folders above: where the program may have been started. Not those inside the package
                # (between the file's folder and its package base): no launch puts them on `sys.path`, and
                # `import ray` in `pkg/trainer/ray/engine.py` is the library, not `pkg/trainer/ray/`.
                folder = package_base if _is_within(package_base, self.root) else self.root
                while folder != self.root and os.path.dirname(folder) != folder:
                    folder = os.path.dirname(folder)
                    found.append(folder)
                found.append(os.path.join(self.root, "src"))
            folders = self._folders[directory] = tuple(dict.fromkeys(found))
        return folders


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
