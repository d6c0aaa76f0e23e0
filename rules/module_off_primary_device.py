from __future__ import annotations

import re
from typing import Iterator, List, Optional, Sequence, Set

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.torch_api import DATA_PARALLEL
from dplint.analysis.inference import Inference, Scope
from dplint.analysis.names import decimal_value, descendants, dotted, integer_value, iter_calls
from dplint.rule import Invalid, Report, Rule, Valid


class ModuleOffPrimaryDevice(Rule):
    """
    ## What it does
    Statically: reports `nn.DataParallel(module, device_ids=[...])` where the module was moved to a
    literal GPU (`model.cuda(1)`, `.to("cuda:1")`, directly in the call or in the assignment of the
    name passed) that is not `device_ids[0]`, wherever the wrap is written (assigned, returned,
    passed on, chained with `.cuda()`, in a conditional expression or a comprehension).
    `device_ids=[1, 0]` with the module on `cuda:1` is correct.

    At runtime, checks before every `nn.DataParallel` forward that all parameters and buffers of the
    wrapped module are on `device_ids[0]` (under simulation: on the device of the simulated
    replicas), and names every one that is not.

    ## Why is this bad?
    DataParallel broadcasts the module from `device_ids[0]` to the other GPUs. A parameter left on
    another device (or on `meta`, after a lazy initialisation) makes it raise "module must have its
    parameters and buffers on device cuda:0 (device_ids[0]) but found one of them on device: cuda:1"
    without saying which one, typically after a submodule was moved separately or created after the
    model was moved.

    ## Example
    ```python
    model = Net().cuda(1)
    model = nn.DataParallel(model, device_ids=[0, 1])
    ```

    ## Use instead
    ```python
    model = Net().to("cuda:0")  # device_ids[0]
    model = nn.DataParallel(model, device_ids=[0, 1])
    ```

    ## Known problems
    Statically, only literal devices and a literal `device_ids` list are compared. At runtime, the result is cached per module and re-checked only when parameters or buffers are registered
    or moved (`Module.to/cuda/cpu/_apply`); replacing `param.data` directly is not noticed.
    """

    code = "DPL103"
    name = "module-off-primary-device"
    summary = "A parameter or buffer of a DataParallel-wrapped module is not on `device_ids[0]`."
    triggers = re.compile(r"DataParallel\(")
    moves = re.compile(r"""\.cuda\(\s*\d|cuda:\d|torch\.device\(\s*["']cuda["']\s*,""")

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        """A wrap, and a module moved to a literal GPU index somewhere in the file."""
        return self.triggers.search(text) is not None and self.moves.search(text) is not None

    VALID = [
        Valid(
            """
            import torch.nn as nn
            model = nn.DataParallel(Net().cuda(1), device_ids=[1, 0])
            """
        ),
        Valid(
            """
            import torch.nn as nn
            model = Net().to("cuda:0")
            model = nn.DataParallel(model, device_ids=[0, 1, 2])
            """
        ),
        Valid(
            """
            import torch.nn as nn
            model = nn.DataParallel(Net().cuda(), device_ids=gpus)  # not literal: not compared
            """
        ),
        Valid(
            """
            import torch.nn as nn
            net = Net().cuda(1)
            nets = [nn.DataParallel(net, device_ids=[0, 1]) for net in backbones]  # not the `net` above
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            model = nn.DataParallel(Net().cuda(1), device_ids=[0, 1])
            """,
            line=2,
        ),
        Invalid(
            """
            import torch.nn as nn
            net = Net().to("cuda:2")
            net = nn.DataParallel(net, device_ids=(0, 1, 2))
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            from torch.nn import DataParallel
            model = DataParallel(Net().to(torch.device("cuda", 1)), [0, 1])
            """,
            line=3,
        ),
        Invalid(
            """
            import torch.nn as nn

            def build(model):
                return nn.DataParallel(model.cuda(1), device_ids=[0, 1]).cuda()
            """,
            line=4,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        for line, scope in inference.statements:
            for small in line.body:
                wraps = [call for call in iter_calls(small) if call.args and ctx.qualify(call.func) in DATA_PARALLEL]
                # A comprehension's own variables are not the names the scope binds.
                local = _comprehension_names(small) if wraps else set()
                for value in wraps:
                    ids = _device_ids(value)
                    module = value.args[0].value
                    moved = None if dotted(module) in local else _moved_to(ctx, module, scope)
                    if ids and moved is not None and moved != ids[0]:
                        yield Report(
                            node=value,
                            message=(
                                f"The module is on cuda:{moved} but `device_ids` starts with {ids[0]}: "
                                "DataParallel raises at the first forward."
                            ),
                            help=f"Move the module to `cuda:{ids[0]}`, or list `{moved}` first in `device_ids`.",
                            statement=small,
                        )


def _comprehension_names(small: cst.CSTNode) -> Set[str]:
    names: Set[str] = set()
    for node in descendants(small):
        if isinstance(node, cst.CompFor):
            names.update(n.value for n in descendants(node.target) if isinstance(n, cst.Name))
    return names


def _device_ids(call: cst.Call) -> Optional[List[int]]:
    value = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "device_ids"), None)
    positional = [a.value for a in call.args if a.keyword is None]
    if value is None and len(positional) > 1:
        value = positional[1]
    if not isinstance(value, (cst.List, cst.Tuple)):
        return None
    ids = [integer_value(e.value) for e in value.elements]
    return None if None in ids else ids  # type: ignore[return-value]


def _moved_to(ctx: FileContext, node: cst.BaseExpression, scope: Scope, depth: int = 0) -> Optional[int]:
    """The literal GPU index a module expression was moved to (`.cuda(1)`, `.to("cuda:1")`), else None."""
    if depth > 3:
        return None
    if isinstance(node, cst.Name):
        bindings = scope.bindings.get(node.value, [])
        moves = {_moved_to(ctx, b.value, scope, depth + 1) for b in bindings if b.value is not None}
        moves.discard(None)
        return moves.pop() if len(moves) == 1 else None
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
        return None
    method, args = node.func.attr.value, [a.value for a in node.args if a.keyword is None]
    if method == "cuda" and args:
        return integer_value(args[0])
    if method == "to" and args:
        target = args[0]
        if isinstance(target, cst.SimpleString) and re.fullmatch(r"cuda:\d+", str(target.evaluated_value)):
            return decimal_value(str(target.evaluated_value).split(":")[1])
        if isinstance(target, cst.Call) and ctx.qualify(target.func) == "torch.device":
            device_args = [a.value for a in target.args]
            if len(device_args) == 2:
                return integer_value(device_args[1])
    return _moved_to(ctx, node.func.value, scope, depth + 1) if method in ("float", "half", "double", "train", "eval") else None
