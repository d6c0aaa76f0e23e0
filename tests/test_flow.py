"""Flow-sensitive kinds: what a name holds at each point of its function, and what functions return.

Each source below marks its probes with a bare name on its own line (`h`): the probe's kind is the
kind of that name at that point, or "unreachable" when no path reaches the probe.
"""

from __future__ import annotations

import textwrap
from typing import List, Tuple

import libcst as cst
import pytest

from dplint import lint_source
from dplint.api import lint_paths
from dplint.analysis.context import FileContext
from dplint.analysis.facts import ProjectFacts, collect_file_facts
from dplint.analysis.inference import Inference

T, L, D, M, O, X = "tensor", "tensor list", "tensor dict", "module", "other", "unreachable"


def probes(source: str, project: ProjectFacts = ProjectFacts()) -> List[Tuple[int, str]]:
    text = textwrap.dedent(source)
    module = cst.parse_module(text)
    ctx = FileContext(path="t.py", filename="t.py", source=text, module=module, project=project, module_name="t", package="")
    inference = Inference.of(ctx)
    found = []
    for line, scope in inference.statements:
        for small in line.body:
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Name):
                reachable = inference.reachable(small, scope)
                found.append((ctx.line(small), inference.kind(small.value, scope).value if reachable else X))
    return found


def kinds(source: str) -> List[str]:
    return [kind for _, kind in probes(source)]


def test_a_rebinding_hides_only_what_comes_after_it():
    assert kinds(
        """
        import torch
        def decode(self, x):
            h = torch.zeros(1, 2, 8)
            h
            h = self.decoder(x, h)
            h
        """
    ) == [T, O]


def test_branches_join_where_they_meet():
    assert kinds(
        """
        import torch
        def f(c, g):
            x = torch.zeros(1)
            if c:
                x = g
                x
            x
            if c:
                y = torch.ones(1)
            elif g:
                y = torch.zeros(2)
            else:
                y = torch.eye(2)
            y
        """
    ) == [O, O, T]


def test_one_line_suites_are_blocks_too():
    assert kinds(
        """
        import torch
        x = torch.zeros(1)
        if cond: x = load()
        x
        for item in items: y = torch.ones(1); y
        while running: z = item; break
        """
    ) == [O, T]


def test_a_loop_is_iterated_until_nothing_new_reaches_its_head():
    assert kinds(
        """
        import torch
        def f(graphs):
            x = torch.zeros(3)
            for g in graphs:
                x
                y = x
                x = g
            y
            n = torch.zeros(1)
            while n.sum() < 10:
                n
                n += 1
            n
        """
    ) == [O, O, T, T]


def test_break_continue_and_loop_else():
    assert kinds(
        """
        import torch
        def f(items):
            x = torch.zeros(1)
            for item in items:
                if item:
                    x = item
                    break
                x
            else:
                x
            x
            while True:
                y = torch.ones(1)
                if y.sum():
                    break
            y
        """
    ) == [T, T, O, T]


def test_code_after_return_raise_continue_break_and_exit_is_unreachable():
    assert kinds(
        """
        import sys
        import torch
        def f(items):
            x = torch.zeros(1)
            for item in items:
                if item:
                    continue
                    x
                break
                x
            if x.sum():
                raise ValueError
                x
            if items:
                sys.exit(1)
                x
            while True:
                pass
            x
        def g():
            x = torch.zeros(1)
            return x
            x
        """
    ) == [X, X, X, X, X, X]


def test_every_statement_of_a_try_body_may_reach_its_handlers_and_finally():
    assert kinds(
        """
        import torch
        def f(path):
            try:
                x = torch.zeros(1)
                x = open(path)
            except OSError:
                x
            finally:
                x
            try:
                y = torch.zeros(1)
            except OSError:
                return None
            y
        """
    ) == [O, O, T]


def test_with_and_match():
    assert kinds(
        """
        import torch
        from contextlib import suppress
        def f(command):
            with suppress(KeyError):
                x = torch.zeros(1)
                raise KeyError
            x
            match command:
                case "zeros":
                    y = torch.zeros(1)
                case _:
                    y = command
            y
        """
    ) == [T, O]


