"""The project facts the server keeps warm: one project's files from disk, open documents' unsaved text in their place.

The root is found as the command line finds it; the facts of files on disk are read once and kept,
and updated file by file as the client reports changes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional

from dplint.analysis.facts import FileFacts, ProjectFacts, collect_file_facts, module_identity
from dplint.analysis.modules import find_project_root
from dplint.config import Settings
from dplint.discovery import discover
from dplint.engine import SourceFile, scan


def project_root(filename: Path) -> Path:
    """The nearest folder above the file that holds a project marker, else the file's own folder."""
    return find_project_root(filename) or filename.parent


class WorkspaceFacts:
    """Every Python file's facts in one project, with an open document's unsaved text used instead of its file."""

    def __init__(self, root: Path, settings: Settings) -> None:
        self.root = root
        self.exclude = settings.exclude
        self._settings = settings
        self._on_disk: Optional[Dict[str, FileFacts]] = None  # scanned on first use
        self._unsaved: Dict[str, FileFacts] = {}
        self._project: Optional[ProjectFacts] = None

    def source(self, filename: str) -> SourceFile:
        path = Path(filename)
        try:
            shown = path.relative_to(self.root).as_posix()
        except ValueError:
            shown = filename
        return SourceFile(filename, shown, *module_identity(path))

    def project(self) -> ProjectFacts:
        if self._project is None:
            files = {**self._disk(), **self._unsaved}
            self._project = ProjectFacts.build(list(files.values()), str(self.root))
        return self._project

    def use_text(self, filename: str, text: str) -> FileFacts:
        """Take the file's facts from this text (an open document's, saved or not) until `drop_text`."""
        source = self.source(filename)
        facts = collect_file_facts(text, source.module_name, source.package, source.path, source.filename)
        if self._unsaved.get(filename) != facts:
            self._unsaved[filename] = facts
            self._project = None
        return facts

    def drop_text(self, filename: str) -> None:
        """The document was closed: its file on disk counts again."""
        if self._unsaved.pop(filename, None) is not None:
            self._project = None

    def reload(self, filename: str) -> None:
        """The file changed on disk (created, edited or deleted)."""
        disk = self._disk()
        facts = scan(self.source(filename))[0] if os.path.isfile(filename) else None
        if disk.get(filename) != facts:
            if facts is None:
                disk.pop(filename, None)
            else:
                disk[filename] = facts
            self._project = None

    def _disk(self) -> Dict[str, FileFacts]:
        if self._on_disk is None:
            files, _ = discover([self.root], self._settings)
            self._on_disk = {}
            for path in files:
                source = self.source(os.path.abspath(path))
                facts, _ = scan(source)
                if facts is not None:
                    self._on_disk[source.filename] = facts
        return self._on_disk
