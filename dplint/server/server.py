"""`dplint server`: a language server over stdio with live diagnostics, quick fixes and rule docs on hover."""

from __future__ import annotations

import ast
import asyncio
import traceback
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Mapping, Optional, Set

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from dplint import __version__
from dplint.config import ConfigError, Settings, resolve_settings
from dplint.discovery import SOURCE_SUFFIXES
from dplint.docs import explain, reference_url
from dplint.engine import StatementTrees, check_file
from dplint.finding import Finding
from dplint.fixes import apply_fixes
from dplint.rules import BY_CODE, ParseError
from dplint.server.convert import Converter, contains, overlaps
from dplint.server.project import WorkspaceFacts, project_root

# Typing pauses shorter than this coalesce into one lint; it is part of the latency the user sees.
DEBOUNCE_SECONDS = 0.05
FIX_ALL = "source.fixAll.dplint"
CONFIG_FILES = ("pyproject.toml",)
# Client settings (`dplint.select` ...) and the `[tool.dplint]` keys they override.
CLIENT_SETTINGS = {"select": "select", "ignore": "ignore", "extendSelect": "extend-select"}


@dataclass(frozen=True)
class Linted:
    """A document's findings, with the text and version they were computed from."""

    version: Optional[int]
    text: str
    findings: List[Finding]
    converter: Converter


class DplintServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("dplint", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.client_settings: Dict[str, Any] = {}
        self.projects: Dict[Path, WorkspaceFacts] = {}
        self.linted: Dict[str, Linted] = {}
        # Each open document's statement trees from its last lint: an edit re-parses only what it touched.
        self.statements: Dict[str, StatementTrees] = {}
        self.pending: Dict[str, asyncio.Task] = {}
        self.shown_errors: Set[str] = set()

    # ----- settings -----------------------------------------------------------------------------------

    def use_client_settings(self, raw: Any) -> None:
        """`{"dplint": {...}}`, `{"settings": {...}}` or the settings themselves: editors nest them differently."""
        for key in ("dplint", "settings"):
            if isinstance(raw, Mapping) and isinstance(raw.get(key), Mapping):
                raw = raw[key]
        section = raw if isinstance(raw, Mapping) else {}
        self.client_settings = {key: section[key] for key in CLIENT_SETTINGS if section.get(key) is not None}

    def settings_for(self, filename: str) -> Settings:
        """`[tool.dplint]` read afresh (so edits to it apply at once), overridden by the client's settings."""
        overrides = {CLIENT_SETTINGS[key]: value for key, value in self.client_settings.items()}
        for attempt in (overrides, {}):
            try:
                return resolve_settings(Path(filename), attempt)
            except ConfigError as error:
                self.report_config_error(str(error))
        return resolve_settings(Path(filename), {}, isolated=True)

    def report_config_error(self, message: str) -> None:
        if message not in self.shown_errors:
            self.shown_errors.add(message)
            self.window_show_message(types.ShowMessageParams(types.MessageType.Error, f"dplint: {message}"))
        self.log(types.MessageType.Error, message)

    def project_for(self, filename: str, settings: Settings) -> WorkspaceFacts:
        root = project_root(Path(filename))
        project = self.projects.get(root)
        if project is None or project.exclude != settings.exclude:
            project = self.projects[root] = WorkspaceFacts(root, settings)
        return project

    # ----- linting ------------------------------------------------------------------------------------

    def log(self, kind: types.MessageType, message: str) -> None:
        self.window_log_message(types.LogMessageParams(kind, message))

    def lint(self, uri: str) -> Optional[Linted]:
        """Lint the document's current text and publish the diagnostics; on an internal error keep the last ones."""
        document = self.workspace.get_text_document(uri)
        filename = to_fs_path(uri)
        if filename is None or not filename.endswith(SOURCE_SUFFIXES):
            return None
        text, version = document.source, document.version
        try:
            settings = self.settings_for(filename)
            project = self.project_for(filename, settings)
            before = self.open_digests(project)
            facts = project.use_text(filename, text)
            findings: List[Finding] = []
            if not _is_excluded(settings, Path(filename)):
                statements = self.statements.setdefault(uri, StatementTrees())
                result = check_file(project.source(filename), text, settings, project.project(), facts, statements)
                for error in result.internal_errors:
                    self.log(types.MessageType.Error, f"internal error in rule {error.code} on {error.path}:\n{error.details}")
                if result.internal_errors:
                    return self.linted.get(uri)
                findings = sorted(result.findings, key=Finding.sort_key)
        except Exception:
            self.log(types.MessageType.Error, f"internal error while linting {uri}:\n{traceback.format_exc()}")
            return self.linted.get(uri)
        linted = Linted(version, text, findings, Converter(text, document.position_codec))
        self.linted[uri] = linted
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri, [linted.converter.diagnostic(f) for f in findings], version)
        )
        self.relint_changed(project, before, but=uri)
        return linted

    def current(self, uri: str) -> Optional[Linted]:
        """The document's findings for its text as it is now (linting it first if an edit is still pending)."""
        linted = self.linted.get(uri)
        document = self.workspace.get_text_document(uri)
        if linted is not None and linted.version == document.version and linted.text == document.source:
            return linted
        self.cancel(uri)
        return self.lint(uri)

    def lint_soon(self, uri: str, delay: float = DEBOUNCE_SECONDS) -> None:
        self.cancel(uri)
        self.pending[uri] = asyncio.get_running_loop().create_task(self._lint_after(uri, delay))

    async def _lint_after(self, uri: str, delay: float) -> None:
        await asyncio.sleep(delay)
        self.pending.pop(uri, None)
        if uri in self.workspace.text_documents:
            self.lint(uri)

    def cancel(self, uri: str) -> None:
        task = self.pending.pop(uri, None)
        if task is not None:
            task.cancel()

    def open_digests(self, project: WorkspaceFacts) -> Dict[str, str]:
        """Each open document of the project → the digest of the facts its findings depend on."""
        facts = project.project()
        found = {}
        for uri in list(self.workspace.text_documents):
            filename = to_fs_path(uri)
            if filename is not None and project_root(Path(filename)) == project.root:
                found[uri] = facts.digest_for(filename)
        return found

    def relint_changed(self, project: WorkspaceFacts, before: Dict[str, str], but: str = "") -> None:
        """Lint again the open documents whose facts changed since `before`, but the one just linted."""
        for uri, digest in self.open_digests(project).items():
            if uri != but and before.get(uri) != digest:
                self.lint_soon(uri, 0)

    def relint_open(self, project: Optional[WorkspaceFacts] = None, but: str = "") -> None:
        """Lint again the open documents of this project (of every project when None), but the one just linted."""
        for uri in list(self.workspace.text_documents):
            filename = to_fs_path(uri)
            if uri == but or filename is None:
                continue
            if project is None or project_root(Path(filename)) == project.root:
                self.lint_soon(uri, 0)

    def forget(self, uri: str) -> None:
        self.cancel(uri)
        self.linted.pop(uri, None)
        self.statements.pop(uri, None)
        filename = to_fs_path(uri)
        if filename is None:
            return
        project = self.projects.get(project_root(Path(filename)))
        if project is not None:
            before = self.open_digests(project)
            project.drop_text(filename)
            self.relint_changed(project, before, but=uri)


