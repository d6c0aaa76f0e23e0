from __future__ import annotations

from typing import Iterator, Set

import libcst as cst

from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.analysis.inference import Inference
from dplint.analysis.names import block_body, iter_calls, iter_small_statements
from dplint.rule import Invalid, Report, Valid, WrappedForwardRule

RNN_MODULES = frozenset({"torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN"})


class RnnWithoutFlattenParameters(WrappedForwardRule):
    """
    ## What it does
    Checks `forward` of modules wrapped in `nn.DataParallel` somewhere in the project, and of the
    modules of the same file they build as submodules (a `BidirectionalLSTM` inside a CRNN), for a
    call of an `nn.LSTM`/`nn.GRU`/`nn.RNN` submodule not preceded by
    `self.<rnn>.flatten_parameters()`.

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
    Only RNNs created in the class (`self.lstm = nn.LSTM(...)`) are recognised, and submodule
    classes only when defined in the same file as the wrapped class.
    """

    code = "DPL308"
    name = "rnn-without-flatten-parameters"
    summary = "A DataParallel-wrapped module calls an RNN without `flatten_parameters()` (advice)."
    severity = "warning"
    enabled_by_default = False
    triggers = GuardedPattern(r"nn\.(?:LSTM|GRU|RNN)\b|\b(?:LSTM|GRU|RNN)\(", ["LSTM", "GRU", "RNN"])

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
        Valid(
            """
            import torch.nn as nn

            class BidirectionalLSTM(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.LSTM(8, 8, bidirectional=True)

                def forward(self, x):
                    return self.rnn(x)[0]

            class Tagger(nn.Module):  # builds the LSTM block but is never wrapped
                def __init__(self):
                    super().__init__()
                    self.body = BidirectionalLSTM()

                def forward(self, x):
                    return self.body(x)

            class Head(nn.Module):
                def forward(self, x):
                    return x

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
        Invalid(
            """
            import torch.nn as nn

            class BidirectionalLSTM(nn.Module):
                def __init__(self, n_in, n_hidden, n_out):
                    super().__init__()
                    self.rnn = nn.LSTM(n_in, n_hidden, bidirectional=True)
                    self.embedding = nn.Linear(n_hidden * 2, n_out)

                def forward(self, x):
                    recurrent, _ = self.rnn(x)
                    return self.embedding(recurrent)

            class CRNN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.Sequential(BidirectionalLSTM(64, 32, 32), BidirectionalLSTM(32, 32, 10))

                def forward(self, x):
                    return self.rnn(x)

            model = nn.DataParallel(CRNN())
            """,
            line=10,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        for class_name, (wrap, via) in inference.replicated_classes().items():
            model = inference.classes[class_name]
            forward = next(
                (s for s in block_body(model.node.body) if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None
            )
            if forward is None or not forward.params.params:
                continue
            self_name = forward.params.params[0].name.value
            rnns = {
                name
                for name, bindings in model.attributes.items()
                if bindings
                and all(isinstance(b.value, cst.Call) and ctx.qualify(b.value.func) in RNN_MODULES for b, _ in bindings)
            }
            replica = f"`{class_name}`" if via is None else f"`{class_name}` (in `{via}`)"
            flattened: Set[str] = set()
            for statement in iter_small_statements(block_body(forward.body), into_functions=False):
                for call in iter_calls(statement):
                    attribute = _self_attribute_call(call, self_name)
                    if attribute is not None and attribute in rnns and attribute not in flattened:
                        flattened.add(attribute)  # one report per RNN
                        yield Report(
                            node=call,
                            message=(
                                f"`{ctx.short_code(call, 25)}` in {replica} skips `flatten_parameters()` under "
                                "DataParallel."
                            ),
                            help=f"Call `self.{attribute}.flatten_parameters()` before `self.{attribute}(...)`.",
                            statement=statement,
                        )
                    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "flatten_parameters":
                        inner = call.func.value
                        if isinstance(inner, cst.Attribute) and isinstance(inner.value, cst.Name) and inner.value.value == self_name:
                            flattened.add(inner.attr.value)


def _self_attribute_call(call: cst.Call, self_name) -> str | None:
    func = call.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == self_name:
        return func.attr.value
    return None
