from __future__ import annotations

import re
from typing import Iterator, Optional, Sequence

import libcst as cst

from dplint.context import FileContext
from dplint.facts import ProjectFacts
from dplint.inference import ClassModel, Inference, Scope
from dplint.names import block_body, iter_small_statements
from dplint.rule import Invalid, Report, Rule, Valid

# torch.nn.functional losses whose default reduction ("mean") returns a 0-dim tensor.
FUNCTIONAL_LOSSES = frozenset({"cross_entropy", "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits"})
REDUCTIONS = frozenset({"mean", "sum"})


class ScalarOutputFromForward(Rule):
    """
    ## What it does
    Statically: reports a `return` in `forward` of an `nn.Module` subclass wrapped in
    `nn.DataParallel` somewhere in the linted tree when the returned value (or an element of a
    returned tuple, list or dict) is 0-dim: a loss module or `torch.nn.functional` loss with the
    default reduction, or `.mean()`/`.sum()` without `dim` (also through a local variable, and in
    sums of such values). Per-sample losses (`reduction="none"`) are fine.

    At runtime, reports an `nn.DataParallel` forward whose replicas return a 0-dim tensor, typically a
    loss computed inside `forward` with the default `reduction="mean"`.

    ## Why is this bad?
    DataParallel gathers outputs by concatenation. 0-dim tensors cannot be concatenated, so it warns
    ("Was asked to gather along dimension 0, but all input tensors were scalars") and returns a vector
    with one value per replica. `loss.backward()` then fails on a non-scalar, and `loss.mean()` weights
    every replica equally: with chunks of [4, 4, 2] the last two samples count twice as much as the
    others.

    ## Example
    ```python
    class WithLoss(nn.Module):
        def forward(self, x, y):
            return F.cross_entropy(self.net(x), y)
    ```

    ## Use instead
    ```python
    class WithLoss(nn.Module):
        def forward(self, x, y):
            return F.cross_entropy(self.net(x), y, reduction="none")  # one loss per sample

    loss = model(x, y).mean()
    ```

    ## Known problems
    Statically, only losses created in the class (`self.criterion = nn.CrossEntropyLoss()`) and
    `torch.nn.functional` calls are recognised; a criterion passed in from outside is unknown. At
    runtime, reported only when every replica returns a 0-dim tensor at the same place in the output.
    """

    code = "DPL305"
    name = "scalar-output-from-forward"
    summary = "`forward` of a DataParallel-wrapped module returns a 0-dim tensor, gathered into one value per replica."
    triggers = re.compile(r"loss|Loss|mean\(|sum\(")

    VALID = [
        Valid(
            """
            import torch.nn as nn
            import torch.nn.functional as F

            class WithLoss(nn.Module):
                def forward(self, x, y):
                    return F.cross_entropy(x, y, reduction="none")  # one loss per sample

            model = nn.DataParallel(WithLoss())
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class WithLoss(nn.Module):  # never wrapped
                def __init__(self):
                    super().__init__()
                    self.criterion = nn.MSELoss()

                def forward(self, x, y):
                    return self.criterion(x, y)
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Pool(nn.Module):
                def forward(self, x):
                    return x.mean(dim=1), x.sum(-1)  # reduced over features, still per sample

            model = nn.DataParallel(Pool())
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn

            class WithLoss(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.net = nn.Linear(10, 2)
                    self.criterion = nn.CrossEntropyLoss()

                def forward(self, x, y):
                    loss = self.criterion(self.net(x), y)
                    return loss

            model = nn.DataParallel(WithLoss())
            """,
            line=11,
        ),
        Invalid(
            """
            import torch.nn as nn
            import torch.nn.functional as F

            class Model(nn.Module):
                def forward(self, x, y):
                    logits = x * 2
                    return logits, F.nll_loss(logits, y) + 0.1 * logits.pow(2).mean()

            model = nn.DataParallel(Model())
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Energy(nn.Module):
                def forward(self, x):
                    return {"energy": torch.sum(x ** 2)}

            model = nn.DataParallel(Energy())
            """,
            line=6,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        return project.wraps_any(module_classes) and super().applies_to(text, module_classes, project)

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = ctx.memo("inference", lambda: Inference(ctx))
        for class_name, forward, scope, wraps in inference.wrapped_forwards():
            scalars = _Scalars(ctx, inference.classes[class_name], scope)
            for statement in iter_small_statements(block_body(forward.body), into_functions=False):
                if not isinstance(statement, cst.Return) or statement.value is None:
                    continue
                for element in _returned(statement.value):
                    reason = scalars.reason(element)
                    if reason is not None:
                        yield self._report(ctx, class_name, statement, element, reason, wraps[0])
                        break

    @staticmethod
    def _report(ctx: FileContext, class_name: str, statement: cst.Return, element, reason: str, wrap) -> Report:
        return Report(
            node=statement,
            message=(
                f"`forward` of `{class_name}` returns `{ctx.short_code(element, 40)}`, a 0-dim tensor ({reason}); "
                f"`{class_name}` is wrapped in `nn.DataParallel` ({wrap.path}:{wrap.line}), which gathers it into a "
                "vector of one value per GPU (with a warning), so `backward()` on it fails and averaging it weights the "
                'samples of a smaller last chunk more; return per-sample values (`reduction="none"`) and reduce after '
                "the call."
            ),
            help='Return per-sample losses (`reduction="none"`) from forward and take `.mean()` after the DataParallel call.',
            statement=statement,
        )


def _returned(value: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    if isinstance(value, (cst.Tuple, cst.List)):
        for element in value.elements:
            yield element.value
    elif isinstance(value, cst.Dict):
        for element in value.elements:
            if isinstance(element, cst.DictElement):
                yield element.value
    else:
        yield value


class _Scalars:
    """Why an expression in `forward` is a 0-dim tensor, if it is one."""

    def __init__(self, ctx: FileContext, model: ClassModel, scope: Scope) -> None:
        self.ctx = ctx
        self.model = model
        self.scope = scope

    def reason(self, expr: cst.BaseExpression, depth: int = 0) -> Optional[str]:
        if depth > 6:
            return None
        if isinstance(expr, cst.Name):
            bindings = self.scope.bindings.get(expr.value, [])
            reasons = [self.reason(b.value, depth + 1) if b.value is not None and not b.augmented else None for b in bindings]
            return reasons[0] if reasons and all(reasons) else None
        if isinstance(expr, cst.BinaryOperation):
            left, right = self.reason(expr.left, depth + 1), self.reason(expr.right, depth + 1)
            if left and right:
                return left
            other = expr.right if left else expr.left
            return (left or right) if isinstance(other, (cst.Integer, cst.Float)) else None
        if isinstance(expr, cst.UnaryOperation):
            return self.reason(expr.expression, depth + 1)
        if isinstance(expr, cst.Call):
            return self._call(expr)
        return None

    def _call(self, call: cst.Call) -> Optional[str]:
        reduction = _reduction(call)
        qualified = self.ctx.qualify(call.func)
        if qualified is not None:
            module, _, name = qualified.rpartition(".")
            if module == "torch.nn.functional" and (name.endswith("_loss") or name in FUNCTIONAL_LOSSES):
                return f"`F.{name}` with reduction={reduction!r}" if reduction in REDUCTIONS else None
            if module == "torch" and name in REDUCTIONS and _reduces_everything(call, first_is_input=True):
                return f"`torch.{name}` without `dim`"
            return None
        func = call.func
        if not isinstance(func, cst.Attribute):
            return None
        if func.attr.value in REDUCTIONS and _reduces_everything(call, first_is_input=False):
            return f"`.{func.attr.value}()` without `dim`"
        if isinstance(func.value, cst.Name) and func.value.value == self.scope.self_name:
            return self._criterion(func.attr.value)
        return None

    def _criterion(self, attribute: str) -> Optional[str]:
        """`self.criterion(...)` where the class sets `self.criterion = nn.SomeLoss()` (reducing)."""
        bindings = self.model.attributes.get(attribute, [])
        values = [binding.value for binding, _ in bindings]
        if not values or not all(isinstance(v, cst.Call) for v in values):
            return None
        names = [self.ctx.qualify(v.func) or "" for v in values]  # type: ignore[union-attr]
        if not all(n.startswith("torch.nn.") and n.endswith("Loss") for n in names):
            return None
        if not all(_reduction(v) in REDUCTIONS for v in values):  # type: ignore[arg-type]
            return None
        return f"`{names[0].rpartition('.')[2]}` with reduction={_reduction(values[0])!r}"  # type: ignore[arg-type]


def _reduction(call: cst.Call) -> Optional[str]:
    """The call's `reduction=` as a string ("mean" when absent); None when it is not a literal."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "reduction":
            value = arg.value.evaluated_value if isinstance(arg.value, cst.SimpleString) else None
            return value if isinstance(value, str) else None
    return "mean"


def _reduces_everything(call: cst.Call, first_is_input: bool) -> bool:
    """`x.sum()`, `torch.mean(x)`: no `dim`, positional or keyword."""
    positional = [arg for arg in call.args if arg.keyword is None]
    allowed = 1 if first_is_input else 0
    return len(positional) <= allowed and not any(arg.star for arg in call.args) and not any(
        arg.keyword is not None and arg.keyword.value in ("dim", "axis") for arg in call.args
    )


def message(where: str, replicas: int, chunk_sizes: Sequence[int]) -> str:
    uneven = len(set(chunk_sizes)) > 1
    weighting = (
        f"and the chunks are uneven ({list(chunk_sizes)}), so averaging it weights samples unequally"
        if uneven
        else "so `backward()` needs a reduction and any average over it ignores how the batch was split"
    )
    return (
        f"forward returned a 0-dim tensor ({where}) on each replica; DataParallel gathered it into a vector of "
        f"{replicas} values, one per replica, {weighting}; return per-sample values (`reduction=\"none\"`) and "
        "reduce after the call."
    )
