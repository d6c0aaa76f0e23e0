from __future__ import annotations

import re
from typing import AbstractSet, Iterator, Optional, Sequence, Set

import libcst as cst

from dplint.context import FileContext
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.inference import WRAPPERS
from dplint.analysis.names import Body, child_blocks, iter_calls, iter_scope_bodies
from dplint.rule import Invalid, Report, Rule, Valid

PREFIX = "module."


class WrapperStateDictPrefix(Rule):
    """
    ## What it does
    Checks for `torch.save(model.state_dict(), ...)` (also inside a dict) after `model` was
    wrapped in `nn.DataParallel` or `DistributedDataParallel` in the same function, and for
    hand-rolled stripping of the prefix with `key.replace("module.", "")`. At runtime (`pytest
    --dplint`), `load_state_dict` whose keys differ from the model's only by the `module.` prefix
    raises, also under `strict=False`, and so does a checkpoint whose keys all carry the prefix
    loaded into a model whose keys do not, even when they differ in more (a different head).

    ## Why is this bad?
    A wrapper's `state_dict()` keys all start with `module.`: a checkpoint saved from the wrapper
    cannot be loaded into the plain model (`strict=True` raises "Missing key(s)"; `strict=False`
    silently loads *nothing* and training restarts from random weights). When the wrap happens only
    on multi-GPU machines (`if torch.cuda.device_count() > 1`), the checkpoints of the two setups are
    incompatible. `key.replace("module.", "")` also rewrites keys that merely contain `module.`
    (`backbone.submodule.weight` → `backbone.subweight`).

    ## Example
    ```python
    model = nn.DataParallel(model)
    torch.save(model.state_dict(), "ckpt.pt")
    state = {k.replace("module.", ""): v for k, v in torch.load("ckpt.pt").items()}
    ```

    ## Use instead
    ```python
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    torch.save(getattr(model, "module", model).state_dict(), "ckpt.pt")
    state = torch.load("ckpt.pt")
    consume_prefix_in_state_dict_if_present(state, "module.")
    ```

    ## Known problems
    The wrap and the save must be in the same function (or both at module level), and the save a
    statement of its own; a save guarded by `hasattr(model, "module")` or `isinstance(model, ...)`
    is taken as handled.
    """

    code = "DPL303"
    name = "wrapper-state-dict-prefix"
    summary = "A state_dict saved from a DataParallel/DDP wrapper carries `module.` prefixes plain models cannot load."
    triggers = re.compile(r"""\.replace\(\s*["']module\.["']""")

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        """The prefix stripped by hand, or a save of a `state_dict` in a file that wraps a model."""
        if self.triggers.search(text):
            return True
        return "state_dict" in text and "save(" in text and ("DataParallel" in text or "DDP" in text)

    VALID = [
        Valid(
            """
            import torch
            import torch.nn as nn
            model = nn.DataParallel(Net())
            torch.save(model.module.state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn
            model = Net()
            torch.save(model.state_dict(), "before.pt")  # before the wrap
            model = nn.DataParallel(model)
            state = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
            torch.save(state, "after.pt")
            """
        ),
        Valid(
            """
            import torch
            from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
            state = torch.load("ckpt.pt")
            consume_prefix_in_state_dict_if_present(state, "module.")
            name = title.replace("Module.", "")  # not the prefix
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn

            def train(model):
                if torch.cuda.device_count() > 1:
                    model = nn.DataParallel(model)
                torch.save({"model": model.state_dict(), "epoch": 3}, "ckpt.pt")
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank])
            torch.save(model.state_dict(), f"rank{rank}.pt")
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            state = torch.load("ckpt.pt", map_location="cpu")
            state = {k.replace("module.", ""): v for k, v in state.items()}
            """,
            line=3,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for body in iter_scope_bodies(ctx.module):
            yield from self._saves(ctx, body)
        if not self.triggers.search(ctx.source):
            return
        for call in iter_calls(ctx.module):
            if _strips_prefix(call):
                yield Report(
                    node=call,
                    message=(
                        f'`{ctx.short_code(call)}` strips the DataParallel/DDP prefix by hand, which also rewrites keys '
                        'that merely contain "module." (`backbone.submodule.weight` becomes `backbone.subweight`), '
                        "and those weights are then silently not loaded under `strict=False`; use "
                        '`consume_prefix_in_state_dict_if_present(state_dict, "module.")`.'
                    ),
                    help='Use `torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state_dict, "module.")`.',
                )

    def _saves(self, ctx: FileContext, body: Body) -> Iterator[Report]:
        wrapped: Set[str] = set()
        for statement in _flat(body):
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                call = small.value if isinstance(small, cst.Expr) else None  # `torch.save(...)` stands alone
                if isinstance(call, cst.Call) and call.args and wrapped and ctx.qualify(call.func) == "torch.save":
                    name = _saved_state_dict_of(call.args[0].value, wrapped)
                    if name is not None:
                        yield self._report(ctx, call, name, small)
                if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call):
                    if ctx.qualify(small.value.func) in WRAPPERS:
                        wrapped.update(t.target.value for t in small.targets if isinstance(t.target, cst.Name))

    @staticmethod
    def _report(ctx: FileContext, call: cst.Call, name: str, statement) -> Report:
        return Report(
            node=call,
            message=(
                f"`{name}` is wrapped in DataParallel/DDP above, so `{name}.state_dict()` keys start with `module.`: the "
                "checkpoint does not load into the plain model (strict loading raises; `strict=False` silently loads "
                f"nothing), and differs between single- and multi-GPU runs; save `getattr({name}, \"module\", {name})"
                ".state_dict()`."
            ),
            help=f'Save `getattr({name}, "module", {name}).state_dict()` (or `{name}.module.state_dict()`).',
            statement=statement,
        )


def _flat(body: Body) -> Iterator[cst.CSTNode]:
    """Statements in source order, into if/for/while/with/try blocks, not into nested functions or
    blocks guarded by `hasattr(x, "module")` / `isinstance(...)`."""
    for statement in body:
        yield statement
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or not isinstance(statement, cst.BaseCompoundStatement):
            continue
        if isinstance(statement, cst.If) and _checks_wrapping(statement.test):
            continue
        for block in child_blocks(statement):
            yield from _flat(block)


def _checks_wrapping(test: cst.BaseExpression) -> bool:
    return any(
        isinstance(call.func, cst.Name) and call.func.value in ("hasattr", "isinstance") for call in iter_calls(test)
    )


def _saved_state_dict_of(value: cst.BaseExpression, wrapped: AbstractSet[str]) -> Optional[str]:
    """The wrapped name whose `.state_dict()` the saved object holds, outside wrap-checking branches."""
    if isinstance(value, cst.IfExp):
        return None if _checks_wrapping(value.test) else (_saved_state_dict_of(value.body, wrapped) or _saved_state_dict_of(value.orelse, wrapped))
    if isinstance(value, cst.Dict):
        for element in value.elements:
            if isinstance(element, cst.DictElement):
                found = _saved_state_dict_of(element.value, wrapped)
                if found:
                    return found
        return None
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "state_dict"
        and isinstance(value.func.value, cst.Name)
        and value.func.value.value in wrapped
    ):
        return value.func.value.value
    return None


def _strips_prefix(call: cst.Call) -> bool:
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "replace" and len(call.args) >= 2):
        return False
    old, new = call.args[0].value, call.args[1].value
    return (
        isinstance(old, cst.SimpleString)
        and old.evaluated_value == PREFIX
        and isinstance(new, cst.SimpleString)
        and new.evaluated_value == ""
    )
