"""The engine through its Python API: project facts across files, caching, parallel runs, packaging."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path

import libcst as cst
import pytest

from dplint import lint_paths, lint_source
from dplint.config import resolve_settings

ROOT = Path(__file__).resolve().parent.parent

CRNN = """
import torch.nn as nn

class CRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(64, 32)

    def forward(self, images):
        features = images.squeeze(2).permute(2, 0, 1)
        output, _ = self.rnn(features)
        return output
"""
TRAIN = """
import torch.nn as nn
from models.crnn import CRNN

model = nn.DataParallel(CRNN(){dim})
"""


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def lint(root: Path, **kwargs):
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return lint_paths(["."], resolve_settings(root, {}), **kwargs)
    finally:
        os.chdir(cwd)


def codes(result):
    return [(f.path, f.location.row, f.code) for f in result.findings]


def test_wrap_in_one_file_makes_the_forward_of_another_file_a_finding(tmp_path):
    write(tmp_path, "models/__init__.py", "")
    write(tmp_path, "models/crnn.py", CRNN)
    write(tmp_path, "train.py", TRAIN.format(dim=""))
    assert codes(lint(tmp_path, cache=False)) == [(os.path.join("models", "crnn.py"), 10, "DPL301")]
    write(tmp_path, "train.py", TRAIN.format(dim=", dim=1"))
    assert codes(lint(tmp_path, cache=False)) == []


def test_cache_reuses_results_and_is_invalidated_by_project_facts(tmp_path):
    write(tmp_path, "models/__init__.py", "")
    write(tmp_path, "models/crnn.py", CRNN)
    train = write(tmp_path, "train.py", TRAIN.format(dim=""))
    first = lint(tmp_path)
    assert first.parsed == 3 and len(first.findings) == 1
    second = lint(tmp_path)
    assert second.parsed == 0 and codes(second) == codes(first)
    assert (tmp_path / ".dplint_cache" / ".gitignore").read_text().strip().endswith("*")

    # Editing train.py changes which classes are wrapped: crnn.py must be re-checked, not served stale.
    train.write_text(textwrap.dedent(TRAIN.format(dim=", dim=1")))
    os.utime(train, ns=(1, 1))
    third = lint(tmp_path)
    assert third.parsed == 3 and codes(third) == []


def test_turning_preview_on_does_not_reuse_the_cached_results(tmp_path):
    write(tmp_path, "wrap.py", "import torch\nmodel = torch.nn.parallel.DistributedDataParallel(torch.nn.DataParallel(net).cuda())\n")
    assert lint(tmp_path).findings == []  # DPL514 is a preview rule
    write(tmp_path, "pyproject.toml", "[tool.dplint]\npreview = true\n")
    result = lint(tmp_path)
    assert result.parsed == 1 and codes(result) == [("wrap.py", 2, "DPL514")]


def test_cache_rechecks_only_a_changed_file(tmp_path):
    for index in range(5):
        write(tmp_path, f"m{index}.py", "import torch\nx = torch.zeros(3)\nx.cpu()\n")
    lint(tmp_path)
    changed = write(tmp_path, "m3.py", "import torch\nx = torch.zeros(3)\nx = x.cpu()\n")
    os.utime(changed, ns=(2, 2))
    result = lint(tmp_path)
    assert result.parsed == 1
    assert [f.path for f in result.findings] == ["m0.py", "m1.py", "m2.py", "m4.py"]


def test_cache_written_by_other_dplint_sources_is_not_reused(tmp_path, monkeypatch):
    # An install from a clone keeps its version number through a `git pull`: the new rules must not
    # be served the old rules' findings.
    write(tmp_path, "m.py", "import torch\nx = torch.zeros(3)\nx.cpu()\n")
    assert lint(tmp_path).parsed == 1
    assert lint(tmp_path).parsed == 0
    monkeypatch.setattr("dplint.cache.code_stamp", lambda: "the sources after a git pull")
    assert lint(tmp_path).parsed == 1


def test_code_stamp_follows_the_rule_sources():
    from dplint.cache import code_stamp
    from dplint.rules.discarded_tensor_move import DiscardedTensorMove

    rule_file = Path(inspect.getfile(DiscardedTensorMove))
    before, stat = code_stamp(), rule_file.stat()
    try:
        os.utime(rule_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
        assert code_stamp() != before
    finally:
        os.utime(rule_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert code_stamp() == before


def test_a_run_answered_from_the_cache_imports_neither_the_rules_nor_libcst(tmp_path):
    write(tmp_path, "m.py", "import torch\nx = torch.zeros(3)\nx.cpu()\n")
    program = (
        "import sys; from dplint.cli import main; code = main(['--exit-zero', '-q', '.']); "
        "print(sorted(m for m in sys.modules if m == 'libcst' or m.startswith('dplint.rules')))"
    )
    first = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True)
    second = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True)
    assert "'libcst'" in first.stdout and "DPL101" in first.stdout, first.stderr
    assert second.stdout == first.stdout.replace(first.stdout.splitlines()[-1], "[]"), second.stderr


def test_libcst_parses_only_files_whose_code_has_what_a_rule_needs(tmp_path, monkeypatch):
    import dplint.engine as engine

    parsed = []
    parse_libcst = engine.parse_libcst
    monkeypatch.setattr(engine, "parse_libcst", lambda text, tree: parsed.append(text) or parse_libcst(text, tree))
    # DPL101's text trigger matches a docstring's example and a continuation line; the outline sees
    # that neither is a statement. Likewise a condition only in a comment for DPL507.
    write(tmp_path, "docs.py", 'import torch\n"""Move it:\n    x.cuda()\n"""\ny = f(\n    x.cuda(),\n)\n')
    write(tmp_path, "barrier.py", "import torch.distributed as dist\n# if rank == 0: dist.barrier() would hang\ndist.barrier()\n")
    write(tmp_path, "pyproject.toml", "[tool.dplint]\npreview = true\n")  # DPL507 is a preview rule
    write(tmp_path, "real.py", "import torch\nx = torch.zeros(3)\nx.cuda()\n")
    result = lint(tmp_path, cache=False, jobs=1)
    assert codes(result) == [("real.py", 3, "DPL101")]
    assert parsed == [(tmp_path / "real.py").read_text()]


def test_the_outline_keeps_every_rank_condition_the_rule_recognises(tmp_path):
    # `is_main` holds a test on the rank (its value, not its name, makes it one); the outline must
    # not drop the file for the comment's sake.
    write(tmp_path, "save.py", "import torch.distributed as dist\n# if rank 0: save\nis_main = dist.get_rank() == 0\nif is_main:\n    dist.barrier()\n")
    write(tmp_path, "pyproject.toml", "[tool.dplint]\npreview = true\n")  # DPL507 is a preview rule
    assert codes(lint(tmp_path, cache=False, jobs=1)) == [("save.py", 5, "DPL507")]


def test_parallel_run_gives_the_serial_findings(tmp_path):
    for index in range(60):
        body = "import torch\nx = torch.zeros(3)\n" + ("x.cuda()\n" if index % 3 == 0 else "x = x.cuda()\n")
        write(tmp_path, f"pkg{index % 4}/mod{index}.py", body)
    serial = lint(tmp_path, jobs=1, cache=False)
    parallel = lint(tmp_path, jobs=2, cache=False)
    assert len(serial.findings) == 20
    assert codes(parallel) == codes(serial)


def test_project_module_that_imports_torch_counts_as_a_torch_import(tmp_path):
    write(tmp_path, "pkg/__init__.py", "from .layers import Block\n")
    write(tmp_path, "pkg/layers.py", "import torch.nn as nn\nBlock = nn.Linear\n")
    write(tmp_path, "main.py", "import os\nimport pkg\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n")
    write(tmp_path, "other.py", "import os\nimport json\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n")
    [finding] = lint(tmp_path, cache=False).findings
    assert (finding.path, finding.code) == ("main.py", "DPL202")
    assert "`import pkg` on line 2, which imports torch" in finding.message


def test_lint_source_api():
    [finding] = lint_source("import torch\nt = torch.ones(2)\nt.cuda()\n", "snippet.py")
    assert finding.code == "DPL101" and finding.path == "snippet.py"
    assert lint_source("import torch\nt = torch.ones(2)\nt.cuda()\n", select=["DPL301"]) == []


def test_static_linter_never_imports_torch(tmp_path):
    write(tmp_path, "a.py", "import torch\nx = torch.zeros(3)\nx.cpu()\n")
    probe = "import sys, dplint.cli; code = dplint.cli.main(['--no-cache', 'a.py']); assert 'torch' not in sys.modules; sys.exit(code)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1, result.stderr


def test_wheel_installs_rules_as_a_subpackage_only(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {build.stderr.strip().splitlines()[-1:]}")
    [wheel] = tmp_path.glob("dplint-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"dplint"}
    assert "dplint/rules/__init__.py" in names and "dplint/rules/batch_dim_moved.py" in names


@pytest.mark.parametrize("package", ["dplint", "rules"])
def test_every_source_compiles_without_warnings(package):
    # A compile-time warning (an invalid escape such as "\\w" in a docstring) shows only where no bytecode
    # is cached yet, as on a fresh install; Python 3.12 makes it a SyntaxWarning, on the way to an error.
    for source in sorted((ROOT / package).rglob("*.py")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(source.read_text(encoding="utf-8"), str(source), "exec")


def test_installed_package_resolves_rules_from_anywhere(tmp_path):
    probe = "import importlib.util, dplint.rules; print(importlib.util.find_spec('rules')); print(dplint.rules.BY_CODE['DPL101'].code)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert result.stdout.split() == ["None", "DPL101"], result.stderr


MOVED = """
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x.transpose(0, 1)
"""


def test_same_class_name_in_two_experiments_is_not_confused(tmp_path):
    write(tmp_path, "exp1/model.py", MOVED)
    write(tmp_path, "exp1/train.py", "import torch.nn as nn\nfrom model import Model\nnet = nn.DataParallel(Model())\n")
    write(tmp_path, "exp2/model.py", MOVED)  # never wrapped
    write(tmp_path, "exp2/train.py", "from model import Model\nnet = Model()\n")
    write(tmp_path, "exp3/net.py", MOVED + "\nmodel = nn.DataParallel(Model())\n")  # wrapped where it is defined
    assert [(f.path, f.code) for f in lint(tmp_path, cache=False).findings] == [
        (os.path.join("exp1", "model.py"), "DPL301"),
        (os.path.join("exp3", "net.py"), "DPL301"),
    ]


def test_wrapped_class_resolved_through_package_reexports_and_relative_imports(tmp_path):
    write(tmp_path, "proj/__init__.py", "")
    write(tmp_path, "proj/models/__init__.py", "from .crnn import CRNN\n")
    write(tmp_path, "proj/models/crnn.py", CRNN)
    write(tmp_path, "proj/train.py", "import torch.nn as nn\nfrom .models import CRNN\nmodel = nn.DataParallel(CRNN())\n")
    write(tmp_path, "proj/other/crnn.py", CRNN)  # same name, another package, never imported by the wrapper
    assert [(f.path, f.code) for f in lint(tmp_path, cache=False).findings] == [
        (os.path.join("proj", "models", "crnn.py"), "DPL301")
    ]


def test_relative_imports_resolve_against_the_package():
    from dplint.analysis.modules import absolute_module

    assert absolute_module("pkg.sub", 0, "torch") == "torch"
    assert absolute_module("pkg.sub", 1, "models") == "pkg.sub.models"
    assert absolute_module("pkg.sub", 2, "") == "pkg"
    assert absolute_module("a.b", 4, "m") == "m"  # more dots than packages: nothing left to climb


class _CallsInVisitOrder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list = []

    def visit_Call(self, node) -> None:
        self.calls.append(node)


CALL_ORDER_CASES = '''
@register(name())
class Model(Base(), metaclass=meta()):
    def forward(self, a, /, b=default(), *rest, c=option(), **extra) -> result():
        x = first() if test() else third()
        y = [item(v) for v in source() if keep(v)]
        z = lambda: inside()
        match pick():
            case {"k": 1}:
                return {key(): value() for _ in ranges()}
        return outer(inner(deep()), other=kw())[index()].method()
'''


MATCH_AND_EXCEPT_CASES = '''
async def run(a=f(), *, b: g() = h()) -> k():
    try:
        value = table[lo():hi():step()]
    except (first(), second()) as error:
        handle(error)
    match request():
        case {"k": kind} if guard(kind):
            act(key=value(), **extra())
    from .. import parent
    if ready(): go(); stop()
'''


@pytest.mark.parametrize("source", [CALL_ORDER_CASES] + sorted(str(p) for p in (ROOT / "fixtures").rglob("*.py")))
def test_iter_calls_finds_the_calls_a_libcst_visitor_finds_in_the_same_order(source: str) -> None:
    """`iter_calls` reads node fields instead of visiting (for speed); it must see what the visitor sees."""
    from dplint.analysis.names import iter_calls

    text = Path(source).read_text() if source.endswith(".py") else source
    module = cst.parse_module(text)
    visitor = _CallsInVisitOrder()
    module.visit(visitor)
    found = list(iter_calls(module))
    assert [module.code_for_node(c) for c in found] == [module.code_for_node(c) for c in visitor.calls]
    assert all(a is b for a, b in zip(found, visitor.calls))
    assert source != CALL_ORDER_CASES or len(found) == 24


_RECORDED = ("Module", "FunctionDef", "ClassDef", "If", "IfExp", "For", "While", "With", "Try", "Match", "Call", "Attribute",
             "Name", "Assign", "AugAssign", "AnnAssign", "BinaryOperation", "Subscript", "SimpleString", "Return",
             "Import", "ImportFrom", "Arg", "Param", "Decorator", "ListComp", "DictComp")


class _Recorder(cst.CSTVisitor):
    """Records each visit and leave of the node kinds the rules' visitors read; skips what a lambda holds."""

    def __init__(self) -> None:
        self.events: list = []

    def on_visit(self, node) -> bool:
        if type(node).__name__ in _RECORDED:
            self.events.append(("visit", node))
        return super().on_visit(node)

    def on_leave(self, original_node) -> None:
        if type(original_node).__name__ in _RECORDED:
            self.events.append(("leave", original_node))

    def visit_Lambda(self, node) -> bool:
        return False


