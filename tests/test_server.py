"""End-to-end tests of `dplint server`: a real LSP client (pytest-lsp) drives the server over stdio."""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import pytest

pytest_lsp = pytest.importorskip("pytest_lsp")
from lsprotocol import types  # noqa: E402
from lsprotocol.converters import get_converter  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient  # noqa: E402

from dplint.docs import explain  # noqa: E402
from dplint.engine import StatementTrees  # noqa: E402
from dplint.rules import BY_CODE  # noqa: E402

# One server for the module (starting one costs seconds); each test works in its own project folder.
ASYNC = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SERVER = [sys.executable, "-m", "dplint", "server"]
CRASHING_SERVER = [sys.executable, str(Path(__file__).parent / "server_data" / "crashing_server.py")]
TIMEOUT = 10.0

CAPABILITIES = types.ClientCapabilities(
    workspace=types.WorkspaceClientCapabilities(
        configuration=True,
        did_change_watched_files=types.DidChangeWatchedFilesClientCapabilities(dynamic_registration=True),
    ),
    text_document=types.TextDocumentClientCapabilities(
        code_action=types.CodeActionClientCapabilities(
            code_action_literal_support=types.ClientCodeActionLiteralOptions(
                code_action_kind=types.ClientCodeActionKindOptions(value_set=list(types.CodeActionKind))
            )
        ),
        hover=types.HoverClientCapabilities(content_format=[types.MarkupKind.Markdown]),
        publish_diagnostics=types.PublishDiagnosticsClientCapabilities(version_support=True),
    ),
)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    return tmp_path


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER), scope="module")
async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    await start(lsp_client, tmp_path_factory.mktemp("editor"))
    yield
    await lsp_client.shutdown_session()


async def start(lsp_client: LanguageClient, workspace: Path) -> None:
    registrations: List[types.Registration] = []
    lsp_client.registrations = registrations  # type: ignore[attr-defined]

    @lsp_client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def register(params: types.RegistrationParams) -> None:
        registrations.extend(params.registrations)

    params = types.InitializeParams(
        capabilities=CAPABILITIES,
        root_uri=workspace.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="demo")],
    )
    await asyncio.wait_for(lsp_client.initialize_session(params), TIMEOUT)


# ----- helpers --------------------------------------------------------------------------------------


def write(workspace: Path, name: str, text: str) -> str:
    path = workspace / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path.as_uri()


def open_document(client: LanguageClient, uri: str, text: str, version: int = 1) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", version, text)))


def replace_text(client: LanguageClient, uri: str, text: str, version: int) -> None:
    """A full-text didChange, as a client sends when it cannot send ranges."""
    change = types.TextDocumentContentChangeWholeDocument(text=text)
    document = types.VersionedTextDocumentIdentifier(version, uri)
    client.text_document_did_change(types.DidChangeTextDocumentParams(document, [change]))


async def diagnostics(
    client: LanguageClient, uri: str, until: Callable[[Sequence[types.Diagnostic]], bool] = lambda _: True
) -> Sequence[types.Diagnostic]:
    """The document's diagnostics once they satisfy `until` (the server publishes asynchronously)."""

    async def poll() -> Sequence[types.Diagnostic]:
        while uri not in client.diagnostics or not until(client.diagnostics[uri]):
            await asyncio.sleep(0.01)
        return client.diagnostics[uri]

    return await asyncio.wait_for(poll(), TIMEOUT)


def codes(found: Sequence[types.Diagnostic]) -> List[str]:
    return sorted(str(d.code) for d in found)


def has(*expected: str) -> Callable[[Sequence[types.Diagnostic]], bool]:
    return lambda found: codes(found) == sorted(expected)


def apply_edits(text: str, edits: Sequence[types.TextEdit]) -> str:
    """Apply LSP text edits as a client does: every range refers to the original text, in UTF-16 code units."""
    lines = text.splitlines(keepends=True) + [""]

    def offset(position: types.Position) -> int:
        start = sum(len(line) for line in lines[: position.line])
        units = 0
        for index, char in enumerate(lines[position.line]):
            if units >= position.character:
                return start + index
            units += 2 if ord(char) > 0xFFFF else 1
        return start + len(lines[position.line])

    for begin, end, new_text in sorted(((offset(e.range.start), offset(e.range.end), e.new_text) for e in edits), reverse=True):
        text = text[:begin] + new_text + text[end:]
    return text


