from __future__ import annotations

from typing import Iterator, Optional, Sequence

import libcst as cst

from dplint.analysis.facts import MODULE_RETURNING_METHODS, ProjectFacts
from dplint.analysis.torch_api import DATA_PARALLEL, DISTRIBUTED_DATA_PARALLEL
from dplint.analysis.context import FileContext
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.names import dotted, iter_calls
from dplint.analysis.wrapping import Point, scope_points
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.ddp import argument


_DATA_PARALLEL = GuardedPattern(r"(?<!Distributed)DataParallel\b", ["DataParallel"])


class DataParallelInsideDdp(Rule):
    """
    ## What it does
    Finds `DistributedDataParallel(...)` wrapping an `nn.DataParallel` model: directly, or a name the
    same function bound to one.

    ## Why is this bad?
    DDP over a multi-device module is the removed "single-process multi-device" mode: each DDP process
    must drive one device. DataParallel inside DDP replicates the model again in every forward, on
    devices other ranks also use, and its gradients reach DDP through the scatter/gather copies. It is
    unsupported, slow, and typically an accident of code that wraps "for multi-GPU" twice.

    ## Example
    ```python
    model = nn.DataParallel(net)
    model = DDP(model, device_ids=[local_rank])
    ```

    ## Use instead
    ```python
    model = DDP(net.to(local_rank), device_ids=[local_rank])
    ```

    ## Known problems
    Only a wrap in the same function is seen, and only one that is made on every path to the DDP wrap:
    `if n_gpu > 1: model = nn.DataParallel(model)` followed by `if local_rank != -1: model = DDP(model)`
    is the usual pair of exclusive modes (Hugging Face scripts set `n_gpu = 1` under DDP), and whether
    two conditions exclude each other is not decided from their text.
    """

    code = "DPL514"
    preview = True
    preview_reason = (
        "Its 15 findings before this release were all exclusive branches; it now reports none on the sweep, so there is no measurement of its precision yet."
    )
    name = "data-parallel-inside-ddp"
    summary = "`DistributedDataParallel(nn.DataParallel(...))`: two data-parallel wrappers, an unsupported mode."
    triggers = GuardedPattern(r"DistributedDataParallel|\bDDP\b", ["DistributedDataParallel", "DDP"], one_line=True)

    VALID = [
        Valid(
            """
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net, device_ids=[local_rank]) if distributed else nn.DataParallel(net)
            """
        ),
        Valid(
            """
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP
            if distributed:
                model = DDP(net)
            else:
                model = nn.DataParallel(net)
            """
        ),
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net.cuda(local_rank), device_ids=[local_rank])
            """
        ),
        Valid(
            """
            import torch
            # pytorch/examples imagenet: one name, wrapped by DDP on one branch and DataParallel on another
            if args.distributed:
                model.cuda(args.gpu)
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
            elif args.gpu is not None:
                model = model.cuda(args.gpu)
            else:
                model = torch.nn.DataParallel(model).cuda()
            """
        ),
        Valid(
            """
            import torch
            # Hugging Face scripts: DDP sets n_gpu = 1, so the two wraps are exclusive modes.
            if args.n_gpu > 1:
                model = torch.nn.DataParallel(model)
            if args.local_rank != -1:
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
            """
        ),
        Valid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            # yolov5/yolov7: DataParallel only when rank == -1, DDP only when it is not.
            if cuda and rank == -1 and torch.cuda.device_count() > 1:
                model = torch.nn.DataParallel(model)
            if cuda and rank != -1:
                model = DDP(model, device_ids=[opt.local_rank])
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP
            if use_cuda:
                model = nn.DataParallel(net)
                model = DDP(model, device_ids=[local_rank])
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = nn.DataParallel(net)
            model = DDP(model, device_ids=[local_rank])
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.DataParallel(net).cuda())
            """,
            line=2,
        ),
        Invalid(
            """
            import torch.nn as nn

            def wrap(net, rank):
                parallel = nn.DataParallel(net, device_ids=[0, 1])
                return nn.parallel.DistributedDataParallel(parallel)
            """,
            line=5,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        return super().applies_to(text, module_classes, project) and _DATA_PARALLEL.search(text) is not None

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for point in scope_points(ctx):
            for call in iter_calls(point.statement):
                if ctx.qualify(call.func) in DISTRIBUTED_DATA_PARALLEL and self._wraps_data_parallel(ctx, point, _strip(argument(call, "module", 0))):
                    yield Report(
                        node=call,
                        message="This `DistributedDataParallel` wraps an `nn.DataParallel` model: each DDP process must drive one device.",
                        help="Wrap the plain model: `DDP(net.to(local_rank), device_ids=[local_rank])`.",
                    )

    @staticmethod
    def _wraps_data_parallel(ctx: FileContext, point: Point, inner: Optional[cst.BaseExpression]) -> bool:
        """`DDP(nn.DataParallel(net))`, or a name that holds a DataParallel wrapper on every path to here:
        a wrap made under a condition this path does not also take (`if n_gpu > 1:` before `if
        local_rank != -1:`) may be on the other branch of one mode switch, so it is not reported."""
        if isinstance(inner, cst.Call):
            return ctx.qualify(inner.func) in DATA_PARALLEL
        name = dotted(inner) if inner is not None else None
        sites = point.wrapped.get(name, frozenset()) if name is not None else frozenset()
        taken = set(point.path)
        return any(site.wrapper == "DataParallel" and set(site.conditions) <= taken for site in sites)


def _strip(expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in MODULE_RETURNING_METHODS:
        expr = expr.func.value
    return expr
