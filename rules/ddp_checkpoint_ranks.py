from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst

from dplint.analysis.names import Body, block_body, child_blocks, child_nodes, dotted, names_in
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.analysis.execution import GROUP_WORLDS, Where
from dplint.edits import binding_on_every_path, import_edit, module_name, under_if
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid
from dplint.analysis.ddp import (
    ScopeInfo,
    argument,
    branches,
    calls_in,
    program,
    iter_scopes,
    parameter_names,
    program_or_file,
    scope_bindings,
    scope_calls,
)

SAVE = frozenset({"torch.save", "torch.serialization.save"})
LOAD = frozenset({"torch.load", "torch.serialization.load"})
# Sharded checkpoints: there every rank must take part, and writes its own shard.
_SHARDING_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp", "torch.distributed.checkpoint")


# What each process gets for itself: a temporary file or folder of its own, an in-memory buffer.
PROCESS_LOCAL = frozenset(
    {
        "tempfile.NamedTemporaryFile", "tempfile.TemporaryFile", "tempfile.SpooledTemporaryFile", "tempfile.mkstemp",
        "tempfile.mkdtemp", "tempfile.mktemp", "tempfile.TemporaryDirectory", "io.BytesIO",
    }
)  # fmt: skip


def _every_rank_calls(ctx: FileContext, functions: frozenset, path_index: int, path_keyword: str) -> Iterator[Tuple[ScopeInfo, cst.Call]]:
    """Calls to `functions` that every rank of a process group runs, with a path that does not depend
    on the rank and is not the process's own (a temporary file, a buffer)."""
    return _shared_path_calls(ctx, functions, path_index, path_keyword, lambda where: where.on_every_rank)


def _shared_path_calls(
    ctx: FileContext, functions: frozenset, path_index: int, path_keyword: str, runs_on: Callable[[Where], bool]
) -> Iterator[Tuple[ScopeInfo, cst.Call]]:
    """Calls to `functions` that run in a process group where `runs_on` says, with a path that does not
    depend on the rank and is not the process's own (a temporary file, a buffer)."""
    local: Dict[Optional[cst.CSTNode], Set[str]] = {}
    for scope in iter_scopes(ctx.module):
        for call in scope_calls(scope):
            if ctx.qualify(call.func) not in functions:
                continue
            where = ctx.where(call)
            if where is None or not where.in_group or not runs_on(where):
                continue
            path = argument(call, path_keyword, path_index)
            if path is not None:
                if ctx.varies(path):
                    continue
                if scope.node not in local:
                    local[scope.node] = _process_local_names(ctx, scope.body)
                if _is_process_local(ctx, path, local[scope.node]):
                    continue
            yield scope, call


def _is_process_local(ctx: FileContext, path: cst.BaseExpression, local: Set[str]) -> bool:
    if any(ctx.qualify(call.func) in PROCESS_LOCAL for call in calls_in(path)):
        return True
    return bool(local) and not local.isdisjoint(names_in(path))


def _process_local_names(ctx: FileContext, body: Body) -> Set[str]:
    """Names the block binds to a temporary file, folder or buffer: `with tempfile.NamedTemporaryFile()
    as tmp`, `fd, path = tempfile.mkstemp()`, `buffer = io.BytesIO()`."""
    found: Set[str] = set()
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.With):
            for item in statement.items:
                if item.asname is not None and _makes_process_local(ctx, item.item):
                    found |= names_in(item.asname.name)
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign) and _makes_process_local(ctx, small.value):
                    for target in small.targets:
                        found |= names_in(target.target)
        elif isinstance(statement, cst.BaseCompoundStatement):
            for block in child_blocks(statement):
                found |= _process_local_names(ctx, block)
    return found


def _makes_process_local(ctx: FileContext, value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Call) and ctx.qualify(value.func) in PROCESS_LOCAL


