from __future__ import annotations

import re
from typing import Iterator, List, Optional, Tuple

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.inference import Inference, ScalarLosses
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid


# Tensor methods that, without `dim`, reduce to a 0-dim tensor (`x.max(1)` returns a tuple instead).
ZERO_DIM_REDUCTIONS = frozenset(
    {"max", "min", "sum", "mean", "prod", "amax", "amin", "median", "nanmedian", "nansum", "nanmean", "norm", "std", "var", "all", "any"}
)


class LossDataIndex(Rule):
    """
    ## What it does
    Checks for `x.data[0]` where `x` is a 0-dim tensor: the result of a loss module or
    `torch.nn.functional` loss with a reducing `reduction`, or of a reduction without `dim`
    (`.max()`, `.min()`, `.sum()`, `.mean()`, `torch.sum(x)`, …), directly or through a variable.

    ## Why is this bad?
    It is pre-0.4 PyTorch, when losses and reductions were 1-element vectors. Since 0.4 they are
    0-dim and indexing one raises `IndexError: invalid index of a 0-dim tensor`, typically in the
    logging line of a training loop or a metrics helper copied from an old multi-GPU example, after
    the first step has already run.

    ## Example
    ```python
    loss = criterion(output, target)
    print(loss.data[0], output.max().data[0])
    ```

    ## Use instead
    ```python
    loss = criterion(output, target)
    print(loss.item(), output.max().item())
    ```

    ## Fix safety
    `x.data[0]` → `x.item()` is safe: indexing a 0-dim tensor can only raise. A line whose `.data[0]`
    uses are not all known to be 0-dim gets no fix, so that no line is left half migrated.

    ## Known problems
    Only values traced to a reducing loss or a reduction without `dim` are reported; `x.data[0]` on
    anything else may be a valid index into a vector. A top-level helper of a module the project
    imports, which no program reaches and no file names (a debug printer left behind), is left
    alone: it never runs. The same helper in a module nothing in the project imports is reported,
    since its callers are outside.
    """

    code = "DPL401"
    name = "loss-data-index"
    summary = "`x.data[0]` on a 0-dim loss or reduction raises IndexError on PyTorch >= 0.4; use `x.item()`."
    fix_applicability = ("safe",)
    triggers = re.compile(r"\.data\[0\]")

    VALID = [
        Valid(
            """
            import torch.nn.functional as F
            loss = F.cross_entropy(output, target)
            print(loss.item())
            """
        ),
        Valid(
            """
            import torch.nn.functional as F
            losses = F.cross_entropy(output, target, reduction="none")
            first = losses.data[0]  # a vector: indexing is fine
            """
        ),
        Valid(
            """
            scores = model(x)
            best = scores.data[0]  # unknown shape: not reported
            top = scores.max(1)[0].data[0]  # max over a dim: a vector
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss()
            loss = criterion(output, target)
            print("loss", loss.data[0])
            """,
            line=4,
            expected_fix="""
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss()
            loss = criterion(output, target)
            print("loss", loss.item())
            """,
        ),
        Invalid(
            """
            import torch.nn.functional as F
            def train(output, target):
                loss = F.nll_loss(output, target)
                total = loss.data[0]
                return total
            """,
            line=4,
        ),
        Invalid(
            """
            err = ((prediction - target) ** 2).mean()
            log(err.data[0])
            """,
            line=2,
        ),
        Invalid(
            """
            def log_stats(writer, grads, step):
                writer.add_scalar("grad/max", grads.abs().max().data[0], step)
            """,
            line=2,
            expected_fix="""
            def log_stats(writer, grads, step):
                writer.add_scalar("grad/max", grads.abs().max().item(), step)
            """,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        found: List[Tuple[cst.Subscript, Optional[str], cst.CSTNode, cst.BaseExpression]] = []
        for line, scope in inference.statements:
            scalars = ScalarLosses(ctx, scope)
            for subscript in _data_index_zero(line):
                receiver = subscript.value.value  # type: ignore[attr-defined]
                found.append((subscript, _zero_dim_reason(receiver, scalars, scope), line, receiver))
        if not any(reason for _, reason, _, _ in found):
            return
        # A fix for every `.data[0]` of a line, or for none of them: never a half-migrated line.
        unknown_lines = {ctx.line(subscript) for subscript, reason, _, _ in found if reason is None}
        for subscript, reason, line, receiver in found:
            if reason is None or ctx.left_behind(subscript):
                continue
            item = f"{ctx.code(receiver)}.item()"
            fix = None if ctx.line(subscript) in unknown_lines else FixSpec(f"Replace with `{item}`", (NodeEdit(subscript, item),))
            yield Report(
                node=subscript,
                message=f"`{ctx.short_code(subscript, 40)}` indexes a 0-dim tensor ({reason}), which raises IndexError.",
                help=f"Write `{item}`.",
                fix=fix,
                statement=line,
            )


def _zero_dim_reason(receiver: cst.BaseExpression, scalars: ScalarLosses, scope, depth: int = 0) -> Optional[str]:
    """Why `receiver` is 0-dim: a reducing loss, or a reduction without `dim` (through variables)."""
    reason = scalars.reason(receiver)
    if reason is not None or depth > 4:
        return reason
    if isinstance(receiver, cst.Name):
        bindings = scope.bindings.get(receiver.value, [])
        reasons = [
            _zero_dim_reason(b.value, scalars, scope, depth + 1) if b.value is not None and not b.augmented else None
            for b in bindings
        ]
        return reasons[0] if reasons and all(reasons) else None
    if (
        isinstance(receiver, cst.Call)
        and isinstance(receiver.func, cst.Attribute)
        and receiver.func.attr.value in ZERO_DIM_REDUCTIONS
        and not receiver.args
    ):
        return f"`.{receiver.func.attr.value}()` without `dim`"
    return None


def _data_index_zero(node: cst.CSTNode) -> Iterator[cst.Subscript]:
    if isinstance(node, (cst.Lambda, cst.FunctionDef)):
        return
    if (
        isinstance(node, cst.Subscript)
        and isinstance(node.value, cst.Attribute)
        and node.value.attr.value == "data"
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
        and isinstance(node.slice[0].slice.value, cst.Integer)
        and node.slice[0].slice.value.value == "0"
    ):
        yield node
    for child in node.children:
        yield from _data_index_zero(child)