async def code_actions(
    client: LanguageClient, uri: str, where: types.Range, only: Optional[List[str]] = None
) -> List[types.CodeAction]:
    params = types.CodeActionParams(
        types.TextDocumentIdentifier(uri), where, types.CodeActionContext(diagnostics=[], only=only)
    )
    return list(await asyncio.wait_for(client.text_document_code_action_async(params), TIMEOUT) or [])


def line_range(line: int) -> types.Range:
    return types.Range(types.Position(line, 0), types.Position(line, 0))


MOVE = 'import torch\n\ndevice = torch.device("cuda")\nx = torch.zeros(3)\nx.to(device)\n'


# ----- diagnostics ----------------------------------------------------------------------------------


@ASYNC
async def test_open_change_and_save_publish_diagnostics(client: LanguageClient, workspace: Path):
    uri = write(workspace, "train.py", MOVE)
    open_document(client, uri, MOVE)
    (found,) = await diagnostics(client, uri, has("DPL101"))
    assert found.range == types.Range(types.Position(4, 0), types.Position(4, 12))
    assert found.severity == types.DiagnosticSeverity.Error
    assert found.source == "dplint"
    # The rule reference installed with dplint: an editor opens it; no web page is assumed to exist.
    assert found.code_description.href == (ROOT / "dplint" / "rules.md").as_uri() + "#dpl101-discarded-tensor-move"
    assert found.data["fix"]["applicability"] == "safe"
    edits = get_converter().structure(found.data["fix"]["edits"], List[types.TextEdit])
    assert apply_edits(MOVE, edits).splitlines()[4] == "x = x.to(device)"

    # An unsaved, incremental edit: assign the move. The finding goes away.
    edit = types.TextDocumentContentChangePartial(range=found.range, text="x = x.to(device)")
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(2, uri), [edit])
    )
    await diagnostics(client, uri, has())

    # Setting CUDA_VISIBLE_DEVICES after `import torch` is a warning (DPL202), shown on save too.
    late = 'import os\nimport torch\n\nos.environ["CUDA_VISIBLE_DEVICES"] = "1"\n'
    replace_text(client, uri, late, 3)
    client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri)))
    (found,) = await diagnostics(client, uri, has("DPL202"))
    assert found.severity == types.DiagnosticSeverity.Warning
    assert found.range.start.line == 3


@ASYNC
async def test_positions_are_utf16_code_units_after_non_ascii(client: LanguageClient, workspace: Path):
    text = 'import torch\n\nlabel, y = "é😀", torch.ones(2, device="cuda: 0")\n'
    uri = write(workspace, "emoji.py", text)
    open_document(client, uri, text)
    (found,) = await diagnostics(client, uri, has("DPL102"))
    code_points = text.splitlines()[2].index('"cuda: 0"')
    assert found.range.start == types.Position(2, code_points + 1)  # 😀 is two UTF-16 code units
    assert found.range.end == types.Position(2, code_points + 1 + len('"cuda: 0"'))

    actions = await code_actions(client, uri, found.range, only=[types.CodeActionKind.QuickFix])
    fix = next(a for a in actions if not a.title.startswith("Disable"))
    assert apply_edits(text, fix.edit.changes[uri]) == text.replace('"cuda: 0"', '"cuda:0"')


@ASYNC
async def test_syntax_error_is_a_dpl000_diagnostic_and_the_server_stays_up(client: LanguageClient, workspace: Path):
    broken = "import torch\n\ndef f(:\n    x.to(device)\n"
    uri = write(workspace, "broken.py", broken)
    open_document(client, uri, broken)
    (found,) = await diagnostics(client, uri, has("DPL000"))
    assert found.range.start.line == 2
    assert "syntax error" in found.message

    replace_text(client, uri, MOVE, 2)  # the same server lints the repaired text
    await diagnostics(client, uri, has("DPL101"))