class CheckpointOnEveryRank(Rule):
    """
    ## What it does
    In a program that starts a process group, finds `torch.save(...)` in code every rank runs (a
    function that trains, wraps the model in DDP or starts the process group) with no rank guard
    (`if rank == 0:`, `if is_main_process():`, `@rank_zero_only`, an early `return` on other ranks) and
    a path that does not depend on the rank. A call to a helper of the same file that saves that way
    is reported at the call.

    A program starts a process group when its own run reaches `init_process_group` or a DDP/FSDP wrap:
    a script whose module level or `__main__` guard does (through its own functions), or one that calls
    a function or class of a project module it imports that does. A script that imports a module for
    something else (a collate function beside a distributed setup no script of it calls) is not one.

    ## Why is this bad?
    Every rank writes the same file at the same time. The writes race: the checkpoint is truncated or
    interleaved, and the damage shows only when it is loaded ("PytorchStreamReader failed finding
    central directory"). On several nodes, `local_rank == 0` still leaves one writer per node.

    ## Example
    ```python
    for epoch in range(epochs):
        train_one_epoch(model, loader)
        torch.save(model.module.state_dict(), "checkpoint.pt")
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        train_one_epoch(model, loader)
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "checkpoint.pt")
    ```

    ## Fix safety
    The fix puts the statement under the program's own rank-0 test, one the file already uses as a
    guard and whose names the statement's place has (`if is_main_process():`, `if self.gpu_id == 0:`,
    `if args.local_rank in [-1, 0]:`), else under `if dist.get_rank() == 0:`, adding
    `import torch.distributed as dist` where no name for it is imported. It is unsafe: the other ranks
    no longer write the file (a rank that reads it back must wait for rank 0, e.g. at a barrier), and
    `dist.get_rank()` raises where the same code also runs without a process group. A call that is not
    a statement of its own line gets no fix.

    ## Known problems
    Rank guards are tests on a rank: a rank name (`rank`, `local_rank`, `is_main_process()`), a value
    built from one in the same file (`self.gpu_id = int(os.environ["LOCAL_RANK"])`, `mp.spawn`'s process
    index, a rank passed to a function or class of the file: `Trainer(model, rank)`), a flag holding such a test (`save_to_disk = get_rank() == 0`), or a project function that
    returns one (`def is_primary(): return get_rank() == 0`, in any file), or a project function's result
    that is None except on some ranks (`return None` unless rank 0, tested `if result is not None:`).
    A path built from a rank is the process's own, and so is one built from the items a rank iterates
    of its own share (a `DistributedSampler`'s loader, `range(rank * n, ...)`), or from a random UUID.
    Helpers in other files, and rank guards in the caller of a helper that saves,
    are not followed.
    Files using FSDP or `torch.distributed.checkpoint` (where every rank must take part) are skipped.
    """

    code = "DPL505"
    preview = True
    preview_reason = (
        "Measured 0.76 on the 904 repositories of bench/wild (86 true, 27 false, 8 moot): an attribute that is None on the "
        "other ranks, an assert in another module, a flag whose no-CUDA fallback is true on every rank, or a cache that "
        "rank 0 writes first behind a barrier is not seen."
    )
    name = "checkpoint-on-every-rank"
    summary = "`torch.save` run by every rank of a process group, to the same path: the writes race."
    fix_applicability = ("unsafe",)
    triggers = GuardedPattern(r"\bsave\(", ["save("])
    distributed_programs_only = True

    VALID = [
        Valid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("gloo")
            for epoch in range(3):
                loss = model(x).sum()
                loss.backward()
                if dist.get_rank() == 0:
                    torch.save(model.state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist

            def train(model, rank):
                dist.init_process_group("gloo")
                model(x).sum().backward()
                torch.save(model.state_dict(), f"ckpt_rank{rank}.pt")  # one file per rank
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist

            def train(model, args):
                dist.init_process_group("gloo")
                model(x).sum().backward()
                if args.local_rank not in (-1, 0):
                    return
                torch.save(model.state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import io
            import tempfile
            import torch
            import torch.distributed as dist

            def check_round_trip(model):
                dist.init_process_group("gloo")
                model(x).sum().backward()
                with tempfile.NamedTemporaryFile() as tmp:  # each process has its own file
                    torch.save(model, tmp.name)
                buffer = io.BytesIO()
                torch.save(model.state_dict(), buffer)
            """
        ),
        Valid(
            """
            import os
            import torch
            import torch.distributed as dist

            class Trainer:  # pytorch/examples' torchrun tutorial: gpu_id is the local rank
                def __init__(self, model):
                    self.gpu_id = int(os.environ["LOCAL_RANK"])
                    self.model = model

                def train(self, epochs):
                    dist.init_process_group("nccl")
                    for epoch in range(epochs):
                        self.model(x).sum().backward()
                        if self.gpu_id == 0 and epoch % 10 == 0:
                            torch.save(self.model.state_dict(), "snapshot.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist

            def train(model, epochs):
                dist.init_process_group("nccl")
                save_to_disk = dist.get_rank() == 0
                for epoch in range(epochs):
                    model(x).sum().backward()
                    if epoch % 10 == 0 and save_to_disk:
                        torch.save(model.state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp

            def main_worker(gpu, args):
                dist.init_process_group("nccl", rank=gpu, world_size=args.world_size)
                model(x).sum().backward()
                final_state = "final_state{}.pth".format(gpu)  # one file per process
                torch.save(model.state_dict(), final_state)

            mp.spawn(main_worker, nprocs=4, args=(args,))
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist

            def is_primary():
                return dist.get_rank() == 0

            class Trainer:
                def __init__(self, distributed, rank):
                    self.should_write = not distributed or rank == 0

                def save(self, name):
                    if not self.should_write:
                        return
                    torch.save(self.model.state_dict(), name)

                def train(self, epochs):
                    for epoch in range(epochs):
                        self.model(x).sum().backward()
                        self.save("latest.pt")
                        if is_primary():
                            torch.save(self.model.state_dict(), f"epoch{epoch}.pt")

            dist.init_process_group("nccl")
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp

            class Trainer:  # pytorch/examples' mp.spawn tutorial: the rank reaches the trainer as gpu_id
                def __init__(self, model, gpu_id, save_every):
                    self.gpu_id = gpu_id
                    self.model = model
                    self.save_every = save_every

                def train(self, epochs):
                    for epoch in range(epochs):
                        self.model(x).sum().backward()
                        if self.gpu_id == 0 and epoch % self.save_every == 0:
                            torch.save(self.model.state_dict(), "checkpoint.pt")

            def main(rank, world_size):
                dist.init_process_group("nccl", rank=rank, world_size=world_size)
                Trainer(build_model(), rank, 10).train(100)

            mp.spawn(main, args=(2,), nprocs=2)
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist

            def is_main_training():
                if dist.is_initialized():
                    if dist.get_rank() == 0:
                        return True
                    return False
                return True

            def train(model, epochs):
                dist.init_process_group("nccl")
                for epoch in range(epochs):
                    model(x).sum().backward()
                    if is_main_training():
                        torch.save(model.state_dict(), "model.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            from torch.utils.data import DataLoader, DistributedSampler

            def extract(encoder, dataset):
                dist.init_process_group("nccl")
                loader = DataLoader(dataset, sampler=DistributedSampler(dataset, shuffle=False))
                for sample in loader:  # each rank its own samples
                    torch.save(encoder(sample["video"]), f"latents/{sample['name']}.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist

            def evaluate(model, loader, rank):
                total = sum(model(x).sum() for x in loader)
                dist.all_reduce(total)
                if rank != 0:
                    return None
                return total.item()

            def train(model, loader, rank, epochs):
                dist.init_process_group("nccl", rank=rank, world_size=2)
                for epoch in range(epochs):
                    score = evaluate(model, loader, rank)
                    if score is not None:  # rank 0 alone
                        torch.save(model.state_dict(), "best.pt")
            """
        ),
        Valid(
            """
            import uuid
            import torch
            import torch.distributed as dist

            dist.init_process_group("nccl")
            torch.save(batch, f"dump/batch-{uuid.uuid4()}.pt")  # a name of the process's own
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.distributed as dist
            from torch.utils.data import DataLoader, DistributedSampler

            def train(model, dataset):
                dist.init_process_group("nccl")
                loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
                for step, batch in enumerate(loader):
                    model(batch).sum().backward()
                    torch.save(model.state_dict(), f"step_{step}.pt")  # every rank counts the same steps
            """,
            line=10,
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("gloo")
            for epoch in range(3):
                loss = model(x).sum()
                loss.backward()
                torch.save(model.state_dict(), "ckpt.pt")
            """,
            line=7,
            expected_fix="""
            import torch
            import torch.distributed as dist
            dist.init_process_group("gloo")
            for epoch in range(3):
                loss = model(x).sum()
                loss.backward()
                if dist.get_rank() == 0:
                    torch.save(model.state_dict(), "ckpt.pt")
            """,
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def main(net, rank):
                model = DDP(net)
                train(model)
                torch.save({"model": model.module.state_dict()}, "final.pt")
            """,
            line=7,
        ),
        Invalid(
            """
            import torch

            def save_checkpoint(model, path):
                torch.save(model.state_dict(), path)  # every rank reaches it through train()

            def train(model, loader, optimizer, epochs):
                for epoch in range(epochs):
                    for x, y in loader:
                        optimizer.zero_grad()
                        model(x).sum().backward()
                        optimizer.step()
                    save_checkpoint(model, "last.pt")

            torch.distributed.init_process_group("gloo")
            train(build_model(), build_loader(), build_optimizer(), 10)
            """,
            line=4,
            expected_fix="""
            import torch
            import torch.distributed as dist

            def save_checkpoint(model, path):
                if dist.get_rank() == 0:
                    torch.save(model.state_dict(), path)  # every rank reaches it through train()

            def train(model, loader, optimizer, epochs):
                for epoch in range(epochs):
                    for x, y in loader:
                        optimizer.zero_grad()
                        model(x).sum().backward()
                        optimizer.step()
                    save_checkpoint(model, "last.pt")

            torch.distributed.init_process_group("gloo")
            train(build_model(), build_loader(), build_optimizer(), 10)
            """,
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist
            from utils import is_main_process

            def train(model, loader, epochs):
                dist.init_process_group("nccl")
                for epoch in range(epochs):
                    for x in loader:
                        model(x).sum().backward()
                    if is_main_process():
                        print(f"epoch {epoch} done")
                    # the latest weights, for resuming
                    torch.save(model.state_dict(), "last.pt")  # every epoch
            """,
            line=13,
            expected_fix="""
            import torch
            import torch.distributed as dist
            from utils import is_main_process

            def train(model, loader, epochs):
                dist.init_process_group("nccl")
                for epoch in range(epochs):
                    for x in loader:
                        model(x).sum().backward()
                    if is_main_process():
                        print(f"epoch {epoch} done")
                    # the latest weights, for resuming
                    if is_main_process():
                        torch.save(model.state_dict(), "last.pt")  # every epoch
            """,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        if any(name.startswith(_SHARDING_MODULES) for name in ctx.imports.modules()):
            return
        for scope, call in _every_rank_calls(ctx, SAVE, 1, "f"):
            test, fix = _on_rank_zero(ctx, scope, call)
            yield Report(
                node=call,
                message="Every rank runs this `torch.save` to the same path: the writes race and can corrupt the file.",
                help=f"Save on one rank: `if {test}: torch.save(...)`.",
                fix=fix,
            )


class CheckpointPerNode(Rule):
    """
    ## What it does
    In a program that starts a process group and shows it runs on several nodes, finds `torch.save(...)`
    that runs on local rank 0 of every node (`if local_rank == 0:`, `if args.local_rank in [-1, 0]:`,
    `if int(os.environ["LOCAL_RANK"]) == 0:`) with a path that does not depend on the rank. A program
    shows several nodes where it reads a variable only a multi-node launcher sets (`NODE_RANK`,
    torchrun's `GROUP_RANK`, SLURM's `SLURM_PROCID` or `SLURM_NODEID`, MPI's global rank) or takes a
    node count or a node's rank on its command line (`--nnodes`, `--node_rank`).

    ## Why is this bad?
    On one node there is one writer. On several nodes each node's local rank 0 writes, so nodes that
    share a file system (the usual cluster setup) write the same file at the same time: the checkpoint
    is truncated or interleaved, and the damage shows only when it is loaded. The bug waits for the
    first multi-node run.

    ## Example
    ```python
    if args.local_rank == 0:
        torch.save(model.module.state_dict(), "checkpoint.pt")
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:  # the global rank: one writer in the whole job
        torch.save(model.module.state_dict(), "checkpoint.pt")
    ```
    or a path per node, where each node has its own disk.

    `dplint run --nnodes 2` reports the same race as the script runs: the ranks, one on each node,
    that saved the same path.

    ## Known problems
    Whether the nodes share a file system is not known: a job whose nodes each save to a local disk
    needs one writer per node, and is reported. A program launched on several nodes by `torchrun
    --nnodes` alone shows nothing in its code and is not reported (`dplint run --nnodes 2` finds it).
    The ranks are read as for DPL505: guards in another file's caller of a helper are not followed.
    """

    code = "DPL526"
    preview = True
    preview_reason = (
        "Measured 0.50 on the 904 repositories of bench/wild (5 true, 5 false, 19 moot): a repository whose code names "
        "several nodes for one script is read as one whose every script runs on several, and most document single-node "
        "launches only."
    )
    name = "checkpoint-per-node"
    summary = "`torch.save` under a local-rank-0 test, to one path: on several nodes, one writer per node races the others."
    triggers = GuardedPattern(r"\bsave\(", ["save("])
    distributed_programs_only = True

    VALID = [
        Valid(
            """
            import torch
            import torch.distributed as dist

            def train(model, local_rank):
                dist.init_process_group("nccl")
                model(x).sum().backward()
                if dist.get_rank() == 0:
                    torch.save(model.state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import os
            import torch
            import torch.distributed as dist

            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl")
            if local_rank == 0:
                torch.save(model.state_dict(), f"ckpt_node{os.environ['GROUP_RANK']}_rank{dist.get_rank()}.pt")
            """
        ),
        Valid(
            """
            import os
            import torch
            import torch.distributed as dist

            local_rank = int(os.environ["LOCAL_RANK"])  # `torchrun --standalone`: one node
            dist.init_process_group("nccl")
            model(x).sum().backward()
            if local_rank == 0:
                torch.save(model.state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import os
            import tempfile
            import torch
            import torch.distributed as dist

            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl")
            if local_rank == 0:
                with tempfile.NamedTemporaryFile(suffix=".pt") as scratch:  # a file of its own
                    torch.save(model.state_dict(), scratch.name)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import os
            import torch
            import torch.distributed as dist

            local_rank = int(os.environ["LOCAL_RANK"])
            node = int(os.environ["GROUP_RANK"])  # torchrun's node rank: the job spans nodes
            dist.init_process_group("nccl")
            model(x).sum().backward()
            if local_rank == 0:
                torch.save(model.state_dict(), "ckpt.pt")
            """,
            line=10,
        ),
        Invalid(
            """
            import argparse
            import torch
            import torch.distributed as dist

            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=-1)
            parser.add_argument("--nnodes", type=int, default=1)
            args = parser.parse_args()
            if args.local_rank != -1:
                dist.init_process_group("nccl")
            model(x).sum().backward()
            if args.local_rank in [-1, 0]:
                torch.save(args, "training_args.bin")
            """,
            line=13,
        ),
        Invalid(
            """
            import argparse
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp

            def worker(gpu, args):
                rank = args.node_rank * args.gpus + gpu
                dist.init_process_group("nccl", rank=rank, world_size=args.gpus * args.nodes)
                model(x).sum().backward()
                if gpu == 0:  # spawn's index: the local rank
                    torch.save(model.state_dict(), "last.pt")

            def main(args):
                mp.spawn(worker, nprocs=args.gpus, args=(args,))

            if __name__ == "__main__":
                parser = argparse.ArgumentParser()
                parser.add_argument("--nodes", type=int, default=1)
                parser.add_argument("--node_rank", type=int, default=0)
                parser.add_argument("--gpus", type=int, default=8)
                main(parser.parse_args())
            """,
            line=11,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        if any(name.startswith(_SHARDING_MODULES) for name in ctx.imports.modules()) or not program_or_file(ctx).names_several_nodes:
            return  # a program that shows no second node (`torchrun --standalone`, one `mp.spawn`) has one writer
        for _, call in _shared_path_calls(ctx, SAVE, 1, "f", _on_each_node_lead):
            yield Report(
                node=call,
                message="Local rank 0 of every node runs this `torch.save` to the same path: on several nodes the writes race.",
                help="Save on global rank 0 (`if dist.get_rank() == 0:`), or give each node its own path.",
            )


def _on_each_node_lead(where: Where) -> bool:
    """Runs on global rank 0 and on local rank 0 of the other nodes, not on the other ranks."""
    zero, lead, rest = where.truth[GROUP_WORLDS]
    return zero in "TU" and lead in "TU" and rest == "F"


class LoadWithoutMapLocation(Rule):
    """
    ## What it does
    In a program that starts a process group and uses CUDA, finds `torch.load(path)` without
    `map_location` in code every rank runs (no rank guard), with a path that does not depend on the rank,
    in a function that restores a model or an optimizer from it (`load_state_dict`).

    ## Why is this bad?
    `torch.load` puts each tensor back on the device it was saved from. A checkpoint saved by rank 0
    holds `cuda:0` tensors, so every rank loads its copy onto GPU 0: GPU 0 runs out of memory, or
    every process creates a CUDA context there, slowing or hanging the start of the job.

    ## Example
    ```python
    checkpoint = torch.load("checkpoint.pt")
    model.load_state_dict(checkpoint["model"])
    ```

    ## Use instead
    ```python
    checkpoint = torch.load("checkpoint.pt", map_location="cpu")
    model.load_state_dict(checkpoint["model"])
    ```
    or `map_location=f"cuda:{local_rank}"`.

    ## Fix safety
    The fix passes `map_location=`: the code's device variable where it holds the rank's GPU (or the
    CPU) when the load runs (`device = torch.device("cuda", local_rank)`, `self.device` set in
    `__init__`), else `f"cuda:{local_rank}"` from a local-rank variable the function has (`local_rank`,
    `gpu`, `gpu_id`), else `"cpu"`. `load_state_dict` copies the tensors to where the model and the
    optimizer are, whichever the device. It is unsafe: tensors the program uses straight from the
    checkpoint (not through `load_state_dict`) end up on that device.

    ## Known problems
    What the file holds is followed from where the project writes it, by the file name its path
    ends in (`os.path.join(run_dir, "model_args.pth")`, a constant holding the name): a file the
    project writes only from the CPU (`torch.save(args, ...)` of parsed options, `x.cpu()`, a model's
    `state_dict()` after `net.cpu()`, `dcp_to_torch_save`) is not reported. Elsewhere what it holds is
    not known: a checkpoint saved from CPU tensors loads fine without `map_location`, a downloaded one
    too. The program must use CUDA somewhere (`.cuda()`, `"cuda"`, NCCL), and the function
    that loads must hand a state to `load_state_dict` (a model's or an optimizer's checkpoint), to be
    reported: a load whose result another function restores is not, nor one restored straight into a
    learning-rate scheduler that torch or transformers built (its state is plain numbers). A load in
    one branch of an `if` whose other branch loads the same path onto a device the test names is not
    reported
    (`if args.gpu is None: torch.load(path)`): the test tells a process of one GPU from one that drives
    all of its node's GPUs, alone on its node; a launch that starts several such processes on a node
    is not seen.
    """

    code = "DPL506"
    preview = True
    preview_reason = (
        "Measured 0.77 on the 904 repositories of bench/wild (110 true, 33 false, 37 moot): what a file holds is followed "
        "only where its path ends in a literal name or a module's constant; paths held in attributes, downloaded weights "
        "and files another program writes under the same name are not established."
    )
    name = "load-without-map-location"
    summary = "`torch.load` without `map_location` on every rank: all ranks load GPU tensors onto `cuda:0`."
    fix_applicability = ("unsafe",)
    triggers = GuardedPattern(r"\bload\(", ["load("])
    distributed_programs_only = True

    VALID = [
        Valid(
            """
            import os
            import torch
            import torch.distributed as dist

            def save(net, respth):
                net.cpu()
                torch.save(net.module.state_dict(), os.path.join(respth, "model_final.pth"))  # CPU tensors

            def evaluate(net, respth):
                dist.init_process_group("nccl")
                net.load_state_dict(torch.load(os.path.join(respth, "model_final.pth")))
                net.cuda()
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            features = torch.load("features.pt")  # what the script dumped itself: not a model's state
            knn(features.cuda(), k=20)
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            from transformers import get_linear_schedule_with_warmup

            def train(args, model, optimizer):
                dist.init_process_group("nccl")
                scheduler = get_linear_schedule_with_warmup(optimizer, args.warmup, args.steps)
                scheduler.load_state_dict(torch.load("scheduler.pt"))  # plain numbers: no device
                optimizer.load_state_dict(torch.load("optimizer.pt", map_location="cpu"))
                model.cuda()
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            state = torch.load("ckpt.pt", map_location="cpu")
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("gloo")  # a CPU program: tensors were saved on the CPU
            state = torch.load("ckpt.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            rank = dist.get_rank()
            shard = torch.load(f"shard_{rank}.pt")  # saved from this rank's own GPU
            """
        ),
        Valid(
            """
            import tempfile
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            with tempfile.NamedTemporaryFile() as tmp:
                torch.save(model.cuda(), tmp.name)
                copy = torch.load(tmp.name)  # this process's own file, saved from its own GPU
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist

            def main_worker(gpu, args, model):
                args.gpu = gpu
                dist.init_process_group("nccl", rank=args.rank, world_size=args.world_size)
                model.cuda()
                if args.gpu is None:  # one process drives all of its node's GPUs
                    checkpoint = torch.load(args.resume)
                else:
                    checkpoint = torch.load(args.resume, map_location=f"cuda:{args.gpu}")
                model.load_state_dict(checkpoint["state_dict"])
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            state = torch.load("ckpt.pt")
            model.load_state_dict(state["model"])
            """,
            line=4,
            expected_fix="""
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            state = torch.load("ckpt.pt", map_location="cpu")
            model.load_state_dict(state["model"])
            """,
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def resume(model, path):
                model.load_state_dict(torch.load(path)["model"])

            def main(net, local_rank):
                model = DDP(net.cuda(local_rank), device_ids=[local_rank])
                resume(model.module, "last.pt")
            """,
            line=5,
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist

            class Trainer:
                def __init__(self, model, path):
                    dist.init_process_group(backend="nccl")
                    self.model = model.cuda()
                    self.model.load_state_dict(torch.load(path, weights_only=True))

            trainer = Trainer(Net(), "last.pt")
            """,
            line=8,
        ),
        Invalid(
            """
            import os
            import torch
            import torch.distributed as dist

            def main(args):
                dist.init_process_group("nccl")
                device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
                model = build_model(args).to(device)
                checkpoint = torch.load(
                    args.resume,  # written by rank 0
                )
                model.load_state_dict(checkpoint["model"])
            """,
            line=9,
            expected_fix="""
            import os
            import torch
            import torch.distributed as dist

            def main(args):
                dist.init_process_group("nccl")
                device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
                model = build_model(args).to(device)
                checkpoint = torch.load(
                    args.resume, map_location=device,  # written by rank 0
                )
                model.load_state_dict(checkpoint["model"])
            """,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        facts = program(ctx)
        if facts is None or not facts.uses_cuda:
            return
        restoring: Dict[Optional[cst.CSTNode], List[cst.Call]] = {}
        for scope, call in _every_rank_calls(ctx, LOAD, 0, "f"):
            if scope.node not in restoring:
                restoring[scope.node] = _restoring_calls(scope)
            restores = restoring[scope.node]
            if not restores:
                continue  # features, cached examples, a scheduler's numbers: what the file holds is unknown
            if ctx.project.file_read(ctx.filename, ctx.line(call)) in ctx.project.files_on_cpu:
                continue  # the project writes that file only from CPU tensors (`torch.save(args, ...)`, `x.cpu()`)
            if call in _mapped_in_the_other_branch(ctx, scope):
                continue  # the test tells the processes of one GPU, which map their loads, from those of all a node's GPUs
            if argument(call, "map_location", 1) is None and not _restores_a_scheduler(ctx, scope, call, restores):
                location = _rank_device(ctx, scope, call)
                fix = None
                if call.args and not any(arg.star for arg in call.args):
                    fix = FixSpec(f"Pass `map_location={location}`", (NodeEdit(call.args[-1], f", map_location={location}", insert_after=True),), "unsafe")
                yield Report(
                    node=call,
                    message="Every rank runs this `torch.load` without `map_location`: GPU tensors all load onto `cuda:0`.",
                    help=f"Pass `map_location={location}`: `load_state_dict` then copies the tensors to where the model is.",
                    fix=fix,
                )


def _mapped_in_the_other_branch(ctx: FileContext, scope: ScopeInfo) -> Set[cst.Call]:
    """Loads without `map_location` in one branch of an `if` whose other branch loads the same path onto
    a device the test names (pytorch/examples: `if args.gpu is None: torch.load(path)`, else
    `map_location=f"cuda:{args.gpu}"`): the author tells a process of one GPU from one that drives all
    of its node's GPUs, which is alone on its node. Worked out once a scope."""
    return ctx.memo(f"mapped-elsewhere:{id(scope.node)}", lambda: _loads_mapped_elsewhere(ctx, scope))


def _loads_mapped_elsewhere(ctx: FileContext, scope: ScopeInfo) -> Set[cst.Call]:
    found: Set[cst.Call] = set()
    for statement in _if_statements(scope.body):
        if statement.orelse is None:
            continue
        tested = _dotted_parts(statement.test)
        branches = []  # each branch's loads, and the paths it loads onto a device the test names
        for block in child_blocks(statement):
            loads, assigned = _loads(ctx, block), _assigned_names(block)
            branches.append((loads, {ctx.code(path) for load, path in loads if _maps_by(load, tested, assigned)}))
        for index, (loads, _) in enumerate(branches):
            elsewhere = set().union(*(mapped for other, (_, mapped) in enumerate(branches) if other != index))
            found.update(load for load, path in loads if argument(load, "map_location", 1) is None and ctx.code(path) in elsewhere)
    return found


def _maps_by(load: cst.Call, tested: Set[str], assigned: Dict[str, cst.BaseExpression]) -> bool:
    """`map_location=f"cuda:{args.gpu}"` under `if args.gpu is None:` (or a name the branch assigns
    so): onto a device named by what the branch tests (not `"cpu"` under `torch.cuda.is_available()`)."""
    location = argument(load, "map_location", 1)
    if isinstance(location, cst.Name) and location.value in assigned:
        location = assigned[location.value]
    return location is not None and not _dotted_parts(location).isdisjoint(tested)


def _dotted_parts(node: cst.CSTNode) -> Set[str]:
    """The names and attribute chains an expression reads (`args.gpu`, `gpu`), calls' callees left out."""
    name = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
    if name is not None:
        return {name}
    children = [arg.value for arg in node.args] if isinstance(node, cst.Call) else child_nodes(node)
    return set().union(*(_dotted_parts(child) for child in children))


def _assigned_names(body: Body) -> Dict[str, cst.BaseExpression]:
    """`loc = f"cuda:{args.gpu}"`: the names a block's own statements assign, with their values."""
    return {
        small.targets[0].target.value: small.value
        for statement in body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
    }


def _loads(ctx: FileContext, body: Body) -> List[Tuple[cst.Call, cst.BaseExpression]]:
    """The `torch.load` calls of a block's own statements (not nested blocks), with their paths."""
    found = []
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            for call in calls_in(statement):
                path = argument(call, "f", 0)
                if path is not None and ctx.qualify(call.func) in LOAD:
                    found.append((call, path))
    return found


def _restoring_calls(scope: ScopeInfo) -> List[cst.Call]:
    """The scope's calls that hand a state to `load_state_dict` (or, in a function it defines, to
    `_load_from_state_dict`): what it loads is then a model's or an optimizer's checkpoint, whose
    tensors were saved from the devices they trained on."""
    calls = calls_in(scope.node) if scope.node is not None else scope_calls(scope)
    return [call for call in calls if isinstance(call.func, cst.Attribute) and call.func.attr.value in _RESTORES]


_RESTORES = frozenset({"load_state_dict", "_load_from_state_dict"})


def _restores_a_scheduler(ctx: FileContext, scope: ScopeInfo, load: cst.Call, restores: List[cst.Call]) -> bool:
    """`scheduler.load_state_dict(torch.load(path))` (one of the scope's `restores`) where `scheduler`
    is built by a learning-rate scheduler of torch or transformers: its state is plain numbers, which
    load anywhere."""
    for call in restores:
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "load_state_dict" and call.args and call.args[0].value is load):
            continue
        receiver = dotted(func.value)
        if receiver is None:
            return False
        if receiver.startswith("self.") and scope.owner is not None:
            methods = [m for m in block_body(scope.owner.body) if isinstance(m, cst.FunctionDef)]
            values = [v for m in methods for v in scope_bindings(ctx, ScopeInfo(m, block_body(m.body), scope.owner)).get(receiver, [])]
        else:
            values = scope_bindings(ctx, scope).get(receiver, [])
        return bool(values) and all(_builds_a_scheduler(ctx, value) for value in values)
    return False


def _builds_a_scheduler(ctx: FileContext, value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        return False
    qualified = ctx.qualify(value.func) or ""
    return qualified.startswith("torch.optim.lr_scheduler.") or qualified.rpartition(".")[2] in SCHEDULER_FACTORIES


# transformers' learning-rate schedules (`transformers.optimization`): each returns a torch LambdaLR.
SCHEDULER_FACTORIES = frozenset({
    "get_scheduler",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_linear_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "get_inverse_sqrt_schedule",
})


def _rank_device(ctx: FileContext, scope: ScopeInfo, load: cst.Call) -> str:
    """What DPL506's fix passes as `map_location`: a device variable of the code that holds the rank's GPU
    (or the CPU) when the load runs, else `f"cuda:{local_rank}"` from a variable or parameter of the
    function that holds the local rank, else `"cpu"`."""
    line = ctx.line(load)
    bindings: Dict[str, List[cst.BaseExpression]] = {}
    # Names the load's scope binds on every path before it; `self.` attributes its class's `__init__` binds.
    for name, values in scope_bindings(ctx, scope).items():
        bound = binding_on_every_path(scope.body, name)
        if bound is not None and ctx.line(bound) < line and "." not in name:
            bindings[name] = values
    init = next((m for m in block_body(scope.owner.body) if isinstance(m, cst.FunctionDef) and m.name.value == "__init__"), None) if scope.owner else None
    if init is not None and scope.node is not None and scope.node is not init:
        body = block_body(init.body)
        for name, values in scope_bindings(ctx, ScopeInfo(init, body, scope.owner)).items():
            if name.startswith("self.") and binding_on_every_path(body, name) is not None:
                bindings[name] = values
    for name, values in bindings.items():
        on_gpu = [branch for value in values for branch in branches(value) if "cuda" in ctx.code(branch)]
        # `torch.device("cuda", local_rank)`, `f"cuda:{rank}"`, or the CPU; never `"cuda"` alone: GPU 0.
        if "device" in name.rpartition(".")[2] and on_gpu and all(ctx.varies(value) for value in on_gpu):
            return name
    parameters = parameter_names(scope.node) if scope.node is not None else []
    for name in [*parameters, *bindings]:
        if ctx.execution.value(name, line) == ("rank", "local"):
            return f'f"cuda:{{{name}}}"'
    return '"cpu"'


def _on_rank_zero(ctx: FileContext, scope: ScopeInfo, call: cst.Call) -> Tuple[str, Optional[FixSpec]]:
    """DPL505's fix: the statement that is only `call` under the program's own rank-0 test, one that the
    file uses as a guard and whose names the call's place has (`is_main_process()`, `self.gpu_id == 0`),
    else under `dist.get_rank() == 0` (adding `import torch.distributed as dist` where no name for it is
    imported). Returns the test and the fix (None where the call is not a statement of its own)."""
    test = _own_rank_zero_test(ctx, scope, call)
    imports: Tuple[NodeEdit, ...] = ()
    if test is None:
        dist = module_name(ctx, "torch.distributed")
        if dist is None:  # `dist` may name something else in the file: the import would shadow it
            added = import_edit(ctx, "import torch.distributed as dist", "torch", call) if "dist" not in names_in(ctx.module) else None
            if added is None:
                return "dist.get_rank() == 0", None
            dist, imports = "dist", (added,)
        test = f"{dist}.get_rank() == 0"
    edit = under_if(ctx, call, test)
    return test, None if edit is None else FixSpec(f"Run it under `if {test}:`", (edit, *imports), "unsafe")


def _own_rank_zero_test(ctx: FileContext, scope: ScopeInfo, call: cst.Call) -> Optional[str]:
    """The first rank-0 test that the file's `if` statements use (one of the conditions they join with
    `and`), whose names the call's place has: in the call's own function first, then its class, then
    anywhere."""
    found = []
    for other in iter_scopes(ctx.module):
        closeness = 0 if other.node is scope.node else 1 if other.owner is not None and other.owner is scope.owner else 2
        for statement in _if_statements(other.body):
            for condition in _conditions(statement.test):
                code = ctx.code(condition)
                if "\n" not in code and _tests_rank_zero(ctx, condition) and _available(ctx, scope, other, condition, call):
                    found.append((closeness, ctx.line(statement), code))
    return min(found)[2] if found else None


def _if_statements(body: Body) -> Iterator[cst.If]:
    """The `if` statements of a scope's body (and their `elif`s), not those of functions defined in it."""
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or not isinstance(statement, cst.BaseCompoundStatement):
            continue
        if isinstance(statement, cst.If):
            yield statement
        for block in child_blocks(statement):
            yield from _if_statements(block)
        if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.If):
            yield from _if_statements([statement.orelse])


def _conditions(test: cst.BaseExpression) -> List[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _conditions(test.left) + _conditions(test.right)
    return [test]


def _tests_rank_zero(ctx: FileContext, condition: cst.BaseExpression) -> bool:
    """Whether the condition holds on rank 0 (of the group, or of each node) and on no other rank."""
    truth = ctx.execution.test_truth(ctx.code(condition), ctx.line(condition))
    return truth[1] in "TU" and truth[3] == "F"


def _available(ctx: FileContext, scope: ScopeInfo, where: ScopeInfo, condition: cst.BaseExpression, call: cst.Call) -> bool:
    """Whether every name `condition` (from an `if` of the scope `where`) reads is bound at `call` in `scope`:
    `self` of the same class, a parameter, a name bound on every path before the call, a module-level name."""
    line = ctx.line(call)
    parameters = parameter_names(scope.node) if scope.node is not None else []
    for name in _read_names(condition):
        if name == "self":
            if scope.owner is None or where.owner is not scope.owner or "self" not in parameters:
                return False
            continue
        if name in parameters:
            continue
        bound = binding_on_every_path(scope.body, name) if scope.node is not None else None
        if bound is not None and ctx.line(bound) < line:
            continue
        if not _module_level_name(ctx, name, line if scope.node is None else None):
            return False
    return True


def _read_names(expr: cst.CSTNode) -> Set[str]:
    """The names an expression reads: `self` and `args` for `self.gpu_id == args.rank`, not `gpu_id`."""
    if isinstance(expr, cst.Name):
        return {expr.value}
    if isinstance(expr, cst.Attribute):
        return _read_names(expr.value)
    if isinstance(expr, cst.Arg):
        return _read_names(expr.value)
    return {name for child in child_nodes(expr) for name in _read_names(child)}


def _module_level_name(ctx: FileContext, name: str, before: Optional[int]) -> bool:
    """Whether the module's top level binds `name` (a function, a class, an import, an assignment),
    before the line `before` where given."""
    for statement in ctx.module.body:
        if before is not None and ctx.line(statement) >= before:
            return False
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and statement.name.value == name:
            return True
        if binding_on_every_path([statement], name) is not None:
            return True
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        bound = alias.asname.name if alias.asname is not None else alias.name
                        if ctx.module.code_for_node(bound).split(".")[0] == name:
                            return True
    return False
