from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Set

import libcst as cst

from dplint.analysis.facts import MODULE_RETURNING_METHODS
from dplint.analysis.inference import is_module_class_name
from dplint.analysis.names import dotted
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.ddp import USES_DISTRIBUTED, argument, calls_in, iter_scopes, iter_statements
from dplint.analysis.wrapping import DDP_CLASSES, wrapper_call

CASTS = frozenset({"half", "double", "bfloat16"})
MOVES = frozenset({"to", "cuda", "cpu"})
DESTROY_PROCESS_GROUP = frozenset(
    {"torch.distributed.destroy_process_group", "torch.distributed.distributed_c10d.destroy_process_group"}
)
LOW_PRECISION_DTYPES = frozenset(
    f"torch.{name}" for name in ("half", "float16", "bfloat16", "double", "float64")
)


@dataclass
class _Wrap:
    statement: cst.BaseSmallStatement  # its line is looked up only for a message
    wrappers: Set[str]  # names bound to the DDP model
    inner: Set[str]  # names of the wrapped module: the original name, `ddp.module`
    moved_before: bool


class ModelChangedAfterDdpWrap(Rule):
    """
    ## What it does
    After `ddp = DistributedDataParallel(net)` in the same function, finds changes to the wrapped
    model's parameters: a dtype cast (`.half()`, `.double()`, `.bfloat16()`, `.to(torch.float16)`), a
    device move (`.to(...)`, `.cuda()`, `.cpu()`) of a model that was not moved before the wrap,
    replacing a submodule (`net.fc = nn.Linear(...)`), or `load_state_dict` on some ranks only (under
    a rank condition), on `net`, `ddp.module` or `ddp`.

    ## Why is this bad?
    DDP broadcasts rank 0's parameters once, at construction, and from then on synchronises only
    gradients, of the parameters it registered then. A load on rank 0 alone leaves the ranks with
    different weights for the rest of training; a cast or move after wrapping replaces the tensors DDP
    reduces, so gradients stop being averaged; a new layer is unknown to DDP. No error is raised for
    the first two: the replicas silently drift apart. (The DDP docstring: "You should never try to
    change your model's parameters after wrapping up your model with DistributedDataParallel".)

    ## Example
    ```python
    model = DDP(net, device_ids=[local_rank])
    if rank == 0:
        net.load_state_dict(torch.load("pretrained.pt", map_location="cpu"))
    model.half()
    ```

    ## Use instead
    ```python
    net.load_state_dict(torch.load("pretrained.pt", map_location="cpu"))  # every rank, or rank 0: DDP broadcasts it
    net.half()
    model = DDP(net, device_ids=[local_rank])
    ```

    ## Known problems
    The wrap and the change must be in the same function. Nothing after `destroy_process_group()` is
    reported (teardown), nor a move of a model already moved before the wrap (`build().to(device)`). A load that every rank performs after the
    wrap keeps the ranks equal and is not reported.
    """

    code = "DPL511"
    preview = True
    preview_reason = (
        "Measured on 2 findings, both false: a move in the branch where the model was never wrapped, and a `.cuda()` of a model already on its GPU."
    )
    name = "model-changed-after-ddp-wrap"
    summary = "Parameters loaded on one rank, cast, moved or replaced after the DDP wrap: replicas drift apart."
    triggers = GuardedPattern(r"DistributedDataParallel|\bDDP\b", ["DistributedDataParallel", "DDP"], one_line=True)
    requires = USES_DISTRIBUTED
    distributed_programs_only = True

    VALID = [
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            net.load_state_dict(state)
            net = net.half().cuda(local_rank)
            model = DDP(net, device_ids=[local_rank])
            """
        ),
        Valid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net.to(device), device_ids=[local_rank])
            # every rank loads the same weights: the replicas stay equal
            model.module.load_state_dict(torch.load("last.pt", map_location="cpu"))
            model.to(device)  # already there: a no-op
            """
        ),
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            model.train()
            batch = batch.half()
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = build_model(cfg).to(device)
            if distributed:
                model = DDP(model, device_ids=[local_rank])
            model.to(device)
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            ddp_model = DDP(model, device_ids=[local_rank])
            train(ddp_model)
            dist.destroy_process_group()
            model.cpu()  # teardown: free the GPU before the next trial
            del model
            torch.cuda.empty_cache()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net, device_ids=[local_rank])
            if rank == 0:
                net.load_state_dict(pretrained)
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            def setup(net, local_rank):
                model = nn.parallel.DistributedDataParallel(net)
                model.module.to(torch.bfloat16)
                return model
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model)
            model.module.classifier = nn.Linear(512, 10)
            """,
            line=4,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for scope in iter_scopes(ctx.module):
            wrap: Optional[_Wrap] = None
            moved: Set[str] = set()
            for small in iter_statements(scope):
                if wrap is not None and any(ctx.qualify(call.func) in DESTROY_PROCESS_GROUP for call in calls_in(small)):
                    wrap = None  # teardown: no DDP step follows, so nothing can drift
                    continue
                if wrap is not None:
                    yield from self._changes(ctx, small, wrap)
                new_wrap = _wrap(ctx, small, moved)
                if new_wrap is not None:
                    wrap = new_wrap
                    continue
                moved.update(_moved_names(small))

    def _changes(self, ctx: FileContext, small: cst.BaseSmallStatement, wrap: _Wrap) -> Iterator[Report]:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                owner = dotted(target.target.value) if isinstance(target.target, cst.Attribute) else None
                value = small.value
                if owner in wrap.inner and isinstance(value, cst.Call) and is_module_class_name(ctx.qualify(value.func) or ""):
                    yield self._report(
                        small,
                        f"`{dotted(target.target)}` is replaced after the DDP wrap (line {ctx.line(wrap.statement)}): DDP never registered its parameters.",
                        "Replace submodules before `DistributedDataParallel(...)`.",
                    )
        for call in calls_in(small):
            if not isinstance(call.func, cst.Attribute):
                continue
            receiver = dotted(call.func.value)
            method = call.func.attr.value
            if receiver not in wrap.inner and receiver not in wrap.wrappers:
                continue
            if method in CASTS or (method == "to" and _casts(ctx, call)):
                yield self._report(
                    call,
                    f"`{receiver}.{method}(...)` casts the parameters after the DDP wrap (line {ctx.line(wrap.statement)}): replicas drift apart.",
                    "Cast the model before wrapping it in `DistributedDataParallel`.",
                )
            elif method in MOVES and not wrap.moved_before:
                yield self._report(
                    call,
                    f"`{receiver}.{method}(...)` moves the parameters after the DDP wrap (line {ctx.line(wrap.statement)}): DDP keeps the old ones.",
                    "Move the model to the rank's device before wrapping it in `DistributedDataParallel`.",
                )
            elif method == "load_state_dict" and _on_some_ranks_only(ctx, call):
                yield self._report(
                    call,
                    f"`{receiver}.load_state_dict` runs on some ranks only, after the DDP wrap (line {ctx.line(wrap.statement)}): ranks keep different weights.",
                    "Load before wrapping (DDP broadcasts rank 0's weights), or load on every rank.",
                )

    def _report(self, node: cst.CSTNode, message: str, help: str) -> Report:
        return Report(node=node, message=message, help=help)


def _on_some_ranks_only(ctx: FileContext, node: cst.CSTNode) -> bool:
    where = ctx.local_where(node)
    return where is not None and where.on_some_ranks_only


def _wrap(ctx: FileContext, small: cst.BaseSmallStatement, moved: Set[str]) -> Optional[_Wrap]:
    if not isinstance(small, cst.Assign):
        return None
    call = wrapper_call(ctx, small.value, DDP_CLASSES)
    if call is None:
        return None
    module = argument(call, "module", 0)
    moved_before = module is not None and _chain_moves(module)
    while isinstance(module, cst.Call) and isinstance(module.func, cst.Attribute) and module.func.attr.value in MODULE_RETURNING_METHODS:
        module = module.func.value
    inner_name = dotted(module) if module is not None else None
    wrappers = {name for name in (dotted(t.target) for t in small.targets) if name}
    inner = {f"{name}.module" for name in wrappers}
    if inner_name is not None and inner_name not in wrappers:
        inner.add(inner_name)
    moved_before = moved_before or bool(inner_name and inner_name in moved)
    return _Wrap(small, wrappers, inner, moved_before)


def _moved_names(small: cst.BaseSmallStatement) -> Set[str]:
    """The names a statement moves to a device: `net.cuda()`, and `net = build().to(device)`."""
    names = {dotted(call.func.value) or "" for call in calls_in(small) if isinstance(call.func, cst.Attribute) and call.func.attr.value in MOVES}
    if isinstance(small, cst.Assign) and _chain_moves(small.value):
        names.update(name for name in (dotted(target.target) for target in small.targets) if name)
    return names


def _chain_moves(expr: cst.BaseExpression) -> bool:
    """Whether `build(...).to(device).train()` moves what it returns: a move among its chained methods."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in MODULE_RETURNING_METHODS:
        if expr.func.attr.value in MOVES:
            return True
        expr = expr.func.value
    return False


def _casts(ctx: FileContext, call: cst.Call) -> bool:
    dtype = argument(call, "dtype", 0)
    return dtype is not None and ctx.qualify(dtype) in LOW_PRECISION_DTYPES
