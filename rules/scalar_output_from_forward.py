from __future__ import annotations

from typing import Iterator

import libcst as cst

from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.analysis.inference import Inference, ScalarLosses
from dplint.analysis.names import block_body, iter_small_statements
from dplint.rule import Invalid, Report, Valid, WrappedForwardRule


class ScalarOutputFromForward(WrappedForwardRule):
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
    Statically, a class is left alone where every file that wraps it reduces what a call returned by
    name (`loss = loss.mean()`, the `if n_gpu > 1:` idiom): the gathered vector is averaged, and only
    the uneven weighting of a last, short batch remains.
    """

    code = "DPL305"
    name = "scalar-output-from-forward"
    summary = "`forward` of a DataParallel-wrapped module returns a 0-dim tensor, gathered into one value per replica."
    # `F.cross_entropy` and `F.kl_div` are losses without the word (FUNCTIONAL_LOSSES).
    triggers = GuardedPattern(r"loss|Loss|mean\(|sum\(|cross_entropy|kl_div", ["loss", "Loss", "mean(", "sum(", "cross_entropy", "kl_div"])

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
            import torch.nn.functional as F

            class Classifier(nn.Module):
                def forward(self, x, y):
                    return F.cross_entropy(x, y)

            model = nn.DataParallel(Classifier())
            """,
            line=6,
        ),
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

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        for class_name, forward, scope, wraps in inference.wrapped_forwards():
            # Where every wrapping file reduces the gathered values (`loss = loss.mean()`), only the
            # last, uneven batch's weighting is left: too little to report.
            wraps = [wrap for wrap in wraps if not wrap.output_reduced]
            if not wraps:
                continue
            scalars = ScalarLosses(ctx, scope, inference.classes[class_name])
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
                f"`{class_name}.forward` returns the 0-dim `{ctx.short_code(element, 25)}`, which DataParallel "
                "gathers into one value per GPU."
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