def _is_excluded(settings: Settings, path: Path) -> bool:
    relative = settings.relative(path)
    return any(settings.is_excluded(PurePosixPath(*relative.parts[: i + 1]).as_posix()) for i in range(len(relative.parts)))


server = DplintServer()


@server.feature(types.INITIALIZE)
def initialize(ls: DplintServer, params: types.InitializeParams) -> None:
    if params.initialization_options is not None:
        ls.use_client_settings(params.initialization_options)


@server.feature(types.INITIALIZED)
async def initialized(ls: DplintServer, params: types.InitializedParams) -> None:
    workspace = ls.client_capabilities.workspace
    watched = workspace.did_change_watched_files if workspace else None
    if watched is not None and watched.dynamic_registration:
        watchers = [types.FileSystemWatcher(glob_pattern=pattern) for pattern in ("**/*.py", "**/*.pyi", "**/pyproject.toml")]
        registration = types.Registration(
            id="dplint-watched-files",
            method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
            register_options=types.DidChangeWatchedFilesRegistrationOptions(watchers=watchers),
        )
        try:
            await ls.client_register_capability_async(types.RegistrationParams([registration]))
        except Exception as error:  # the client still sends didSave; only files changed outside it go unseen
            ls.log(types.MessageType.Warning, f"cannot watch files for changes: {error}")
    await pull_configuration(ls)