@ASYNC
async def test_internal_error_is_logged_and_keeps_the_last_diagnostics(workspace: Path):
    config = ClientServerConfig(server_command=CRASHING_SERVER)
    client = await config.start()
    try:
        await start(client, workspace)
        uri = write(workspace, "train.py", MOVE)
        open_document(client, uri, MOVE)
        await diagnostics(client, uri, has("DPL101"))

        crashing = MOVE + "CRASH_DPLINT = True\n"  # the test server's DPL101 raises on this text
        replace_text(client, uri, crashing, 2)

        async def logged() -> str:
            while not any("internal error in rule DPL101" in m.message for m in client.log_messages):
                await asyncio.sleep(0.01)
            return next(m.message for m in client.log_messages if "internal error in rule DPL101" in m.message)

        message = await asyncio.wait_for(logged(), TIMEOUT)
        assert "RuntimeError: a rule that crashes" in message
        assert codes(client.diagnostics[uri]) == ["DPL101"]  # the last diagnostics stay

        replace_text(client, uri, "import torch\n", 3)  # the server is still working
        await diagnostics(client, uri, has())
        await asyncio.wait_for(client.shutdown_session(), TIMEOUT)
    finally:
        await client.stop()


# ----- code actions ---------------------------------------------------------------------------------


@ASYNC
async def test_fix_all_gives_the_fixed_fixture(client: LanguageClient, workspace: Path):
    text = (FIXTURES / "discarded_move.py").read_text()
    uri = write(workspace, "discarded_move.py", text)
    open_document(client, uri, text)
    await diagnostics(client, uri, lambda found: len(found) > 0)

    actions = await code_actions(client, uri, line_range(0), only=["source.fixAll"])
    (action,) = actions
    assert action.kind == "source.fixAll.dplint"
    assert apply_edits(text, action.edit.changes[uri]) == (FIXTURES / "discarded_move.fixed.py").read_text()


@ASYNC
async def test_quick_fix_and_disable_for_this_line(client: LanguageClient, workspace: Path):
    text = MOVE.replace("x.to(device)\n", 'x.to(device)\ny = torch.ones(2, device="cuda: 0")  # noqa: DPL202\n')
    uri = write(workspace, "train.py", text)
    open_document(client, uri, text)
    await diagnostics(client, uri, has("DPL101", "DPL102"))

    actions = await code_actions(client, uri, line_range(4), only=[types.CodeActionKind.QuickFix])
    titles = [a.title for a in actions]
    fix = next(a for a in actions if "DPL101" in a.title and not a.title.startswith("Disable"))
    assert fix.diagnostics[0].code == "DPL101"
    assert apply_edits(text, fix.edit.changes[uri]).splitlines()[4] == "x = x.to(device)"
    assert "Disable DPL101 for this line" in titles
    assert all("DPL102" not in title for title in titles)  # only the findings in the requested range

    disable = next(a for a in actions if a.title == "Disable DPL101 for this line")
    silenced = apply_edits(text, disable.edit.changes[uri])
    assert silenced.splitlines()[4] == "x.to(device)  # noqa: DPL101"

    # An existing `# noqa: CODES` is extended rather than doubled.
    (dpl102,) = [d for d in client.diagnostics[uri] if d.code == "DPL102"]
    actions = await code_actions(client, uri, dpl102.range, only=[types.CodeActionKind.QuickFix])
    disable = next(a for a in actions if a.title == "Disable DPL102 for this line")
    assert apply_edits(text, disable.edit.changes[uri]).splitlines()[5].endswith("# noqa: DPL202, DPL102")

    replace_text(client, uri, silenced, 2)
    await diagnostics(client, uri, has("DPL102"))


@ASYNC
async def test_unsafe_fix_is_labelled_and_not_preferred(client: LanguageClient, workspace: Path):
    text = 'import torch\n\nx = torch.zeros(1, device="gpu")\n'
    uri = write(workspace, "train.py", text)
    open_document(client, uri, text)
    (found,) = await diagnostics(client, uri, has("DPL102"))
    assert found.data["fix"]["applicability"] == "unsafe"
    actions = await code_actions(client, uri, found.range, only=[types.CodeActionKind.QuickFix])
    (fix,) = [a for a in actions if not a.title.startswith("Disable")]
    assert fix.title.endswith("(unsafe)") and not fix.is_preferred
    assert apply_edits(text, fix.edit.changes[uri]) == text.replace('"gpu"', '"cuda"')
    assert await code_actions(client, uri, found.range, only=["source.fixAll"]) == []  # --fix leaves unsafe fixes alone


# The realistic training scripts of tests/test_fixes.py, each with one finding that a fix addresses.
FIX_SCRIPTS = sorted(p for p in (Path(__file__).parent / "fix_scripts").glob("*.py") if not p.name.endswith(".fixed.py"))


