from __future__ import annotations

import re
from typing import Iterator, List

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.ddp import argument, iter_scopes, scope_calls
from dplint.analysis.names import descendants
from dplint.analysis.wrapping import DDP_CLASSES
from dplint.rule import Invalid, Report, Rule, Valid

# Calls whose argument selects a CUDA device by its index on this node.
_SELECTS_DEVICE = {
    "torch.cuda.set_device": ("device", 0),
    "torch.accelerator.set_device_index": ("device", 0),
    "torch.cuda.device": ("device", 0),
}


class GlobalRankAsDevice(Rule):
    """
    ## What it does
    Finds the global rank used as a CUDA device index: `torch.cuda.set_device(rank)`, `.to(rank)`,
    `.cuda(rank)`, `torch.device("cuda", rank)`, `f"cuda:{rank}"` or `device_ids=[rank]` of
    `DistributedDataParallel`, where `rank` holds the rank of the process in
    the whole job (`RANK`, `SLURM_PROCID`, `dist.get_rank()`, or a value built from them) rather than
    its rank on its node (`LOCAL_RANK`, `mp.spawn`'s process index, `rank % torch.cuda.device_count()`).
    At runtime, `dplint run --nnodes 2` stops with this code at the line where a rank of the second node
    asks for the GPU its global rank names, one its node does not have.

    ## Why is this bad?
    A node's GPUs are numbered from 0 on every node. On one node the global rank and the local rank are
    the same number, so the script works; on the second node the ranks are 8-15 while the GPUs are
    0-7, and `set_device(8)` fails with "invalid device ordinal" (or, where fewer ranks than GPUs run,
    two nodes' ranks put their work on GPUs other than the ones the launcher gave them).

    ## Example
    ```python
    rank = int(os.environ["RANK"])
    dist.init_process_group("nccl")
    model = DDP(Net().to(rank), device_ids=[rank])
    ```

    ## Use instead
    ```python
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    model = DDP(Net().to(local_rank), device_ids=[local_rank])
    ```

    ## Known problems
    A value counts as the global rank only where the program shows it: assigned from `RANK` (or
    `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`), from `dist.get_rank()`, passed as a parameter
    that every call gives such a value, or an unassigned name spelled `global_rank`, `dist_rank` or
    `ddp_rank`. A program meant for one node only is reported too: it fails on the first multi-node run.
    """

    code = "DPL516"
    preview = True
    preview_reason = (
        "Measured 0.87 on the 904 repositories of bench/wild (83 true, 12 false, 44 moot): a group started with `rank=local_rank` on one node makes "
        "`dist.get_rank()` the local rank, and single-node scripts are moot."
    )
    name = "global-rank-as-device"
    summary = "The global rank used as a CUDA device index: right on one node, an invalid GPU on the next."
    triggers = re.compile(r"set_device|device_ids|\.to\(|\.cuda\(|torch\.device|cuda:|cuda\.device")
    distributed_programs_only = True

    VALID = [
        Valid(
            """
            import os
            import torch
            import torch.distributed as dist
            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl")
            torch.cuda.set_device(local_rank)
            model = Net().to(local_rank)
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            device = dist.get_rank() % torch.cuda.device_count()
            model = Net().to(device)
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp

            def worker(rank, world_size):
                dist.init_process_group("nccl", rank=rank, world_size=world_size)
                model = Net().to(rank)  # the spawn index: the GPU on this node

            mp.spawn(worker, args=(2,), nprocs=2)
            """
        ),
        Valid(
            """
            import os
            import torch
            import torch.distributed as dist
            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("gloo", rank=local_rank)  # DPL519: get_rank() returns this local rank
            torch.cuda.set_device(dist.get_rank())
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import os
            import torch
            import torch.distributed as dist
            rank = int(os.environ["RANK"])
            dist.init_process_group("nccl")
            torch.cuda.set_device(rank)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            dist.init_process_group("nccl")
            rank = dist.get_rank()
            model = DDP(Net().cuda(), device_ids=[rank])
            """,
            line=6,
        ),
        Invalid(
            """
            import os
            import torch.distributed as dist

            def train(rank):
                batch = load().to(f"cuda:{rank}")

            dist.init_process_group("nccl")
            train(int(os.environ["RANK"]))
            """,
            line=5,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for device in _device_indices(ctx):
            if ctx.rank_kind(device) == "global":
                yield Report(
                    node=device,
                    message=f"`{ctx.short_code(device)}` is the global rank, used here as a GPU index: on a second node that GPU does not exist.",
                    help='Use the rank on this node: `int(os.environ["LOCAL_RANK"])`, or `rank % torch.cuda.device_count()`.',
                )


def _device_indices(ctx: FileContext) -> Iterator[cst.BaseExpression]:
    """Every expression the file uses as a CUDA device index."""
    for scope in iter_scopes(ctx.module):
        for call in scope_calls(scope):
            qualified = ctx.qualify(call.func)
            if qualified in _SELECTS_DEVICE:
                yield from _present(argument(call, *_SELECTS_DEVICE[qualified]))
            elif qualified == "torch.device":
                kind, index = argument(call, "type", 0), argument(call, "index", 1)
                if isinstance(kind, cst.SimpleString) and kind.evaluated_value == "cuda":
                    yield from _present(index)
            elif qualified in DDP_CLASSES:
                ids = argument(call, "device_ids", 1)
                if isinstance(ids, (cst.List, cst.Tuple)) and len(ids.elements) == 1:
                    yield ids.elements[0].value
            elif isinstance(call.func, cst.Attribute) and call.func.attr.value in ("to", "cuda"):
                moved = argument(call, "device", 0)
                if moved is not None and not isinstance(moved, (cst.SimpleString, cst.FormattedString, cst.Integer)):
                    yield moved
    for node in descendants(ctx.module):
        if isinstance(node, cst.FormattedString):
            yield from _cuda_index_in(node)


def _present(node) -> List[cst.BaseExpression]:
    return [node] if node is not None else []


def _cuda_index_in(text: cst.FormattedString) -> Iterator[cst.BaseExpression]:
    """`f"cuda:{rank}"`: the expression right after the text `cuda:`."""
    parts = text.parts
    for before, part in zip(parts, parts[1:]):
        if isinstance(before, cst.FormattedStringText) and before.value.endswith("cuda:") and isinstance(part, cst.FormattedStringExpression):
            yield part.expression