async def pull_configuration(ls: DplintServer) -> bool:
    """Ask the client for the `dplint` section when it can answer; whether it could."""
    workspace = ls.client_capabilities.workspace
    if not (workspace and workspace.configuration):
        return False
    values = await ls.workspace_configuration_async(types.ConfigurationParams([types.ConfigurationItem(section="dplint")]))
    if values and values[0] is not None:  # no `dplint` section: keep what initializationOptions gave
        ls.use_client_settings({"dplint": values[0]})
    return True


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(ls: DplintServer, params: types.DidChangeConfigurationParams) -> None:
    if not await pull_configuration(ls):
        ls.use_client_settings(params.settings)
    ls.relint_open()


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
async def did_open(ls: DplintServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.cancel(params.text_document.uri)
    ls.lint(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
async def did_change(ls: DplintServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.lint_soon(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
async def did_save(ls: DplintServer, params: types.DidSaveTextDocumentParams) -> None:
    uri = params.text_document.uri
    if uri.endswith(CONFIG_FILES):
        ls.relint_open()
    else:
        ls.cancel(uri)
        ls.lint(uri)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
async def did_close(ls: DplintServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.forget(uri)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri, []))


@server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
async def did_change_watched_files(ls: DplintServer, params: types.DidChangeWatchedFilesParams) -> None:
    """A file changed outside the editor: its facts are read again; a pyproject.toml affects every document."""
    settings_changed = False
    for change in params.changes:
        filename = to_fs_path(change.uri)
        if filename is None:
            continue
        if filename.endswith(CONFIG_FILES):
            settings_changed = True  # settings are read afresh for every lint
        elif filename.endswith(SOURCE_SUFFIXES) and change.uri not in ls.workspace.text_documents:
            project = ls.projects.get(project_root(Path(filename)))
            if project is not None:
                before = ls.open_digests(project)
                project.reload(filename)
                ls.relint_changed(project, before)
    if settings_changed:
        ls.relint_open()


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL]),
)
def code_action(ls: DplintServer, params: types.CodeActionParams) -> Optional[List[types.CodeAction]]:
    uri = params.text_document.uri
    linted = ls.current(uri)
    if linted is None:
        return None
    only = params.context.only
    actions: List[types.CodeAction] = []
    if _wanted(types.CodeActionKind.QuickFix, only):
        for finding in linted.findings:
            diagnostic = linted.converter.diagnostic(finding)
            if finding.code == ParseError.code or not overlaps(diagnostic.range, params.range):
                continue
            actions.extend(_quick_fixes(uri, linted, finding, diagnostic))
    if _wanted(FIX_ALL, only):
        action = _fix_all(uri, linted)
        if action is not None:
            actions.append(action)
    return actions


def _wanted(kind: str, only: Optional[List[str]]) -> bool:
    return only is None or any(kind == wanted or kind.startswith(f"{wanted}.") for wanted in only)


def _quick_fixes(uri: str, linted: Linted, finding: Finding, diagnostic: types.Diagnostic) -> List[types.CodeAction]:
    actions = []
    if finding.fix is not None:
        safe = finding.fix.applicability == "safe"
        actions.append(
            types.CodeAction(
                title=f"{finding.fix.message} ({finding.code})" + ("" if safe else " (unsafe)"),
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diagnostic],
                edit=types.WorkspaceEdit(changes={uri: linted.converter.fix_edits([finding])}),
                is_preferred=safe,
            )
        )
    noqa = linted.converter.noqa_edit(finding)
    if noqa is not None:
        actions.append(
            types.CodeAction(
                title=f"Disable {finding.code} for this line",
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diagnostic],
                edit=types.WorkspaceEdit(changes={uri: [noqa]}),
            )
        )
    return actions


def _fix_all(uri: str, linted: Linted) -> Optional[types.CodeAction]:
    fixed, applied = apply_fixes(linted.text, linted.findings)
    if not applied:
        return None
    try:
        ast.parse(fixed)  # as `--fix` does: never offer a result that would not parse
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return types.CodeAction(
        title="Fix all dplint findings",
        kind=FIX_ALL,
        edit=types.WorkspaceEdit(changes={uri: linted.converter.fix_edits(applied)}),
    )


@server.feature(types.TEXT_DOCUMENT_HOVER)
def hover(ls: DplintServer, params: types.HoverParams) -> Optional[types.Hover]:
    linted = ls.current(params.text_document.uri)
    if linted is None:
        return None
    sections, ranges = [], []
    for finding in linted.findings:
        where = linted.converter.range(finding.location, finding.end_location)
        rule = BY_CODE.get(finding.code)
        if rule is None or not contains(where, params.position):
            continue
        ranges.append(where)
        url = reference_url(rule.code, rule.name)
        link = f" [Rule reference]({url})" if url is not None else ""
        sections.append(f"**{rule.code}** ({rule.name}): {rule.summary}{link}\n\n{explain(rule)}")
    if not sections:
        return None
    content = types.MarkupContent(types.MarkupKind.Markdown, "\n---\n\n".join(sections))
    return types.Hover(content, ranges[0] if len(ranges) == 1 else None)


def main() -> int:
    server.start_io()
    return 0