@ASYNC
@pytest.mark.parametrize("script", FIX_SCRIPTS, ids=lambda p: p.stem)
async def test_quick_fix_offers_the_same_edit_as_the_cli(client: LanguageClient, workspace: Path, script: Path):
    """The code action of each distributed rule's fix gives what `--fix --unsafe-fixes` gives (the
    `.fixed.py` beside the script, checked through the CLI by tests/test_fixes.py)."""
    code = script.name.split("_")[0].upper()
    (workspace / "pyproject.toml").write_text("[tool.dplint]\npreview = true\n")  # DPL506 is a preview rule
    text = script.read_text()
    uri = write(workspace, "train.py", text)
    open_document(client, uri, text)
    found = await diagnostics(client, uri, lambda found: code in codes(found))
    (diagnostic,) = [d for d in found if d.code == code]
    actions = await code_actions(client, uri, diagnostic.range, only=[types.CodeActionKind.QuickFix])
    (fix,) = [a for a in actions if code in a.title and not a.title.startswith("Disable")]
    unsafe = diagnostic.data["fix"]["applicability"] == "unsafe"
    assert fix.title.endswith("(unsafe)") == unsafe and fix.is_preferred == (not unsafe)
    assert apply_edits(text, fix.edit.changes[uri]) == script.with_name(script.stem + ".fixed.py").read_text()


@pytest.mark.parametrize(
    "text, expected",
    [
        # inside brackets: the finding's own line takes the comment
        ('import torch\ny = torch.ones(\n    2, device="cuda: 0"\n)\n', '    2, device="cuda: 0"  # noqa: DPL102'),
        # the line ends inside a string or after a backslash: no line can take a comment, so no action
        ('import torch\ny = torch.ones(2, device="cuda: 0"), """\ndoc\n"""\n', None),
        ('import torch\ny = torch.ones(2, device="cuda: 0") + \\\n    1\n', None),
    ],
)
def test_disable_for_this_line_only_where_a_comment_can_go(text: str, expected: Optional[str]):
    from pygls.workspace.position_codec import PositionCodec

    from dplint.api import lint_source
    from dplint.server.convert import Converter

    (finding,) = lint_source(text, "train.py")
    edit = Converter(text, PositionCodec()).noqa_edit(finding)
    if expected is None:
        assert edit is None
        return
    silenced = apply_edits(text, [edit])
    assert expected in silenced.splitlines()
    assert lint_source(silenced, "train.py") == []


# ----- hover ----------------------------------------------------------------------------------------


@ASYNC
async def test_hover_on_a_diagnostic_shows_the_rule_docs(client: LanguageClient, workspace: Path):
    uri = write(workspace, "train.py", MOVE)
    open_document(client, uri, MOVE)
    (found,) = await diagnostics(client, uri, has("DPL101"))

    params = types.HoverParams(types.TextDocumentIdentifier(uri), types.Position(4, 3))
    result = await asyncio.wait_for(client.text_document_hover_async(params), TIMEOUT)
    rule = BY_CODE["DPL101"]
    assert result.contents.kind == types.MarkupKind.Markdown
    assert rule.summary in result.contents.value
    assert found.code_description.href in result.contents.value
    assert explain(rule) in result.contents.value  # the same text as `dplint --explain DPL101`
    assert result.range == found.range

    elsewhere = types.HoverParams(types.TextDocumentIdentifier(uri), types.Position(0, 2))
    assert await asyncio.wait_for(client.text_document_hover_async(elsewhere), TIMEOUT) is None


# ----- configuration --------------------------------------------------------------------------------


@ASYNC
async def test_pyproject_is_reread_when_it_changes(client: LanguageClient, workspace: Path):
    pyproject = workspace / "pyproject.toml"
    pyproject.write_text('[tool.dplint]\nignore = ["DPL101"]\n')
    uri = write(workspace, "train.py", MOVE)
    open_document(client, uri, MOVE)
    assert codes(await diagnostics(client, uri)) == []

    (watched,) = [r for r in client.registrations if r.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES]
    assert "**/pyproject.toml" in [w["globPattern"] for w in watched.register_options["watchers"]]
    pyproject.write_text("[tool.dplint]\n")
    change = types.FileEvent(pyproject.as_uri(), types.FileChangeType.Changed)
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams([change]))
    await diagnostics(client, uri, has("DPL101"))