def test_unpacking_loop_elements_and_the_variables_holding_them():
    assert kinds(
        """
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(dataset, batch_size=4)
        for batch in loader:
            inputs, targets = batch
            targets
            first, *rest = batch
            rest
        for i, (x, y) in enumerate(loader):
            i
            y
        a, b = torch.zeros(2, 3)
        b
        c, d = load_pair()
        c
        """
    ) == [T, O, O, T, T, O]


def test_containers_of_tensors_and_what_spoils_them():
    assert kinds(
        """
        import torch
        import torch.nn as nn
        model = nn.Linear(2, 2)
        params = [p.data.clone() for p in model.parameters()]
        params
        tensors = {"a": torch.zeros(1)}
        tensors
        item = tensors["a"]
        item
        for key in tensors:
            key
        for key, value in tensors.items():
            value
        tensors["b"] = Graph()
        tensors
        parts = list(torch.split(torch.zeros(8), 2))
        parts
        parts.append(None)
        parts
        p = [p for p in range(3)]
        """
    ) == [L, D, T, O, T, O, L, O]


def test_a_comprehension_variable_does_not_leak_into_the_name_outside():
    assert kinds(
        """
        import torch
        x = torch.zeros(1)
        names = [x for x in ["a", "b"]]
        x
        names
        """
    ) == [T, O]


def test_what_the_files_own_functions_and_methods_return():
    assert kinds(
        """
        import torch
        import torch.nn as nn

        def zeros_like_input(x):
            out = torch.zeros_like(x)
            return out

        def through(n):
            return zeros_like_input(n) + 1

        def maybe(n):
            if n:
                return torch.zeros(n)

        def gen(n):
            yield torch.zeros(n)

        def recursive(n):
            if n:
                return recursive(n - 1)
            return torch.zeros(1)

        class Net(nn.Module):
            def init_hidden(self):
                return torch.zeros(1, 8)

            def reset(self):
                self.hidden = self.init_hidden()

            def use(self):
                h = self.hidden
                h

        a = through(3)
        a
        b = maybe(3)
        b
        c = gen(3)
        c
        d = recursive(3)
        d
        """
    ) == [T, T, O, O, T]


def test_tensor_facts_read_from_a_files_text():
    text = textwrap.dedent(
        '''
        import torch
        import torch.nn.functional as F
        from .box import make_anchors

        def direct(n):
            """A docstring."""
            return torch.zeros(n)

        def via_local(x):
            y = F.relu(x)
            y = y.clamp(0, 1)
            return y

        def via_project(n):
            return make_anchors(n) * 2

        def returns_parameter(x):
            return x

        def falls_off_its_end(n):
            if n:
                return torch.zeros(n)

        def generator(n):
            yield torch.zeros(n)

        @some_decorator
        def decorated(n):
            return torch.zeros(n)

        def loop_variable(items):
            for y in items:
                pass
            y = torch.zeros(1)
            return y

        def multi_line(n):
            return torch.zeros(
                n
            )

        anchors = via_project(3)
        logger = logging.getLogger(__name__)
        '''
    )
    facts = collect_file_facts(text, "pkg.prior", "pkg", "pkg/prior.py", "/project/pkg/prior.py")
    assert dict(facts.tensor_values) == {
        "pkg.prior.direct()": (),
        "pkg.prior.via_local()": (),
        "pkg.prior.via_project()": ("pkg.box.make_anchors()",),
        "pkg.prior.anchors": ("pkg.prior.via_project()",),
    }
    assert collect_file_facts(text, "torch.prior", "torch", "torch/prior.py", "/project/torch/prior.py").tensor_values == ()


def test_project_tensor_names_resolve_through_chains_and_never_when_ambiguous():
    box = collect_file_facts("import torch\ndef make_anchors(n):\n    return torch.ones(n)\n", "pkg.box", "pkg", "pkg/box.py", "/project/pkg/box.py")
    prior = collect_file_facts("from .box import make_anchors\nanchors = make_anchors(3)\n", "pkg.prior", "pkg", "pkg/prior.py", "/project/pkg/prior.py")
    project = ProjectFacts.build([box, prior])
    assert project.is_tensor("pkg.box.make_anchors()") and project.is_tensor("box.make_anchors()")
    assert project.is_tensor("pkg.prior.anchors") and not project.is_tensor("pkg.prior.anchors()")
    twin = collect_file_facts("import torch\ndef make_anchors(n):\n    return torch.ones(n)\n", "other.box", "other", "other/box.py", "/project/other/box.py")
    ambiguous = ProjectFacts.build([box, twin])
    assert not ambiguous.is_tensor("box.make_anchors()") and ambiguous.is_tensor("pkg.box.make_anchors()")
    assert ProjectFacts.build([box]).digest != ProjectFacts.build([]).digest


