from __future__ import annotations

import re
from typing import Iterator, Optional, Tuple

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.ddp import DISTRIBUTED_SAMPLERS, ScopeInfo, argument, iter_scopes, scope_calls
from dplint.analysis.torch_api import INIT_PROCESS_GROUP
from dplint.analysis.names import iter_small_statements
from dplint.rule import Invalid, Report, Rule, Valid


class LocalRankAsGlobalRank(Rule):
    """
    ## What it does
    Finds the local rank passed where torch wants the rank of the process in the whole job:
    `dist.init_process_group(rank=local_rank)` and `DistributedSampler(dataset, rank=local_rank)`,
    where `local_rank` holds the rank of the process on its node (`LOCAL_RANK`, `--local_rank`,
    `rank % torch.cuda.device_count()`, or `mp.spawn`'s process index where one spawn per node starts
    the group). At runtime, `dplint run --nnodes 2` stops with this code at
    `init_process_group` on the second node.

    ## Why is this bad?
    On one node the local rank and the global rank are the same number, so the script works in every
    single-node test. On a second node the local ranks start again from 0: with `rank=local_rank`,
    two processes claim each global rank and ranks 8-15 of a 16-process group are never claimed. The
    group never forms: its processes wait for the ranks nobody claims until the timeout (torch 2.13
    over torchrun's store: `DistStoreError: wait timeout ... keys: /default_pg/...`). A
    `DistributedSampler` given the local rank hands every node the same shards: with two nodes, half
    the data set is never trained on, and nothing fails.

    ## Example
    ```python
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl", rank=local_rank, world_size=int(os.environ["WORLD_SIZE"]))
    sampler = DistributedSampler(dataset, rank=local_rank)
    ```

    ## Use instead
    ```python
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")  # torchrun's RANK and WORLD_SIZE
    sampler = DistributedSampler(dataset)  # dist.get_rank() and dist.get_world_size()
    ```

    ## Known problems
    A value counts as the local rank only where the program shows it, as for DPL516: from
    `LOCAL_RANK` (or `SLURM_LOCALID`, `OMPI_COMM_WORLD_LOCAL_RANK`), `dist.get_node_local_rank()`,
    a rank modulo a count, `mp.spawn`'s process index, or an unassigned name such as `args.local_rank`.
    `node_rank * nproc_per_node + local_rank` is the global rank. Where the group is known to be one
    node's, the local rank is the global rank and nothing is reported: a group of
    `torch.cuda.device_count()` processes, one that meets at a loopback address
    (`init_method="tcp://127.0.0.1:..."`, or `os.environ["MASTER_ADDR"] = "localhost"` in the function
    that starts it), or one `mp.spawn` starts. A spawn is reported only where
    it starts part of the group: the group's size is its `nprocs` times another number
    (`world_size = gpus * nodes` with `nprocs=gpus`). A script meant for one node only, launched with
    `torchrun --nnodes 1`, is reported: the launcher's command line is not read.
    """

    code = "DPL519"
    preview = True
    preview_reason = "Too few findings to judge: 28 on the 904 repositories of bench/wild (18 true, 0 false, 10 moot where the launcher runs one node, labelled blind), under the 30 the stable tier needs; it does not read shell launchers' `--nnodes 1`."
    name = "local-rank-as-global-rank"
    summary = "The local rank passed as the global rank: right on one node, two processes per rank on the next."
    triggers = re.compile(r"init_process_group|DistributedSampler")
    distributed_programs_only = True

    VALID = [
        Valid(
            """
            import os
            import torch.distributed as dist
            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp

            def worker(rank, world_size):
                dist.init_process_group("nccl", rank=rank, world_size=world_size)

            world_size = torch.cuda.device_count()
            mp.spawn(worker, args=(world_size,), nprocs=world_size)
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            import torch.multiprocessing as mp

            def worker(gpu, args):
                rank = args.node_rank * args.gpus + gpu
                dist.init_process_group("nccl", rank=rank, world_size=args.gpus * args.nodes)

            mp.spawn(worker, args=(args,), nprocs=args.gpus)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import os
            import torch.distributed as dist
            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl", rank=local_rank, world_size=int(os.environ["WORLD_SIZE"]))
            """,
            line=4,
        ),
        Invalid(
            """
            import os
            import torch.distributed as dist
            from torch.utils.data.distributed import DistributedSampler
            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl")
            sampler = DistributedSampler(dataset, dist.get_world_size(), local_rank)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.distributed as dist
            import torch.multiprocessing as mp

            def worker(gpu, args):
                dist.init_process_group("nccl", rank=gpu, world_size=args.world_size)

            args.world_size = args.gpus * args.nodes  # one spawn per node
            mp.spawn(worker, args=(args,), nprocs=args.gpus)
            """,
            line=5,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for scope, call, rank, size in _global_rank_arguments(ctx):
            # On one node the local rank is the global rank: a group of the node's GPU count, one that
            # meets at this host's loopback address, or one `mp.spawn` starts whole.
            starts_group = ctx.qualify(call.func) in INIT_PROCESS_GROUP
            if ctx.rank_kind(rank) == "local" and not (starts_group and _meets_on_loopback(ctx, scope, call)):
                if not ctx.group_on_one_node(call, size):
                    message, help = _SAID[starts_group]
                    yield Report(node=rank, message=message, help=help)


# The message and the fix, for `init_process_group` (True) and for a sampler (False).
_SAID = {
    True: (
        "`rank=` gets the local rank: on a second node two processes claim each global rank.",
        'Pass the global rank: `int(os.environ["RANK"])` (or leave `rank=` out under torchrun, which sets RANK), '
        "or compute it as `node_rank * nproc_per_node + local_rank`.",
    ),
    False: (
        "`rank=` gets the local rank: every node reads the same shards, and the rest of the data set is never read.",
        "Pass the global rank: `dist.get_rank()` (or leave `rank=` out: the sampler asks the process group), "
        "or compute it as `node_rank * nproc_per_node + local_rank`.",
    ),
}
# Where torch takes the rank of the process in the whole job, and the group's size: (keyword, position) each.
_TAKES_GLOBAL_RANK = {
    **dict.fromkeys(INIT_PROCESS_GROUP, (("rank", 4), ("world_size", 3))),
    **dict.fromkeys(DISTRIBUTED_SAMPLERS, (("rank", 2), ("num_replicas", 1))),
}


def _global_rank_arguments(ctx: FileContext) -> Iterator[Tuple[ScopeInfo, cst.Call, cst.BaseExpression, Optional[cst.BaseExpression]]]:
    """Every argument the file passes where torch expects the global rank, with the function it is
    passed in and the group size passed beside it."""
    for scope in iter_scopes(ctx.module):
        for call in scope_calls(scope):
            taken = _TAKES_GLOBAL_RANK.get(ctx.qualify(call.func) or "")
            if taken is not None:
                rank = argument(call, *taken[0])
                if rank is not None:
                    yield scope, call, rank, argument(call, *taken[1])


# A rendezvous address no other host can reach: `tcp://127.0.0.1:23456`, `localhost`.
_LOOPBACK = re.compile(r"(?:tcp://)?(?:127\.\d+\.\d+\.\d+|localhost)(?:$|[:/])")


def _meets_on_loopback(ctx: FileContext, scope: ScopeInfo, call: cst.Call) -> bool:
    """Whether `init_process_group` meets at this host's loopback address: its `init_method` names it,
    or, with the environment's rendezvous, its function sets `os.environ["MASTER_ADDR"]` to it."""
    init_method = argument(call, "init_method", 1)
    if init_method is not None and not (isinstance(init_method, cst.SimpleString) and init_method.evaluated_value == "env://"):
        return _loopback_text(init_method)
    for statement in iter_small_statements(scope.body, into_functions=False):
        if isinstance(statement, cst.Assign) and any(_names_master_address(ctx, target.target) for target in statement.targets):
            return _loopback_text(statement.value)
    return False


def _names_master_address(ctx: FileContext, target: cst.BaseExpression) -> bool:
    """`os.environ["MASTER_ADDR"]`."""
    if not isinstance(target, cst.Subscript) or ctx.qualify(target.value) != "os.environ" or len(target.slice) != 1:
        return False
    key = target.slice[0].slice
    return isinstance(key, cst.Index) and isinstance(key.value, cst.SimpleString) and key.value.evaluated_value == "MASTER_ADDR"


def _loopback_text(value: cst.BaseExpression) -> bool:
    """A string that starts with a loopback address: a literal, `"tcp://localhost:{}".format(port)`, or an f-string."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "format":
        value = value.func.value
    if isinstance(value, cst.SimpleString):
        text = str(value.evaluated_value)
    elif isinstance(value, cst.FormattedString) and value.parts and isinstance(value.parts[0], cst.FormattedStringText):
        text = value.parts[0].value
    else:
        return False
    return _LOOPBACK.match(text) is not None