@ASYNC
async def test_preview_in_pyproject_runs_the_preview_rules(client: LanguageClient, workspace: Path):
    text = "import torch\nmodel = torch.nn.parallel.DistributedDataParallel(torch.nn.DataParallel(net).cuda())\n"  # DPL514: preview
    uri = write(workspace, "late.py", text)
    open_document(client, uri, text)
    assert codes(await diagnostics(client, uri)) == []

    (workspace / "pyproject.toml").write_text("[tool.dplint]\npreview = true\n")
    change = types.FileEvent((workspace / "pyproject.toml").as_uri(), types.FileChangeType.Changed)
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams([change]))
    await diagnostics(client, uri, has("DPL514"))


@ASYNC
async def test_client_settings_override_pyproject(client: LanguageClient, workspace: Path):
    (workspace / "pyproject.toml").write_text('[tool.dplint]\nselect = ["DPL101"]\n')
    text = MOVE + 'y = torch.ones(2, device="cuda: 0")\n'
    uri = write(workspace, "train.py", text)
    open_document(client, uri, text)
    await diagnostics(client, uri, has("DPL101"))
    try:
        client.set_configuration({"select": ["DPL1"], "ignore": ["DPL101"]}, section="dplint")
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
        await diagnostics(client, uri, has("DPL102"))

        # An unknown code is reported to the user; the file is still linted, with the pyproject settings.
        client.set_configuration({"select": ["DPL999"]}, section="dplint")
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
        await diagnostics(client, uri, has("DPL101"))
        assert any("DPL999" in m.message and m.type == types.MessageType.Error for m in client.messages)
    finally:
        client.set_configuration({}, section="dplint")
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))


# ----- project facts across files ------------------------------------------------------------------


@ASYNC
async def test_unsaved_edit_of_the_wrapping_file_clears_dpl301(client: LanguageClient, workspace: Path):
    model = (FIXTURES / "crnn_model.py").read_text()
    train = (FIXTURES / "crnn_train.py").read_text().replace("from crnn_model import", "from models.crnn import")
    write(workspace, "models/__init__.py", "")
    model_uri = write(workspace, "models/crnn.py", model)
    train_uri = write(workspace, "train.py", train)

    open_document(client, model_uri, model)
    (found,) = await diagnostics(client, model_uri, has("DPL301"))
    assert "train.py:15" in found.message

    wrap = "    model = nn.DataParallel(model)"
    assert wrap in train
    open_document(client, train_uri, train)
    replace_text(client, train_uri, train.replace(wrap, "    pass"), 2)  # unsaved: the disk still wraps
    await diagnostics(client, model_uri, has())

    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(train_uri)))
    await diagnostics(client, model_uri, has("DPL301"))  # closed unsaved: the file on disk counts again

    (workspace / "train.py").write_text(train.replace(wrap, "    pass"))
    change = types.FileEvent(train_uri, types.FileChangeType.Changed)
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams([change]))
    await diagnostics(client, model_uri, has())


# ----- lifecycle -----------------------------------------------------------------------------------


@ASYNC
async def test_initialize_negotiates_settings_and_encoding_and_shutdown_exits_cleanly(workspace: Path):
    client = await ClientServerConfig(server_command=SERVER).start()
    try:
        capabilities = types.ClientCapabilities(general=types.GeneralClientCapabilities(position_encodings=["utf-32"]))
        params = types.InitializeParams(
            capabilities=capabilities,
            root_uri=workspace.as_uri(),
            initialization_options={"dplint": {"ignore": ["DPL101"]}},
        )
        result = await asyncio.wait_for(client.initialize_session(params), TIMEOUT)
        assert result.server_info.name == "dplint"
        assert result.capabilities.position_encoding == types.PositionEncodingKind.Utf32
        assert result.capabilities.hover_provider
        assert "source.fixAll.dplint" in result.capabilities.code_action_provider.code_action_kinds
        assert result.capabilities.text_document_sync.save

        text = 'import torch\n\nlabel, y = "é😀", torch.ones(2, device="cuda: 0")\nx = torch.zeros(1)\nx.to("cuda")\n'
        uri = write(workspace, "emoji.py", text)
        open_document(client, uri, text)
        (found,) = await diagnostics(client, uri, has("DPL102"))  # DPL101 ignored by initializationOptions
        assert found.range.start.character == text.splitlines()[2].index('"cuda: 0"')  # code points, as negotiated

        await asyncio.wait_for(client.shutdown_session(), TIMEOUT)
        assert client._server.returncode == 0
    finally:
        await client.stop()


