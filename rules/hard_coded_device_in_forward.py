from __future__ import annotations

import re
from typing import Iterator, List, Optional, Sequence, Tuple

import libcst as cst

from dplint.analysis.facts import ProjectFacts, Wrap
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.analysis.inference import Inference
from dplint.analysis.names import block_body, iter_calls, iter_small_statements
from dplint.rule import Invalid, Report, Valid, WrappedForwardRule

INDEXED_DEVICE = re.compile(r"cuda:\d+")


class HardCodedDeviceInForward(WrappedForwardRule):
    """
    ## What it does
    Checks `forward` of `nn.Module` subclasses wrapped in `nn.DataParallel` or
    `DistributedDataParallel` somewhere in the project for tensors created on or moved to a literal
    device index: `device="cuda:0"`, `.cuda(0)`, `.to("cuda:1")`, `.to(0)`, `torch.device("cuda", 1)`.

    ## Why is this bad?
    DataParallel runs a replica of the module on every GPU, each inside `torch.cuda.device(k)`. A
    literal index sends every replica's tensor to the same GPU: replica 1 computes with its input on
    GPU 1 and the new tensor on GPU 0, and fails with "Expected all tensors to be on the same
    device" (or silently funnels work and memory through one GPU). Under DistributedDataParallel
    each rank runs `forward` with its parameters on its own GPU: rank 1's new tensor lands on GPU 0
    beside parameters on GPU 1, and the same error follows. On one GPU it works.

    ## Example
    ```python
    def forward(self, x):
        mask = torch.ones(x.size(0), device="cuda:0")
        return x * mask
    ```

    ## Use instead
    ```python
    def forward(self, x):
        mask = torch.ones(x.size(0), device=x.device)  # or a registered buffer
        return x * mask
    ```
    `.cuda()` and `device="cuda"` without an index follow the current device and are fine.

    ## Known problems
    Only literal indices are reported, and only in classes known to be wrapped: manual model
    parallelism (`x.to("cuda:1")` between stages) in an unwrapped module is legitimate. A launcher
    that shows each DDP rank only its own GPU (`CUDA_VISIBLE_DEVICES` set per rank) makes `cuda:0`
    every rank's own GPU; the wrap does not say so, and such a program is reported.
    """

    code = "DPL104"
    name = "hard-coded-device-in-forward"
    summary = "`forward` of a DataParallel- or DDP-wrapped module puts tensors on a literal GPU index."
    triggers = GuardedPattern(r"cuda:\d|\.cuda\(\s*\d|\.to\(\s*\d|device\(", ["cuda:", ".cuda(", ".to(", "device("])

    VALID = [
        Valid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    mask = torch.ones(x.size(0), device=x.device)
                    bias = torch.zeros(1).cuda()  # the current device: each replica's own
                    return x * mask + bias.to("cuda")

            model = nn.DataParallel(Net())
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class TwoStage(nn.Module):  # manual model parallelism, not wrapped in DataParallel
                def __init__(self):
                    super().__init__()
                    self.first = nn.Linear(8, 8).to("cuda:0")
                    self.second = nn.Linear(8, 2).to("cuda:1")

                def forward(self, x):
                    return self.second(self.first(x.to("cuda:0")).to("cuda:1"))
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.anchor = torch.zeros(4).to("cuda:0")  # __init__, not forward (DPL103's business)

                def forward(self, x):
                    return x

            model = nn.DataParallel(Net())
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP

            class Net(nn.Module):
                def forward(self, x):
                    return x * torch.ones(x.size(1), device="cuda:0")  # rank 1: GPU 0 beside GPU 1

            model = DDP(Net().cuda(rank), device_ids=[rank])
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    mask = torch.ones(x.size(0), device="cuda:0")
                    return x * mask

            model = nn.DataParallel(Net())
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x, h):
                    return x + h.cuda(0)

            model = nn.DataParallel(Net(), device_ids=[0, 1])
            """,
            line=5,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    pos = torch.arange(x.size(1)).to(torch.device("cuda", 1))
                    return x + pos

            model = nn.DataParallel(Net())
            """,
            line=6,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        wrapped = project.wraps_any(module_classes) or any(name in project.distributed_wrapped for name in module_classes)
        return wrapped and self.triggers.search(text) is not None

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for class_name, forward, runs_on in _wrapped_forwards(ctx):
            for statement in iter_small_statements(block_body(forward.body), into_functions=False):
                for call in iter_calls(statement):
                    device = self._literal_index(ctx, call)
                    if device is not None:
                        yield Report(
                            node=call,
                            message=(
                                f"`{ctx.short_code(call, 30)}` pins a tensor to {device} in `{class_name}.forward`, which "
                                f"{runs_on}."
                            ),
                            help="Use `device=x.device` (or `.to(x.device)`), or register the tensor as a buffer.",
                            statement=statement,
                        )

    @staticmethod
    def _literal_index(ctx: FileContext, call: cst.Call) -> Optional[str]:
        """The literal device index the call creates or moves a tensor on, as words."""
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        candidates = [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "device"]
        if method in ("cuda", "to") and positional and ctx.qualify(call.func) is None:
            candidates.append(positional[0])
        for candidate in candidates:
            if isinstance(candidate, cst.Integer):  # `.cuda(0)`, `.to(1)`, `device=0`
                return f"GPU {candidate.value}"
            if isinstance(candidate, cst.SimpleString) and INDEXED_DEVICE.fullmatch(str(candidate.evaluated_value)):
                return f"`{candidate.evaluated_value}`"
            if isinstance(candidate, cst.Call) and ctx.qualify(candidate.func) == "torch.device":
                args = [a.value for a in candidate.args]
                if len(args) == 2 and isinstance(args[1], cst.Integer):
                    return f"GPU {args[1].value}"
                if args and isinstance(args[0], cst.SimpleString) and INDEXED_DEVICE.fullmatch(str(args[0].evaluated_value)):
                    return f"`{args[0].evaluated_value}`"
        return None



def _wrapped_forwards(ctx: FileContext) -> Iterator[Tuple[str, cst.FunctionDef, str]]:
    """Each `forward` of this file run by DataParallel or DDP, and where it runs, in words."""
    inference: Inference = Inference.of(ctx)
    for class_name, model in inference.classes.items():
        wraps: List[Wrap] = [
            wrap
            for table in (ctx.project.wrapped, ctx.project.distributed_wrapped)
            for wrap in table.get(class_name, ())
            if wrap.class_name != class_name or wrap.can_mean(ctx.module_name, ctx.filename)
        ]
        if not wraps:
            continue
        runs_on = "DataParallel runs on every GPU" if any(not w.distributed for w in wraps) else "DDP runs on each rank's own GPU"
        for statement in block_body(model.node.body):
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "forward":
                yield class_name, statement, runs_on