@pytest.mark.parametrize("source", [CALL_ORDER_CASES, MATCH_AND_EXCEPT_CASES] + sorted(str(p) for p in (ROOT / "fixtures").rglob("*.py")))
def test_run_visitor_calls_a_visitor_as_libcsts_visit_does(source: str) -> None:
    """`run_visitor` walks node fields instead of letting libcst rebuild every node (for speed)."""
    from dplint.analysis.names import run_visitor

    text = Path(source).read_text() if source.endswith(".py") else source
    module = cst.parse_module(text)
    by_libcst, by_fields = _Recorder(), _Recorder()
    module.visit(by_libcst)
    run_visitor(module, by_fields)
    assert [(event, type(node).__name__) for event, node in by_fields.events] == [
        (event, type(node).__name__) for event, node in by_libcst.events
    ]
    assert all(a[1] is b[1] for a, b in zip(by_fields.events, by_libcst.events))
    assert len(by_fields.events) > 20 or source.endswith(".py")


class _ChildrenInVisitOrder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.open: list = []
        self.children: dict = {}

    def on_visit(self, node) -> bool:
        if self.open:
            self.children.setdefault(id(self.open[-1]), []).append(node)
        self.open.append(node)
        return True

    def on_leave(self, original_node) -> None:
        self.open.pop()


