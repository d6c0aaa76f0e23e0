from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from dplint.context import FileContext
from dplint.analysis.inference import Inference, ScalarLosses
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid


class LossDataIndex(Rule):
    """
    ## What it does
    Checks for `x.data[0]` where `x` is a 0-dim tensor such as a loss: the result of a loss module
    or `torch.nn.functional` loss with a reducing `reduction`, or of `.mean()`/`.sum()` without `dim`.

    ## Why is this bad?
    It is pre-0.4 PyTorch, when losses were 1-element vectors. Since 0.4 a loss is 0-dim and indexing
    it raises `IndexError: invalid index of a 0-dim tensor`, typically in the logging line of a
    training loop copied from an old multi-GPU example, after the first step has already run.

    ## Example
    ```python
    loss = criterion(output, target)
    print(loss.data[0])
    ```

    ## Use instead
    ```python
    loss = criterion(output, target)
    print(loss.item())
    ```

    ## Fix safety
    `x.data[0]` → `x.item()` is safe: indexing a 0-dim tensor can only raise.

    ## Known problems
    Only values traced to a reducing loss or reduction are reported; `x.data[0]` on anything else
    may be a valid index into a vector.
    """

    code = "DPL401"
    name = "loss-data-index"
    summary = "`loss.data[0]` on a 0-dim tensor raises IndexError on PyTorch >= 0.4; use `loss.item()`."
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
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        for line, scope in inference.statements:
            scalars = ScalarLosses(ctx, scope)
            for subscript in _data_index_zero(line):
                receiver = subscript.value.value  # type: ignore[attr-defined]
                reason = scalars.reason(receiver)
                if reason is None:
                    continue
                item = f"{ctx.code(receiver)}.item()"
                yield Report(
                    node=subscript,
                    message=(
                        f"`{ctx.short_code(subscript)}` indexes a 0-dim tensor ({reason}): since PyTorch 0.4 losses are "
                        f"0-dim and this raises IndexError after the step has run; write `{item}`."
                    ),
                    help=f"Write `{item}`.",
                    fix=FixSpec(f"Replace with `{item}`", (NodeEdit(subscript, item),)),
                    statement=line,
                )


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
