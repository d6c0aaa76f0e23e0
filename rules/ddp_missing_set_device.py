from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from dplint.context import FileContext
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.ddp import (
    INIT_PROCESS_GROUP,
    ScopeInfo,
    argument,
    branches,
    iter_scopes,
    program_or_file,
    scope_calls,
    values_of,
)


class MissingSetDevice(Rule):
    """
    ## What it does
    Finds `init_process_group` with the NCCL backend (also `"nccl" if cuda else "gloo"`) in a project
    that never selects the rank's own GPU: no `torch.cuda.set_device(...)`, no
    `init_process_group(device_id=...)`, no `f"cuda:{local_rank}"`, `torch.device("cuda", rank)`,
    `.cuda(local_rank)`, `.to(rank)` or `device_ids=[local_rank]` anywhere in the project.

    ## Why is this bad?
    Without a selected device, every rank's bare `.cuda()`, `"cuda"` tensors, NCCL barriers and
    `torch.load` of GPU checkpoints use GPU 0. Each extra process costs a CUDA context there (hundreds
    of MB), so eight ranks pile onto one GPU: out-of-memory errors, slowdowns, or hangs at the first
    collective, while the other GPUs sit idle.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = DDP(Net().cuda())
    ```

    ## Use instead
    ```python
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    model = DDP(Net().cuda(), device_ids=[local_rank])
    ```

    ## Known problems
    Any one of these selections anywhere in the project silences the rule, even in another program.
    """

    code = "DPL508"
    preview = True
    preview_reason = (
        "Measured 0.00: ranks that place every tensor with their local rank explicitly (`.to(gpu_id)`), or that see one GPU each, are reported."
    )
    name = "missing-set-device"
    summary = "An NCCL process group whose ranks never select their own GPU: every rank piles onto GPU 0."
    triggers = re.compile(r"nccl")
    distributed_programs_only = True

    VALID = [
        Valid(
            """
            import os
            import torch
            import torch.distributed as dist
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl")
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("gloo")  # a CPU job
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            dist.init_process_group(backend="nccl")
            model = DDP(net.to(rank), device_ids=[rank])
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            model = net.cuda()
            """,
            line=3,
        ),
        Invalid(
            """
            import torch

            def setup():
                backend = "nccl" if torch.cuda.is_available() else "gloo"
                torch.distributed.init_process_group(backend=backend, init_method="env://")
            """,
            line=5,
        ),
        Invalid(
            """
            from torch.distributed import init_process_group
            from torch.nn.parallel import DistributedDataParallel as DDP
            init_process_group(backend="nccl")
            model = DDP(net.cuda(), device_ids=None)
            """,
            line=3,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        if program_or_file(ctx).selects_device:
            return
        for scope in iter_scopes(ctx.module):
            for call in scope_calls(scope):
                if ctx.qualify(call.func) in INIT_PROCESS_GROUP and _may_be_nccl(ctx, scope, argument(call, "backend", 0)):
                    yield Report(
                        node=call,
                        message="This NCCL process group starts, but no rank selects its own GPU: every rank uses GPU 0.",
                        help='Call `torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))` before initialising.',
                    )


def _may_be_nccl(ctx: FileContext, scope: ScopeInfo, backend) -> bool:
    if backend is None:
        return False
    for value in values_of(ctx, scope, backend) if not isinstance(backend, cst.SimpleString) else [backend]:
        for branch in branches(value):
            if isinstance(branch, cst.SimpleString) and "nccl" in str(branch.evaluated_value).lower():
                return True
    return False
