from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from dplint.context import FileContext
from dplint.analysis.inference import Inference, WrappedForwardRule
from dplint.analysis.names import block_body, iter_small_statements
from dplint.rule import Invalid, Report, Valid


class ForwardMutatesModuleState(WrappedForwardRule):
    """
    ## What it does
    Statically: inside `forward` of an `nn.Module` subclass that is wrapped in `nn.DataParallel`
    somewhere in the linted tree, reports assignments and augmented assignments to `self.<attr>`
    (`self.steps += 1`, `self.cache = x`). In-place updates of registered buffers
    (`self.running.mul_(0.9)`) are how BatchNorm keeps statistics and are not reported.

    At runtime, compares each replica of the wrapped module and its submodules before and after
    its forward, and reports `forward` rebinding an attribute (`self.steps += 1`), a registered
    buffer (`self.ema = 0.9 * self.ema + ...`), a parameter or a child module, or changing a list,
    dict, set or plain tensor attribute in place (`self.history.append(loss)`, `self.cache[k] = v`,
    `self.total += loss`).

    ## Why is this bad?
    DataParallel runs `forward` on replicas: shallow copies of the module made for every call. A
    rebinding happens on a replica and is thrown away with it, so the counter never advances and the
    cache stays empty, while on one GPU (no replicas) it works. An in-place change of a shared list or
    dict runs concurrently from every replica's thread, in no fixed order.

    ## Example
    ```python
    class Net(nn.Module):
        def forward(self, x):
            self.steps += 1
            return self.fc(x)
    ```

    ## Use instead
    Keep such state outside the module (in the training loop), or in a registered buffer updated in
    place (`self.steps.add_(1)`), which is how BatchNorm keeps its statistics; note that buffer
    updates are kept only from the replica on `device_ids[0]`.

    ## Known problems
    Statically, only `forward` itself is read, not the methods it calls. At runtime, attributes are
    compared one level deep: a change inside an object held by an attribute is not seen. What torch
    maintains itself is left alone: torch's own modules, the attributes torch's base classes use (a
    user subclass of `nn.LSTM` refreshes `_flat_weights`), and those recomputed by `spectral_norm`,
    `weight_norm` and pruning hooks.
    """

    code = "DPL304"
    name = "forward-mutates-module-state"
    summary = "`forward` of a DataParallel-wrapped module changes module attributes, which replicas lose."
    triggers = re.compile(r"self\.\w+\s*(?::[^=\n]*)?(?:[-+*/@%|&^]|//|\*\*|<<|>>)?=(?!=)")

    VALID = [
        Valid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.steps = 0  # __init__ is not forward
                    self.register_buffer("running", torch.zeros(4))

                def forward(self, x):
                    self.running.mul_(0.9).add_(x.mean(0))  # in place on a buffer: BatchNorm's way
                    return x

            model = nn.DataParallel(Net())
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Net(nn.Module):  # never wrapped: attribute updates persist
                def forward(self, x):
                    self.last = x
                    return x
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    def helper(y):
                        state = y  # a local, not an attribute
                        return state
                    out = helper(x)
                    return out

            model = nn.DataParallel(Net())
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    self.steps += 1
                    return x

            model = nn.DataParallel(Net())
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Attention(nn.Module):
                def forward(self, q, k):
                    scores = q @ k.transpose(-1, -2)
                    self.last_scores = scores.detach()  # for plotting later: lost on replicas
                    return scores

            model = nn.DataParallel(Attention().cuda())
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Base(nn.Module):
                def forward(self, x):
                    if self.training:
                        self.seen: int = self.seen + len(x)
                    return x

            class Net(Base):
                pass

            net = nn.DataParallel(Net())
            """,
            line=6,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        for class_name, forward, scope, wraps in inference.wrapped_forwards():
            for statement in iter_small_statements(block_body(forward.body), into_functions=False):
                targets = []
                if isinstance(statement, cst.Assign):
                    targets = [target.target for target in statement.targets]
                elif isinstance(statement, (cst.AugAssign, cst.AnnAssign)):
                    targets = [statement.target]
                for target in targets:
                    if _is_self_attribute(target, scope.self_name):
                        yield self._report(ctx, class_name, statement, target, wraps[0])

    @staticmethod
    def _report(ctx: FileContext, class_name: str, statement: cst.CSTNode, target: cst.Attribute, wrap) -> Report:
        attribute = ctx.code(target)
        return Report(
            node=statement,
            message=(
                f"`forward` of `{class_name}` sets `{attribute}`, but `{class_name}` is wrapped in `nn.DataParallel` "
                f"({wrap.path}:{wrap.line}), which runs forward on replicas copied for every call: the update is lost "
                "when the call returns (it only seems to work on one GPU); keep such state outside the module, or in a "
                "registered buffer updated in place."
            ),
            help=f"Move `{attribute}` out of forward (into the training loop), or keep it in a buffer updated in place.",
            statement=statement,
        )


def _is_self_attribute(target: cst.BaseExpression, self_name) -> bool:
    return isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == self_name
