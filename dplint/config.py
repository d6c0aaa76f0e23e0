"""Settings: `[tool.dplint]` in the nearest pyproject.toml, overridden by command-line flags."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import (
    Any,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from dplint import __version__
from dplint.analysis.modules import find_project_root
from dplint.codes import RUNTIME_ONLY_CODES, STATIC_CODES

DEFAULT_EXCLUDE = (
    ".bzr", ".direnv", ".eggs", ".git", ".hg", ".mypy_cache", ".nox", ".pants.d", ".pytest_cache",
    ".ruff_cache", ".dplint_cache", ".svn", ".tox", ".venv", "venv", "__pypackages__", "__pycache__",
    "_build", "buck-out", "build", "dist", "node_modules", "site-packages", "*.egg-info",
)
KEYS = ("select", "ignore", "extend-select", "per-file-ignores", "exclude", "extend-exclude")


class ConfigError(Exception):
    """A configuration or usage error: reported in one line, exit status 2."""


@dataclass(frozen=True)
class Settings:
    enabled: FrozenSet[str]
    per_file_ignores: Tuple[Tuple[str, FrozenSet[str]], ...] = ()
    exclude: Tuple[str, ...] = DEFAULT_EXCLUDE
    root: Path = field(default_factory=Path.cwd)
    config_file: Optional[Path] = None
    # Where project-level facts come from (every file under it, minus the excluded); None: the named paths.
    project_root: Optional[Path] = None

    @property
    def digest(self) -> str:
        text = repr((__version__, sorted(self.enabled), self.per_file_ignores))
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def ignored_for(self, path: Path) -> FrozenSet[str]:
        """Codes that `per-file-ignores` turns off for this file."""
        if not self.per_file_ignores:
            return frozenset()
        relative = self.relative(path)
        ignored: set = set()
        for pattern, codes in self.per_file_ignores:
            if _matches(relative, pattern):
                ignored |= codes
        return frozenset(ignored)

    def relative(self, path: Path) -> PurePosixPath:
        """The path relative to the project root (or as given, when outside it)."""
        try:
            return PurePosixPath(path.resolve().relative_to(self.root).as_posix())
        except ValueError:
            return PurePosixPath(path.as_posix())

    def is_excluded(self, relative: str) -> bool:
        """Whether an exclude pattern matches this posix path relative to the root, or its last name."""
        names, paths = _exclusion_patterns(self.exclude)
        return bool(names.match(relative.rpartition("/")[2]) or (paths and paths.match(relative)))


@lru_cache(maxsize=8)
def _exclusion_patterns(patterns: Tuple[str, ...]) -> Tuple["re.Pattern[str]", Optional["re.Pattern[str]"]]:
    """One regex for the patterns that name a file or folder, one for those that name a path."""
    names = [fnmatch.translate(p.rstrip("/")) for p in patterns if "/" not in p.rstrip("/")]
    paths = [fnmatch.translate(p.rstrip("/")) for p in patterns if "/" in p.rstrip("/")]
    paths += [fnmatch.translate(p.rstrip("/") + "/*") for p in patterns if "/" in p.rstrip("/")]
    name_regex = re.compile("|".join(names) or "(?!)")
    return name_regex, re.compile("|".join(paths)) if paths else None


def _matches(relative: PurePosixPath, pattern: str) -> bool:
    """A pattern matches a file name or folder name, or the path relative to the project root."""
    pattern = pattern.rstrip("/")
    if "/" in pattern:
        return fnmatch.fnmatchcase(relative.as_posix(), pattern) or fnmatch.fnmatchcase(relative.as_posix(), pattern + "/*")
    return fnmatch.fnmatchcase(relative.name, pattern)


def expand_codes(selectors: Iterable[str], option: str) -> FrozenSet[str]:
    """`ALL`, a prefix (`DPL1`) or a full code, each checked against the catalogue."""
    codes: set = set()
    known = list(STATIC_CODES)
    for selector in selectors:
        selector = selector.strip().upper()
        if not selector:
            continue
        matched = known if selector == "ALL" else [code for code in known if code.startswith(selector)]
        if not matched:
            hint = " (DPL000 is always on)" if selector == "DPL000" else ""
            if selector in RUNTIME_ONLY_CODES:
                hint = " (a runtime check: enable it with `pytest --dplint` or `dplint.runtime.checking()`)"
            raise ConfigError(f"{option}: unknown rule selector `{selector}`{hint}; see `dplint --list-rules`.")
        codes.update(matched)
    return frozenset(codes)


def find_pyproject(start: Path) -> Optional[Path]:
    directory = start.resolve()
    if directory.is_file() or not directory.exists():
        directory = directory.parent
    for candidate in (directory, *directory.parents):
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file():
            return pyproject
    return None


def read_table(pyproject: Path) -> Dict[str, Any]:
    try:
        with pyproject.open("rb") as handle:
            document = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: cannot read configuration: {error}") from None
    table = document.get("tool", {}).get("dplint", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.dplint] must be a table.")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"{pyproject}: unknown key(s) in [tool.dplint]: {', '.join(unknown)}; the keys are {', '.join(KEYS)}."
        )
    return table


def _string_list(value: Any, where: str) -> List[str]:
    if isinstance(value, str):
        return [part for part in value.split(",") if part.strip()]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise ConfigError(f"{where} must be a list of strings.")


def resolve_settings(start: Path, overrides: Mapping[str, Any], *, isolated: bool = False) -> Settings:
    """Settings for a run over paths under `start`; `overrides` holds command-line values by key."""
    pyproject = None if isolated else find_pyproject(start)
    table: Dict[str, Any] = dict(read_table(pyproject)) if pyproject else {}
    overrides = dict(overrides)
    given_root = overrides.pop("project-root", None)
    table.update((key, value) for key, value in overrides.items() if value is not None)

    def codes(key: str) -> Optional[FrozenSet[str]]:
        if key not in table:
            return None
        return expand_codes(_string_list(table[key], f"`{key}`"), f"`{key}`")

    select = codes("select")
    enabled = set(select if select is not None else (code for code, on in STATIC_CODES.items() if on))
    enabled |= codes("extend-select") or frozenset()
    enabled -= codes("ignore") or frozenset()

    per_file: List[Tuple[str, FrozenSet[str]]] = []
    raw = table.get("per-file-ignores", {})
    if not isinstance(raw, dict):
        raise ConfigError("`per-file-ignores` must be a table of pattern = [codes].")
    for pattern, selectors in raw.items():
        per_file.append((pattern, expand_codes(_string_list(selectors, f"per-file-ignores `{pattern}`"), "per-file-ignores")))

    exclude = _string_list(table["exclude"], "`exclude`") if "exclude" in table else list(DEFAULT_EXCLUDE)
    exclude += _string_list(table.get("extend-exclude", []), "`extend-exclude`")
    root = pyproject.parent if pyproject else Path.cwd()
    project_root = _project_root(start, given_root, tuple(exclude), isolated)
    return Settings(frozenset(enabled), tuple(per_file), tuple(exclude), root.resolve(), pyproject, project_root)


def _project_root(start: Path, given: Optional[str], exclude: Tuple[str, ...], isolated: bool) -> Optional[Path]:
    if given is not None:
        root = Path(os.path.abspath(given))
        if not root.is_dir():
            raise ConfigError(f"--project-root: `{given}` is not a folder.")
        return root
    if isolated:
        return None
    names, _ = _exclusion_patterns(exclude)
    return find_project_root(start, lambda folder: bool(names.match(folder.name)) or (folder / "pyvenv.cfg").exists())


def parse_per_file_ignores(values: Sequence[str]) -> Dict[str, List[str]]:
    """`--per-file-ignores "tests/*:DPL101,DPL301"` → {"tests/*": ["DPL101", "DPL301"]}."""
    result: Dict[str, List[str]] = {}
    for value in values:
        pattern, sep, codes = value.rpartition(":")
        if not sep or not pattern:
            raise ConfigError(f"--per-file-ignores expects PATTERN:CODES, got `{value}`.")
        result.setdefault(pattern, []).extend(c for c in codes.split(",") if c.strip())
    return result
