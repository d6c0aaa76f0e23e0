"""The Python API: `lint_paths` for trees, `lint_source` for one piece of code."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from dplint.cache import Cache, Checked, Scanned, Stamp
from dplint.config import Settings
from dplint.discovery import discover
from dplint.engine import (
    FileResult,
    InternalError,
    SourceFile,
    Unreadable,
    check_file,
    check_task,
    parse_error_finding,
    parse_python,
    relocated,
    run_parallel,
    scan,
    source_file,
    source_files,
)
from dplint.analysis.facts import FileFacts, ProjectFacts, collect_file_facts, fact_digest
from dplint.finding import Finding
from dplint.codes import PREVIEW_CODES, STATIC_CODES


# The two passes, as the progress bar names them.
READING, CHECKING = "Reading project", "Checking"


@dataclass
class LintResult:
    findings: List[Finding] = field(default_factory=list)
    internal_errors: List[InternalError] = field(default_factory=list)
    files: int = 0  # files looked at
    checked: List[Path] = field(default_factory=list)  # those files
    parsed: int = 0  # files linted afresh (not from the cache)
    unparsed: int = 0  # files whose syntax nothing checked (torch's own modules, where no rule looks)
    not_parsing: List[str] = field(default_factory=list)  # files no rule looks at that do not parse, as shown


def default_settings(select: Optional[Iterable[str]] = None) -> Settings:
    """The command line's defaults (preview rules off), or exactly the codes in `select`."""
    default = (code for code, on in STATIC_CODES.items() if on and code not in PREVIEW_CODES)
    codes = frozenset(select) if select is not None else frozenset(default)
    return Settings(enabled=codes, root=Path.cwd())


def lint_paths(
    paths: Sequence[os.PathLike],
    settings: Optional[Settings] = None,
    *,
    jobs: Optional[int] = None,
    cache: bool = True,
    progress: Optional[Callable[[str, int, int], None]] = None,
) -> LintResult:
    """Lint files and folders: pass 1 collects project facts, pass 2 runs the rules on the named files.

    With `settings.project_root` set (the CLI finds it), the facts come from every file of the project,
    so a run over one staged file still knows that `train.py` wraps the model it defines.
    `progress(PASS, files_done, files_total)` is called as each pass goes: "Reading project" (pass 1,
    every file of the project) and then "Checking" (pass 2, the named files).
    """
    settings = settings or default_settings()
    jobs = jobs or os.cpu_count() or 1
    files, problems = discover([Path(p) for p in paths], settings)
    sources = source_files(files)
    store = Cache.open(settings.root, settings.digest, cache)
    result = LintResult(files=len(sources), checked=files)

    scanned = _scan_project(sources, settings, store, jobs, progress)
    facts = [entry.facts for entry in scanned.values() if entry.facts is not None]
    digests = {entry.facts.filename: entry.facts_digest for entry in scanned.values() if entry.facts is not None}
    project = ProjectFacts.build(facts, _root_of(settings), digests)

    cached: List[Tuple[SourceFile, FileResult]] = []
    to_check: List[Tuple[SourceFile, Optional[FileFacts]]] = []
    for source in sources:
        entry = scanned.get(source.filename)
        hit = entry and store.check_entry(source.filename, entry.content_hash, project.digest_for(source.filename))
        if hit:
            cached.append((source, hit))
        else:
            to_check.append((source, entry.facts if entry else None))
    done = len(cached)

    def advance() -> None:
        nonlocal done
        done += 1
        progress(CHECKING, done, len(sources))  # type: ignore[misc]

    def size(item: Tuple[SourceFile, Optional[FileFacts]]) -> int:
        entry = scanned.get(item[0].filename)
        return entry.stamp.size if entry is not None else 0

    checked = run_parallel(check_task, to_check, jobs, settings, project, advance if progress else None, cost=size)
    for (source, _), file_result in zip(to_check, checked):
        entry = scanned.get(source.filename)
        if entry is not None and not file_result.internal_errors:
            store.store_check(source.filename, Checked(entry.content_hash, project.digest_for(source.filename), file_result))
    store.save()

    result.parsed = len(to_check)
    for source, file_result in cached + list(zip((s for s, _ in to_check), checked)):
        result.findings.extend(relocated(f, source.path) for f in file_result.findings)
        result.unparsed += file_result.unparsed
        if file_result.does_not_parse:
            result.not_parsing.append(source.path)
        result.internal_errors.extend(file_result.internal_errors)
    result.not_parsing.sort()
    for path, reason in problems:
        result.findings.append(parse_error_finding(source_file(path), Unreadable(f"cannot read: {reason}")))
    result.findings.sort(key=Finding.sort_key)
    return result