@ASYNC
async def test_cli_without_the_server_extra_says_how_to_install(tmp_path: Path):
    (tmp_path / "pygls.py").write_text("raise ModuleNotFoundError('No module named pygls', name='pygls')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    process = await asyncio.create_subprocess_exec(*SERVER, stderr=asyncio.subprocess.PIPE, env=env)
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "pip install 'dplint[server]'" in stderr.decode()


# ----- an edit re-parses only the statements it touched ---------------------------------------------


def _lint_kept(path: Path, text: str, statements: Optional[StatementTrees]):
    """`check_file` with every rule, as the server calls it, with or without the document's kept trees."""
    from dplint.analysis.facts import ProjectFacts, collect_file_facts
    from dplint.api import default_settings
    from dplint.engine import SourceFile, check_file
    from dplint.rules import CHECKS

    source = SourceFile(str(path), path.name, path.stem, "")
    facts = collect_file_facts(text, source.module_name, source.package, source.path, source.filename)
    project = ProjectFacts.build([facts] if facts is not None else [])
    return check_file(source, text, default_settings([rule.code for rule in CHECKS]), project, facts, statements)


def _edited(text: str, rnd: random.Random) -> str:
    """An editor's change to one line: a line inserted before it (at its indentation), or it deleted,
    duplicated (a repeated statement: each place needs its own nodes) or changed."""
    lines = text.splitlines(keepends=True) or ["\n"]
    index = rnd.randrange(len(lines))
    line = lines[index]
    indentation = line[: len(line) - len(line.lstrip(" \t"))]
    kind = rnd.randrange(4)
    if kind == 0:
        lines.insert(index, indentation + rnd.choice(["", "# note", "x.cuda()", "x = torch.zeros(1)", "pass"]) + "\n")
    elif kind == 1:
        del lines[index]
    elif kind == 2:
        lines.insert(index, line)
    else:
        lines[index] = line.rstrip("\n") + "  # edited\n"
    return "".join(lines)


@pytest.mark.parametrize("path", sorted(FIXTURES.rglob("*.py")), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_findings_from_kept_statement_trees_equal_a_whole_parse_after_random_edits(path: Path):
    import ast

    rnd = random.Random(path.name)
    statements = StatementTrees()
    text = path.read_text(encoding="utf-8")
    valid = 0
    for _ in range(6):
        assert _lint_kept(path, text, statements) == _lint_kept(path, text, None)
        candidate = _edited(text, rnd)
        try:
            ast.parse(candidate)
        except SyntaxError:  # linted once more (the kept trees must survive it), then the edit is undone
            assert _lint_kept(path, candidate, statements) == _lint_kept(path, candidate, None)
            continue
        text = candidate
        valid += 1
    assert valid >= 2  # the edits were not all undone: the comparison ran on edited text


def test_an_edit_reparses_only_the_statement_it_touched(monkeypatch):
    import ast

    import libcst

    text = "import torch\n\n\ndef f(x):\n    return x\n\n\ndef g(x):\n    return x.cuda()\n"
    statements = StatementTrees()
    statements.module(text, ast.parse(text))
    parsed: List[str] = []
    parse_module = libcst.parse_module
    monkeypatch.setattr(libcst, "parse_module", lambda source: parsed.append(source) or parse_module(source))
    edited = text.replace("return x\n", "return x + 1\n")
    module = statements.module(edited, ast.parse(edited))
    assert parsed == ["def f(x):\n    return x + 1\n\n\n"]
    assert module.code == edited and module.deep_equals(libcst.parse_module(edited))


def test_repeated_statements_keep_their_own_findings(tmp_path: Path):
    """The same text twice is parsed twice: shared nodes would place both findings on the first line."""
    statements = StatementTrees()
    text = "import torch\nx = torch.zeros(1)\nx.cuda()\nx.cuda()\n"
    for version in (text, text + "x.cuda()\n"):
        result = _lint_kept(tmp_path / "repeated.py", version, statements)
        assert [(f.code, f.location.row) for f in result.findings] == [("DPL101", row) for row in range(3, version.count("\n") + 1)]