def test_functions_and_module_names_of_another_file_are_tensors_where_they_are_used(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "box.py").write_text(
        textwrap.dedent(
            """
            import torch

            def make_priors(n):
                priors = torch.zeros(n, 4)
                return priors.clamp(0, 1)

            def maybe(n):
                return torch.zeros(n) if n else None
            """
        )
    )
    (package / "config.py").write_text("from pkg.box import make_priors\n\npriors = make_priors(8)\n")
    (package / "train.py").write_text(
        textwrap.dedent(
            """
            from pkg import config
            from pkg.box import make_priors, maybe

            def main():
                config.priors.cuda()
                anchors = make_priors(4)
                anchors.cuda()
                maybe(3).cuda()
                return anchors
            """
        )
    )
    findings = lint_paths([package], cache=False).findings
    assert [(f.path.replace("\\", "/").rpartition("pkg/")[2], f.location.row) for f in findings if f.code == "DPL101"] == [
        ("train.py", 6),
        ("train.py", 8),
    ]


@pytest.mark.parametrize(
    "source, lines",
    [
        ("import torch\nt = torch.zeros(1)\nif x: y = 1; t.cuda()\n", [3]),
        ("import torch\nfor i in range(3): t = torch.zeros(1); t.cuda()\n", [2]),
        ("import torch\ntry: t = torch.zeros(1)\nexcept Exception: t = None\nt.cuda()\n", []),
        ("import torch\nwith ctx: t = torch.zeros(1); t.cuda()\n", [2]),
        ("import torch\nwhile True: t = torch.zeros(1); t.cuda(); break\n", [2]),
        ("import torch\ndef f(): t = torch.zeros(1); return t\nf().cuda()\n", [3]),
    ],
)
def test_one_line_suites_are_analysed_like_blocks(source, lines):
    assert [f.location.row for f in lint_source(source, "one.py", select=["DPL101"])] == lines


def test_kinds_from_the_tensor_api_comparisons_and_tensor_only_methods():
    assert kinds(
        """
        import torch
        import torch.nn.functional as F
        from torch.autograd import Variable
        def f(a, t, unknown, model: torch.nn.Module, tok, texts):
            inp = torch.from_numpy(a).float().div(255.0).unsqueeze_(0)
            inp
            mask = inp > t
            mask
            chained = 0 < inp < 1
            chained
            missing = inp == None
            missing
            negated = not inp
            negated
            values, indices = F.max_pool2d_with_indices(inp, 2)
            indices
            detached = unknown.detach().cpu()
            detached
            cloned = unknown.clone()
            cloned
            moved = model.float()
            moved
            variable = Variable(unknown)
            variable
            inputs = tok(texts, return_tensors="pt")
            inputs
            ids = inputs["input_ids"]
            ids
            first = inputs[0]
            first
        """
    ) == [T, T, O, O, O, T, T, O, M, T, D, T, O]


def test_class_attributes_bound_in_any_method_or_returned_by_a_property():
    assert kinds(
        """
        import torch
        class Holder:
            def __init__(self, array):
                self.data = torch.from_numpy(array)
                self.other = torch.zeros(1)

            def reset(self):
                self.other = load()

            @property
            def mask(self):
                return torch.ones(3)

            @cached
            def cached_mask(self):
                return torch.ones(3)

            def use(self):
                data, other, mask, cached_mask = self.data, self.other, self.mask, self.cached_mask
                data
                other
                mask
                cached_mask
        """
    ) == [T, O, T, O]


def test_the_analysis_package_imports_no_rule_machinery():
    import ast
    from pathlib import Path

    import dplint.analysis.inference

    for path in Path(dplint.analysis.inference.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        assert not [m for m in imported if m in ("dplint.rule", "dplint.rules") or m.startswith(("dplint.rules.", "rules"))], path
