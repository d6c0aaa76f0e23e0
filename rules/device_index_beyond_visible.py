from __future__ import annotations

import re
from typing import Iterator, List, Optional, Tuple

import libcst as cst
from dplint.rules.cuda_visible_devices import variable_write

from dplint.analysis.context import FileContext
from dplint.analysis.torch_api import DATA_PARALLEL
from dplint.analysis.names import decimal_value, integer_value, iter_calls, iter_small_statements
from dplint.rule import Invalid, Report, Rule, Valid

INDEXED = re.compile(r"cuda:(\d+)")


class DeviceIndexBeyondVisible(Rule):
    """
    ## What it does
    When the file sets `CUDA_VISIBLE_DEVICES` to a literal list (`"0,3"`), checks the device
    indices used after it: `"cuda:3"`, `torch.device("cuda", 3)`, `.cuda(3)`, `.to(3)`,
    `torch.cuda.set_device(3)` and `device_ids=[0, 3]`, for indices that are not visible.

    ## Why is this bad?
    CUDA renumbers the visible devices from 0: with `CUDA_VISIBLE_DEVICES="0,3"` the process sees
    `cuda:0` (physical 0) and `cuda:1` (physical 3). `cuda:3` is then "invalid device ordinal" — and
    when fewer are missing, an index silently names a different physical GPU than the author meant.

    ## Example
    ```python
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,3"
    model = nn.DataParallel(model, device_ids=[0, 3])
    ```

    ## Use instead
    ```python
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,3"
    model = nn.DataParallel(model, device_ids=[0, 1])  # visible devices are renumbered 0..n-1
    ```

    ## Known problems
    Only a literal value set once in the file is used, and only uses written after it (in the file's
    text) are checked.
    """

    code = "DPL203"
    name = "device-index-beyond-visible"
    summary = "A device index that `CUDA_VISIBLE_DEVICES` (renumbered from 0) does not make visible."
    triggers = re.compile(r"CUDA_VISIBLE_DEVICES")

    VALID = [
        Valid(
            """
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = "2,3"
            import torch
            x = torch.zeros(1, device="cuda:1")  # physical 3
            """
        ),
        Valid(
            """
            import os
            import torch.nn as nn
            os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus  # not a literal: unknown
            model = nn.DataParallel(model, device_ids=[0, 3])
            """
        ),
        Valid(
            """
            import os
            import torch
            torch.cuda.set_device(3)  # before the assignment
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = "0,3"
            import torch.nn as nn
            model = nn.DataParallel(model, device_ids=[0, 3])
            """,
            line=4,
        ),
        Invalid(
            """
            import os
            os.environ.setdefault("CUDA_VISIBLE_DEVICES", "1")
            import torch
            x = torch.ones(2).to("cuda:1")
            """,
            line=4,
        ),
        Invalid(
            """
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = "4, 5"
            import torch
            torch.cuda.set_device(4)
            """,
            line=4,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        visible: Optional[List[str]] = None
        for statement in iter_small_statements(ctx.module.body):
            written = variable_write(ctx, statement)
            if written is not None:
                text = written.evaluated_value if isinstance(written, cst.SimpleString) else None
                devices = [d.strip() for d in text.split(",")] if isinstance(text, str) and text.strip() else None
                if visible is not None and devices != visible:
                    return  # set to different values: which one applies is not known
                visible = devices
                continue
            if visible is None:
                continue
            for node, index in _device_indices(ctx, statement):
                if index >= len(visible):
                    yield self._report(ctx, node, index, visible, statement)

    @staticmethod
    def _report(ctx: FileContext, node: cst.CSTNode, index: int, visible: List[str], statement) -> Report:
        count = len(visible)
        mapping = ", ".join(f"cuda:{i} = GPU {physical}" for i, physical in enumerate(visible))
        return Report(
            node=node,
            message=(
                f"`{ctx.short_code(node, 30)}` uses device {index}, but CUDA_VISIBLE_DEVICES=\"{','.join(visible)}\" "
                f"leaves {count} device{'s' * (count != 1)}, numbered from 0."
            ),
            help=f"Use the renumbered indices 0..{count - 1} ({mapping}).",
            statement=statement,
        )


def _device_indices(ctx: FileContext, statement: cst.CSTNode) -> Iterator[Tuple[cst.CSTNode, int]]:
    """Literal device indices a statement uses, each with the node that holds it."""
    for call in iter_calls(statement):
        qualified = ctx.qualify(call.func)
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) and qualified is None else None
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        if qualified == "torch.cuda.set_device" or method in ("cuda", "to"):
            index = integer_value(positional[0]) if positional else None
            if index is not None:
                yield call, index
        if qualified == "torch.device" and len(positional) == 2:
            index = integer_value(positional[1])
            if index is not None:
                yield call, index
        if qualified in DATA_PARALLEL or (qualified or "").endswith("DistributedDataParallel"):
            ids = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "device_ids"), None)
            if isinstance(ids, (cst.List, cst.Tuple)):
                for element in ids.elements:
                    index = integer_value(element.value)
                    if index is not None:
                        yield ids, index
        for arg in call.args:
            value = arg.value
            if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
                match = INDEXED.fullmatch(value.evaluated_value)
                index = decimal_value(match.group(1)) if match else None
                if index is not None and (qualified == "torch.device" or method in ("to", "cuda") or arg.keyword is not None and arg.keyword.value == "device"):
                    yield value, index