@pytest.mark.parametrize("source", [CALL_ORDER_CASES, MATCH_AND_EXCEPT_CASES] + sorted(str(p) for p in (ROOT / "fixtures").rglob("*.py")))
def test_child_nodes_are_the_children_libcst_visits_in_its_order(source: str) -> None:
    from dplint.analysis.names import child_nodes

    text = Path(source).read_text() if source.endswith(".py") else source
    module = cst.parse_module(text)
    visitor = _ChildrenInVisitOrder()
    module.visit(visitor)
    for parent_id, visited in visitor.children.items():
        parent = next(node for node in [module, *(c for cs in visitor.children.values() for c in cs)] if id(node) == parent_id)
        mine = child_nodes(parent)
        assert all(any(child is seen for seen in visited) for child in mine), type(parent).__name__
        assert [id(c) for c in visited if any(c is child for child in mine)] == [id(c) for c in mine], type(parent).__name__


@pytest.mark.parametrize("fixture", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fixtures").glob("*.py")))
def test_positions_equal_libcsts_metadata_wrapper(fixture: str) -> None:
    """Findings are located by `positions_of`, a shortcut through libcst's PositionProvider."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    from dplint.analysis.context import positions_of

    module = cst.parse_module((ROOT / fixture).read_text())
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    found = positions_of(module)
    assert type(found).__name__ == "_Positions", "the fast path fell back to MetadataWrapper"
    assert len(found) == len(expected) > 0
    assert all(found[node] == position for node, position in expected.items())


@pytest.mark.parametrize("fixture", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fixtures").glob("*.py")))
def test_trees_built_without_validation_equal_validated_ones(fixture: str) -> None:
    from dplint.engine import parse

    text = (ROOT / fixture).read_text()
    assert parse(text).deep_equals(cst.parse_module(text))


def test_libcst_validates_hand_built_nodes_again_after_a_parse() -> None:
    from dplint.engine import parse

    parse("x = 1\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("")


def test_checking_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path) -> None:
    import gc

    source = tmp_path / "train.py"
    source.write_text("import torch\nx = torch.zeros(3)\nx.cuda()\n")
    enabled = gc.isenabled()
    try:
        gc.enable()
        assert [f.code for f in lint_paths([source], cache=False, jobs=1).findings] == ["DPL101"]
        assert gc.isenabled()
        gc.disable()
        lint_paths([source], cache=False, jobs=1)
        assert not gc.isenabled()
    finally:
        (gc.enable if enabled else gc.disable)()
