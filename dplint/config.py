"""Settings: `[tool.dplint]` in the nearest pyproject.toml, overridden by command-line flags."""

from __future__ import annotations

import fnmatch
import hashlib
import json
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
from dplint.codes import CODES_BY_NAME, PREVIEW_CODES, RUNTIME_ONLY_CODES, STATIC_CODES

DEFAULT_EXCLUDE = (
    ".bzr", ".direnv", ".eggs", ".git", ".hg", ".mypy_cache", ".nox", ".pants.d", ".pytest_cache",
    ".ruff_cache", ".dplint_cache", ".svn", ".tox", ".venv", "venv", "__pypackages__", "__pycache__",
    "_build", "buck-out", "build", "dist", "node_modules", "site-packages", "*.egg-info",
    # A name holding a `{{ placeholder }}` is a project template's (cookiecutter, copier), not Python yet.
    "*{{*}}*",
)
KEYS = ("select", "ignore", "extend-select", "per-file-ignores", "exclude", "extend-exclude", "preview")
LIST_KEYS = ("select", "ignore", "extend-select", "exclude", "extend-exclude")
PREVIEW_HINT = "it runs only with --preview (or preview = true in [tool.dplint])"


class ConfigError(Exception):
    """A configuration or usage error: reported in one line, exit status 2."""


@dataclass(frozen=True)
class PerFileIgnore:
    """`pattern = [codes]`; the pattern matches paths relative to any of `bases` (see `resolve_settings`)."""

    pattern: str
    codes: FrozenSet[str]
    bases: Tuple[Path, ...]

    def matches(self, path: Path) -> bool:
        if "/" not in self.pattern.rstrip("/"):  # a file name: the same from every folder
            return _matches(PurePosixPath(path.name), self.pattern)
        absolute = path.resolve()
        for base in self.bases:
            try:
                relative = PurePosixPath(absolute.relative_to(base).as_posix())
            except ValueError:
                continue
            if _matches(relative, self.pattern):
                return True
        return False


@dataclass(frozen=True)
class Settings:
    enabled: FrozenSet[str]
    per_file_ignores: Tuple[PerFileIgnore, ...] = ()
    exclude: Tuple[str, ...] = DEFAULT_EXCLUDE
    root: Path = field(default_factory=Path.cwd)
    config_file: Optional[Path] = None
    # Where project-level facts come from (every file under it, minus the excluded); None: the named paths.
    project_root: Optional[Path] = None
    preview: bool = False
    # What the user should hear about the selection (a preview rule named without --preview), once each.
    warnings: Tuple[str, ...] = field(default=(), compare=False)

    @property
    def digest(self) -> str:
        text = repr((__version__, sorted(self.enabled), self.per_file_ignores, self.preview))
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def ignored_for(self, path: Path) -> FrozenSet[str]:
        """Codes that `per-file-ignores` turns off for this file."""
        ignored: set = set()
        for entry in self.per_file_ignores:
            if entry.matches(path):
                ignored |= entry.codes
        return frozenset(ignored)

    def unmatched_per_file_ignores(self, paths: Iterable[Path]) -> List[str]:
        """The per-file-ignores patterns that match none of these files (a typo, or a path from elsewhere)."""
        unmatched = list(self.per_file_ignores)
        for path in paths:
            unmatched = [entry for entry in unmatched if not entry.matches(path)]
            if not unmatched:
                break
        return [entry.pattern for entry in unmatched]

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


def expand_codes(selectors: Iterable[str], option: str, *, preview: bool = True, warnings: Optional[List[str]] = None) -> FrozenSet[str]:
    """`ALL`, a prefix (`DPL1`), a full code or a rule's name, each checked against the catalogue.

    Without `preview`, `ALL` and prefixes leave the preview rules out, and a preview rule named exactly
    is left out with a warning (Ruff's behaviour): selecting it cannot make it run.
    """
    codes: set = set()
    known = list(STATIC_CODES)
    for typed in selectors:
        selector = typed.strip()
        if not selector:
            continue
        selector = CODES_BY_NAME.get(selector.lower(), selector.upper())
        matched = known if selector == "ALL" else [code for code in known if code.startswith(selector)]
        if not matched:
            hint = " (DPL000 is always on)" if selector == "DPL000" else ""
            if selector in RUNTIME_ONLY_CODES:
                hint = " (a runtime check: enable it with `pytest --dplint` or `dplint.runtime.checking()`)"
            raise ConfigError(f"{option}: unknown rule selector `{typed.strip()}`{hint}; see `dplint --list-rules`.")
        if not preview:
            stable = [code for code in matched if code not in PREVIEW_CODES]
            if not stable and warnings is not None:
                exact = matched == [selector]
                hint = PREVIEW_HINT if exact else PREVIEW_HINT.replace("it runs", "they run")
                warnings.append(f"{selector} is a preview rule; {hint}." if exact else f"`{typed.strip()}` selects only preview rules; {hint}.")
            matched = stable
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
    _check_types(table, pyproject)
    return table


