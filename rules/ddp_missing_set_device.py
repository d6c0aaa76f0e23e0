from __future__ import annotations

import re
from typing import Iterator, Optional

import libcst as cst

from dplint.analysis.names import signed_integer_value
from dplint.analysis.context import FileContext
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.torch_api import INIT_PROCESS_GROUP
from dplint.analysis.ddp import (
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
    `.cuda(local_rank)`, `.to(rank)` or `device_ids=[gpu_id]` anywhere in the project.

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
    Any one of these selections anywhere in the project silences the rule, even in another program;
    so does a per-rank `CUDA_VISIBLE_DEVICES` set in the program. A program that places nothing on a
    GPU itself (a launcher's smoke test) and a group of one process (`world_size=1`) are not reported.
    A per-rank `CUDA_VISIBLE_DEVICES` exported by a launch script is not seen.
    """

    code = "DPL508"
    preview = True
    preview_reason = (
        "Measured 0.00 on the 904 repositories of bench/wild (0 true, 2 false, 0 moot): ranks that each see one GPU through a launch script's `CUDA_VISIBLE_DEVICES` are reported."
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
        Valid(
            """
            import os
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            class Trainer:
                def __init__(self, model):
                    dist.init_process_group(backend="nccl")
                    self.gpu_id = int(os.environ["GPU"])
                    self.model = DDP(model.to(self.gpu_id), device_ids=[self.gpu_id])
            """
        ),
        Valid(
            """
            import os
            import torch.distributed as dist
            from mpi4py import MPI
            os.environ["CUDA_VISIBLE_DEVICES"] = str(MPI.COMM_WORLD.Get_rank() % 8)  # one GPU per rank
            dist.init_process_group("nccl")
            model = Net().cuda()
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            dist.init_process_group("nccl")  # a launcher smoke test: nothing goes on a GPU
            print(dist.get_rank(), dist.get_world_size())
            dist.destroy_process_group()
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            dist.init_process_group("nccl", "tcp://localhost:10638", world_size=1, rank=0)
            model = FSDP(Net().cuda(), cpu_offload=CPUOffload(offload_params=True))
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
                return torch.zeros(1, device="cuda")
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
        facts = program_or_file(ctx)
        if facts.selects_device or not facts.places_on_gpu:
            return  # a launcher's smoke test that only starts the group touches no GPU of its own
        for scope in iter_scopes(ctx.module):
            for call in scope_calls(scope):
                if (
                    ctx.qualify(call.func) in INIT_PROCESS_GROUP
                    and _may_be_nccl(ctx, scope, argument(call, "backend", 0))
                    and not _one_process(argument(call, "world_size", 3))
                ):
                    yield Report(
                        node=call,
                        message="This NCCL process group starts, but no rank selects its own GPU: every rank uses GPU 0.",
                        help='Call `torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))` before initialising.',
                    )


def _one_process(world_size: Optional[cst.BaseExpression]) -> bool:
    """`world_size=1`: a group of one process (FairScale's CPU offloading), for which GPU 0 is right."""
    return signed_integer_value(world_size) == 1


def _may_be_nccl(ctx: FileContext, scope: ScopeInfo, backend) -> bool:
    if backend is None:
        return False
    for value in values_of(ctx, scope, backend) if not isinstance(backend, cst.SimpleString) else [backend]:
        for branch in branches(value):
            if isinstance(branch, cst.SimpleString) and "nccl" in str(branch.evaluated_value).lower():
                return True
    return False
