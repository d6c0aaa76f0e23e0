from __future__ import annotations

import re
from typing import Iterator, Set

import libcst as cst

from dplint.context import FileContext
from dplint.analysis.inference import Inference, WrappedForwardRule
from dplint.analysis.names import block_body, iter_calls, iter_small_statements
from dplint.rule import Invalid, Report, Valid

RNN_MODULES = frozenset({"torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN"})


class RnnWithoutFlattenParameters(WrappedForwardRule):
    """
    ## What it does
    Checks `forward` of modules wrapped in `nn.DataParallel` somewhere in the linted tree for a call
    of an `nn.LSTM`/`nn.GRU`/`nn.RNN` submodule not preceded by `self.<rnn>.flatten_parameters()`.

    ## Why is this bad?
    DataParallel replicates the module for every call, and the replicas' RNN weights no longer sit
    in one contiguous block of memory. cuDNN then warns ("RNN module weights are not part of single
    contiguous chunk of memory") and copies the weights on every step: slower, more memory, and a
    warning per step in the logs. It is advice, and off by default: select it with
    `--extend-select DPL308`.

    ## Example
    ```python
    def forward(self, x):
        output, _ = self.lstm(x)
        return output
    ```

    ## Use instead
    ```python
    def forward(self, x):
        self.lstm.flatten_parameters()
        output, _ = self.lstm(x)
        return output
    ```

    ## Known problems
    Only RNNs created in the class (`self.lstm = nn.LSTM(...)`) are recognised.
    """

    code = "DPL308"
    name = "rnn-without-flatten-parameters"
    summary = "A DataParallel-wrapped module calls an RNN without `flatten_parameters()` (advice)."
    severity = "warning"
    enabled_by_default = False
    triggers = re.compile(r"nn\.(?:LSTM|GRU|RNN)\b|\b(?:LSTM|GRU|RNN)\(")

    VALID = [
        Valid(
            """
            import torch.nn as nn

            class Encoder(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lstm = nn.LSTM(8, 16)

                def forward(self, x):
                    self.lstm.flatten_parameters()
                    return self.lstm(x)[0]

            model = nn.DataParallel(Encoder())
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Encoder(nn.Module):  # not wrapped
                def __init__(self):
                    super().__init__()
                    self.gru = nn.GRU(8, 16)

                def forward(self, x):
                    return self.gru(x)[0]
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Head(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(8, 2)

                def forward(self, x):
                    return self.fc(x)

            model = nn.DataParallel(Head())
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn

            class Encoder(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lstm = nn.LSTM(8, 16, batch_first=True)

                def forward(self, x):
                    output, _ = self.lstm(x)
                    return output

            model = nn.DataParallel(Encoder())
            """,
            line=9,
        ),
        Invalid(
            """
            from torch import nn

            class Tagger(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.GRU(8, 16)
                    self.out = nn.Linear(16, 4)

                def forward(self, x):
                    hidden = self.rnn(x)[0]
                    return self.out(hidden)

            model = nn.DataParallel(Tagger().cuda())
            """,
            line=10,
        ),
        Invalid(
            """
            import torch.nn as nn
            from torch.nn import RNN

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.cell = RNN(4, 4)

                def forward(self, x):
                    y, h = self.cell(x)
                    return y

            net = nn.DataParallel(Net())
            """,
            line=10,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        for class_name, forward, scope, wraps in inference.wrapped_forwards():
            model = inference.classes[class_name]
            rnns = {
                name
                for name, bindings in model.attributes.items()
                if bindings
                and all(isinstance(b.value, cst.Call) and ctx.qualify(b.value.func) in RNN_MODULES for b, _ in bindings)
            }
            flattened: Set[str] = set()
            for statement in iter_small_statements(block_body(forward.body), into_functions=False):
                for call in iter_calls(statement):
                    attribute = _self_attribute_call(call, scope.self_name)
                    if attribute is not None and attribute in rnns and attribute not in flattened:
                        flattened.add(attribute)  # one report per RNN
                        yield Report(
                            node=call,
                            message=(
                                f"`{ctx.short_code(call)}` runs an RNN in `forward` of `{class_name}`, which is wrapped in "
                                f"`nn.DataParallel` ({wraps[0].path}:{wraps[0].line}): the replicas' RNN weights are not "
                                "contiguous, so cuDNN warns and copies them every step; call "
                                f"`self.{attribute}.flatten_parameters()` first."
                            ),
                            help=f"Call `self.{attribute}.flatten_parameters()` before `self.{attribute}(...)`.",
                            statement=statement,
                        )
                    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "flatten_parameters":
                        inner = call.func.value
                        if isinstance(inner, cst.Attribute) and isinstance(inner.value, cst.Name) and inner.value.value == scope.self_name:
                            flattened.add(inner.attr.value)


def _self_attribute_call(call: cst.Call, self_name) -> str | None:
    func = call.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == self_name:
        return func.attr.value
    return None