def _check_types(table: Dict[str, Any], pyproject: Path) -> None:
    """Each value of `[tool.dplint]` has its key's TOML type (Ruff's rule): a string where a list belongs
    (`select = "DPL2"`) is an error, not a comma-separated list (the command line's flags are)."""
    if "preview" in table and not isinstance(table["preview"], bool):
        raise ConfigError(f"{pyproject}: `preview` must be true or false, not {_kind(table['preview'])}.")
    lists = [(f"`{key}`", key, table[key]) for key in LIST_KEYS if key in table]
    per_file = table.get("per-file-ignores", {})
    if isinstance(per_file, dict):  # not a table: `_per_file_table` refuses it
        lists += [(f"per-file-ignores `{pattern}`", json.dumps(pattern), codes) for pattern, codes in per_file.items()]
    for where, key, value in lists:
        if isinstance(value, str):
            written = ", ".join(json.dumps(part.strip()) for part in value.split(",") if part.strip())
            raise ConfigError(f"{pyproject}: {where} must be a list of strings, not a string: {key} = [{written}].")
        if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise ConfigError(f"{pyproject}: {where} must be a list of strings, not {_kind(value)}.")


def _kind(value: Any) -> str:
    """A TOML value's type, as the user wrote it."""
    if isinstance(value, list):  # of strings it is the right type: one item is not
        return f"a list holding {_kind(next(item for item in value if not isinstance(item, str)))}"
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"), (dict, "a table")):
        if isinstance(value, kind):
            return name
    return "a date or time"


def _string_list(value: Any, where: str) -> List[str]:
    # A string is a command-line flag's (or an editor's) comma-separated value: `read_table` refused the file's.
    if isinstance(value, str):
        return [part for part in value.split(",") if part.strip()]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise ConfigError(f"{where} must be a list of strings.")


def resolve_settings(start: Path, overrides: Mapping[str, Any], *, isolated: bool = False) -> Settings:
    """Settings for a run over paths under `start`; `overrides` holds command-line values by key.

    `per-file-ignores` patterns from the configuration match paths relative to the pyproject.toml's
    folder; those from the command line match paths relative to the current folder or to that folder.
    """
    pyproject = None if isolated else find_pyproject(start)
    table: Dict[str, Any] = dict(read_table(pyproject)) if pyproject else {}
    root = (pyproject.parent if pyproject else Path.cwd()).resolve()
    overrides = dict(overrides)
    given_root = overrides.pop("project-root", None)
    per_file_table = {pattern: (codes, (root,)) for pattern, codes in _per_file_table(table.get("per-file-ignores", {})).items()}
    given_per_file = overrides.pop("per-file-ignores", None)
    if given_per_file is not None:  # the command line's replace the configuration's, as every flag does
        bases = tuple(dict.fromkeys((Path.cwd().resolve(), root)))
        per_file_table = {pattern: (codes, bases) for pattern, codes in given_per_file.items()}
    table.update((key, value) for key, value in overrides.items() if value is not None)

    preview = table.get("preview", False)
    if not isinstance(preview, bool):
        raise ConfigError("`preview` must be true or false.")
    warnings: List[str] = []

    def codes(key: str, selecting: bool) -> Optional[FrozenSet[str]]:
        if key not in table:
            return None
        selectors = _string_list(table[key], f"`{key}`")
        return expand_codes(selectors, f"`{key}`", preview=preview or not selecting, warnings=warnings)

    select = codes("select", selecting=True)
    default = (code for code, on in STATIC_CODES.items() if on and (preview or code not in PREVIEW_CODES))
    enabled = set(select if select is not None else default)
    enabled |= codes("extend-select", selecting=True) or frozenset()
    enabled -= codes("ignore", selecting=False) or frozenset()

    per_file = []
    for pattern, (selectors, bases) in per_file_table.items():
        where = f"per-file-ignores `{pattern}`"
        per_file.append(PerFileIgnore(pattern, expand_codes(_string_list(selectors, where), where), bases))

    exclude = _string_list(table["exclude"], "`exclude`") if "exclude" in table else list(DEFAULT_EXCLUDE)
    exclude += _string_list(table.get("extend-exclude", []), "`extend-exclude`")
    project_root = _project_root(start, given_root, tuple(exclude), isolated)
    return Settings(
        frozenset(enabled), tuple(per_file), tuple(exclude), root, pyproject, project_root, preview, tuple(dict.fromkeys(warnings))
    )


def _per_file_table(raw: Any) -> Dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError("`per-file-ignores` must be a table of pattern = [codes].")
    return raw


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