def _root_of(settings: Settings) -> Optional[str]:
    return str(settings.project_root) if settings.project_root is not None else None


def _scan_project(
    sources: Sequence[SourceFile], settings: Settings, store: Cache, jobs: int, progress: Optional[Callable[[str, int, int], None]] = None
) -> Dict[str, Scanned]:
    """Pass 1 over the named files and, under a project root, every other file of the project."""
    everything = {source.filename: source for source in sources}
    if settings.project_root is not None:
        for source in source_files(discover([settings.project_root], settings)[0]):
            everything.setdefault(source.filename, source)
    stamps = {filename: Stamp.of(filename) for filename in everything}
    scanned: Dict[str, Scanned] = {}
    to_scan: List[SourceFile] = []
    for filename, source in everything.items():
        entry = store.scan_entry(filename, stamps[filename])
        if entry is None:
            to_scan.append(source)
        else:
            scanned[filename] = entry
    done = len(scanned)

    def advance() -> None:
        nonlocal done
        done += 1
        progress(READING, done, len(everything))  # type: ignore[misc]

    for source, (facts, digest) in zip(to_scan, run_parallel(scan, to_scan, jobs, settings, None, advance if progress else None)):
        stamp = stamps[source.filename]
        if digest and stamp is not None:
            scanned[source.filename] = Scanned(stamp, digest, facts, fact_digest(facts) if facts is not None else "")
            store.store_scan(source.filename, scanned[source.filename])
    return scanned


def lint_text(text: str, file: SourceFile, settings: Settings, *, cache: bool = True) -> FileResult:
    """Lint one text as the file it names: under a project root, the project's facts with this text in
    place of that file (an editor's unsaved buffer, standard input); otherwise its facts are its own."""
    facts = collect_file_facts(text, file.module_name, file.package, file.path, file.filename)
    others: List[FileFacts] = []
    if settings.project_root is not None:
        store = Cache.open(settings.root, settings.digest, cache)
        scanned = _scan_project([], settings, store, os.cpu_count() or 1)
        store.save()
        others = [entry.facts for name, entry in scanned.items() if entry.facts is not None and name != facts.filename]
    result = check_file(file, text, settings, ProjectFacts.build([facts, *others], _root_of(settings)), facts)
    if result.does_not_parse:  # the one file asked for: its syntax error is the answer, whatever the rules
        try:
            parse_python(text)
        except Unreadable as error:
            return FileResult((parse_error_finding(file, error),))
    return result


def lint_source(
    source: str,
    path: str = "<stdin>.py",
    *,
    select: Optional[Iterable[str]] = None,
    settings: Optional[Settings] = None,
) -> List[Finding]:
    """Lint one piece of code as if it were the file `path` (project facts come from it alone)."""
    settings = settings or default_settings(select)
    file = SourceFile(filename=str(Path(path).absolute()), path=path, module_name=Path(path).stem, package="")
    result = lint_text(source, file, settings)
    if result.internal_errors:
        error = result.internal_errors[0]
        raise RuntimeError(f"internal error in rule {error.code} on {error.path}:\n{error.details}")
    return sorted(result.findings, key=Finding.sort_key)
