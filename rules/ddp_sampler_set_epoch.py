from __future__ import annotations

import re
from typing import Iterator, List, Optional, Tuple

import libcst as cst

from dplint.analysis.names import descendants, dotted
from dplint.analysis.context import FileContext
from dplint.analysis.execution import DATA_LOADERS
from dplint.edits import binding_on_every_path, indentation
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid
from dplint.analysis.ddp import (
    DISTRIBUTED_SAMPLERS,
    ScopeInfo,
    argument,
    branches,
    calls_in,
    for_loops,
    program_or_file,
    is_evaluation_name,
    is_literal,
    iter_scopes,
    iter_statements,
    looks_like_evaluation,
    mentions,
    passed_argument,
    scope_bindings,
)

_EPOCH = re.compile(r"epoch", re.I)


def distributed_samplers(ctx: FileContext) -> List[Tuple[cst.Call, List[str], cst.BaseSmallStatement, ScopeInfo]]:
    """Every `DistributedSampler(...)` call of the file, with the names its statement assigns, that
    statement and its scope."""

    def compute() -> List[Tuple[cst.Call, List[str], cst.BaseSmallStatement, ScopeInfo]]:
        found = []
        for scope in iter_scopes(ctx.module):
            for small in iter_statements(scope):
                targets = []
                if isinstance(small, cst.Assign):
                    targets = [name for name in (dotted(t.target) for t in small.targets) if name]
                for call in calls_in(small):
                    if ctx.qualify(call.func) in DISTRIBUTED_SAMPLERS:
                        found.append((call, targets, small, scope))
        return found

    return ctx.memo("ddp-samplers", compute)


class DistributedSamplerWithoutSetEpoch(Rule):
    """
    ## What it does
    Finds a shuffling `DistributedSampler(...)` in a project that loops over epochs but never calls
    `set_epoch` (on the sampler, `loader.sampler`, `loader.batch_sampler.sampler`, or a custom
    sampler's own `set_epoch`) anywhere. Where the programs that run it are known, each of them that
    trains (its code calls `backward()`) must call `set_epoch` itself: a sibling script's call does
    nothing for it, and an evaluation script that builds the training loaders too does not count.
    Reported at the sampler's construction.

    ## Why is this bad?
    `DistributedSampler` seeds its shuffle with `seed + epoch`, and `epoch` stays 0 until `set_epoch`
    is called: every epoch visits the data in exactly the same order on every rank. Nothing warns;
    training quality silently degrades.

    ## Example
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        for batch in loader:
            ...
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...
    ```

    ## Fix safety
    The fix calls `set_epoch` with the loop's variable as the first statement of each epoch loop, in
    the function that builds the sampler: `sampler.set_epoch(epoch)`, `loader.sampler.set_epoch(epoch)`
    for a sampler built inside the `DataLoader(...)` call, or under `if sampler is not None:` where the
    sampler may be None. It is unsafe: every epoch after the first then visits the data in another
    order, which changes the results of a training run. No fix is offered where the epoch loop is in
    another function or has no loop variable (`while epoch < n:`, `for _ in ...`), or where the name may
    hold something else or be unbound when the loop starts.

    ## Known problems
    One `set_epoch(` call anywhere in the project silences the rule for every sampler. Samplers with
    `shuffle=` other than a literal (directly, or in a `**mapping` splat of a dict literal the function
    builds and never changes), samplers of evaluation data (names with val/eval/test), and
    projects that use Lightning or Accelerate (which call `set_epoch` themselves) are not reported.
    """

    code = "DPL501"
    name = "distributed-sampler-without-set-epoch"
    summary = "A shuffling `DistributedSampler` whose `set_epoch` is never called: every epoch has the same order."
    fix_applicability = ("unsafe",)
    triggers = re.compile(r"DistributedSampler")

    VALID = [
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler = DistributedSampler(dataset)
            loader = DataLoader(dataset, sampler=sampler)
            for epoch in range(10):
                loader.sampler.set_epoch(epoch)
                for batch in loader:
                    step(batch)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            val_sampler = DistributedSampler(val_set, shuffle=False)
            for epoch in range(10):
                for batch in DataLoader(val_set, sampler=val_sampler):
                    evaluate(batch)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
            for batch in loader:  # one pass: no epochs
                step(batch)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler_args = {"shuffle": False, "drop_last": False}
            loader = DataLoader(dataset, sampler=DistributedSampler(dataset, **sampler_args))
            for epoch in range(10):
                for batch in loader:
                    step(batch)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler_args = {"shuffle": True, "drop_last": False}
            loader = DataLoader(dataset, sampler=DistributedSampler(dataset, **sampler_args))
            for epoch in range(10):
                for batch in loader:
                    step(batch)
            """,
            line=3,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler = DistributedSampler(dataset)
            loader = DataLoader(dataset, batch_size=32, sampler=sampler)
            for epoch in range(10):
                for batch in loader:
                    step(batch)
            """,
            line=2,
            expected_fix="""
            from torch.utils.data import DataLoader, DistributedSampler
            sampler = DistributedSampler(dataset)
            loader = DataLoader(dataset, batch_size=32, sampler=sampler)
            for epoch in range(10):
                sampler.set_epoch(epoch)
                for batch in loader:
                    step(batch)
            """,
        ),
        Invalid(
            """
            import torch

            def build_loader(dataset, world_size, rank):
                sampler = torch.utils.data.distributed.DistributedSampler(dataset, world_size, rank, shuffle=True)
                return torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=64)

            def main(dataset, epochs):
                loader = build_loader(dataset, 2, 0)
                for epoch in range(epochs):
                    train_one_epoch(loader)
            """,
            line=4,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler

            train_loader = DataLoader(train_set, batch_size=16, sampler=DistributedSampler(train_set, seed=42))
            epoch = 0
            while epoch < 90:
                train(train_loader)
                epoch += 1
            """,
            line=4,
        ),
        Invalid(
            """
            import torch

            def main(args, dataset, model):
                if args.distributed:
                    train_sampler = torch.utils.data.distributed.DistributedSampler(dataset)
                else:
                    train_sampler = None
                loader = torch.utils.data.DataLoader(dataset, shuffle=(train_sampler is None), sampler=train_sampler)
                for epoch in range(args.start_epoch, args.epochs):  # resumable
                    # one pass over the data
                    train(loader, model, epoch)
            """,
            line=5,
            expected_fix="""
            import torch

            def main(args, dataset, model):
                if args.distributed:
                    train_sampler = torch.utils.data.distributed.DistributedSampler(dataset)
                else:
                    train_sampler = None
                loader = torch.utils.data.DataLoader(dataset, shuffle=(train_sampler is None), sampler=train_sampler)
                for epoch in range(args.start_epoch, args.epochs):  # resumable
                    if train_sampler is not None:
                        train_sampler.set_epoch(epoch)
                    # one pass over the data
                    train(loader, model, epoch)
            """,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        facts = program_or_file(ctx)
        if facts.trainer_framework or not facts.epoch_loop:
            return
        for call, targets, statement, scope in distributed_samplers(ctx):
            # Each program that builds it must call `set_epoch` itself: a sibling script's call, or a
            # test's, does nothing for this one. Where no program is known to reach it, or a class of the
            # project defines its own `set_epoch` (called by whatever steps it), the files of the
            # programs it may belong to tell.
            sets_epoch = None if ctx.project.execution.defines_method("set_epoch") else ctx.execution.programs_call(ctx.line(call), "set_epoch", "backward")
            if sets_epoch or (sets_epoch is None and facts.sets_epoch):
                continue
            known, shuffle = passed_argument(ctx, scope, call, "shuffle", 3)
            if not known or (shuffle is not None and not is_literal(shuffle, True)):
                continue
            seed = argument(call, "seed", 4)
            if seed is not None and mentions(seed, _EPOCH):
                continue  # a new seed every epoch does what set_epoch does
            dataset = argument(call, "dataset", 0)
            if any(is_evaluation_name(target) for target in targets) or (dataset is not None and looks_like_evaluation(dataset)):
                continue
            fix = _set_epoch_fix(ctx, call, statement, scope)
            yield Report(
                node=call,
                message="This shuffling `DistributedSampler` never gets `set_epoch()`: every epoch has the same order.",
                help=f"{fix.message}."
                if fix is not None
                else "Call `sampler.set_epoch(epoch)` (or `loader.sampler.set_epoch(epoch)`) at the start of each epoch.",
                fix=fix,
            )


class DistributedSamplerSeedPerRank(Rule):
    """
    ## What it does
    Finds `DistributedSampler(..., seed=...)` whose seed depends on the rank, the time, the process id
    or an unseeded random draw.

    ## Why is this bad?
    Every rank shuffles the whole index list with `seed + epoch` and then takes its own slice. With a
    different seed on each rank the slices come from different permutations: some samples are seen by
    several ranks in an epoch and others by none. The docstring says the seed "should be identical
    across all processes". Nothing raises; verified on 2 ranks, `seed=rank` covered 7 of 10 samples.

    ## Example
    ```python
    sampler = DistributedSampler(dataset, seed=args.seed + rank)
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(dataset, seed=args.seed)  # the same on every rank
    ```

    ## Known problems
    A name in the seed is read for the values that reach it (`seed = args.seed + dist.get_rank()`
    earlier in the function, an attribute set from the rank); a seed that depends on the rank on
    one path only (`if args.x: seed += rank`) counts. A parameter counts as a rank where its callers
    pass one (`mp.spawn`'s process index) or where it is named like one (`rank`, `local_rank`).
    """

    code = "DPL513"
    name = "distributed-sampler-seed-per-rank"
    summary = "A `DistributedSampler` seed that differs between ranks: ranks overlap and samples are missed."
    triggers = re.compile(r"DistributedSampler")

    VALID = [
        Valid(
            """
            from torch.utils.data import DistributedSampler
            sampler = DistributedSampler(dataset, seed=args.seed)
            """
        ),
        Valid(
            """
            from torch.utils.data import DistributedSampler
            sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
            """
        ),
        Valid(
            """
            import torch
            torch.manual_seed(1234 + rank)  # per-rank augmentation seeds are fine
            sampler = torch.utils.data.DistributedSampler(dataset)
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            from torch.utils.data import DistributedSampler

            def build(args, dataset, epoch):
                rank = dist.get_rank()
                seed = args.seed + epoch  # the same on every rank
                print(f"rank {rank}: seed {seed}")
                return DistributedSampler(dataset, rank=rank, seed=seed)
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            from torch.utils.data import DistributedSampler

            def build(args, dataset, seed):
                torch.manual_seed(seed + dist.get_rank())  # augmentation seed per rank
                return DistributedSampler(dataset, seed=seed)  # a parameter: the caller's seed
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.utils.data import DistributedSampler
            sampler = DistributedSampler(dataset, seed=args.seed + rank)
            """,
            line=2,
        ),
        Invalid(
            """
            import time
            from torch.utils.data.distributed import DistributedSampler
            sampler = DistributedSampler(dataset, shuffle=True, seed=int(time.time()))
            """,
            line=3,
        ),
        Invalid(
            """
            import torch.distributed as dist
            from torch.utils.data import DistributedSampler
            sampler = DistributedSampler(dataset, dist.get_world_size(), dist.get_rank(), True, dist.get_rank() * 17)
            """,
            line=3,
        ),
        Invalid(
            """
            import torch.distributed as dist
            from torch.utils.data import DistributedSampler

            def build(dataset, base_seed):
                seed = base_seed * (dist.get_rank() + 1)  # the rank reaches the sampler through a variable
                return DistributedSampler(dataset, seed=seed)
            """,
            line=6,
        ),
        Invalid(
            """
            import os
            from torch.utils.data import DistributedSampler

            def build(args, dataset):
                rank = int(os.environ["RANK"])
                seed = args.seed + rank
                return DistributedSampler(dataset, shuffle=True, seed=seed)
            """,
            line=7,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for call, *_ in distributed_samplers(ctx):
            seed = argument(call, "seed", 4)
            if seed is None:
                continue
            reason = _varying(ctx, seed)
            if reason:
                yield Report(
                    node=seed,
                    message=f"This `DistributedSampler` seed depends on {reason}: ranks shuffle differently and overlap.",
                    help="Pass the same seed on every rank (e.g. `seed=args.seed`); seed augmentation per rank elsewhere.",
                )


def _set_epoch_fix(ctx: FileContext, call: cst.Call, statement: cst.BaseSmallStatement, scope: ScopeInfo) -> Optional[FixSpec]:
    """`sampler.set_epoch(epoch)` (or `loader.sampler.set_epoch(epoch)`) first in each loop over epochs,
    with a loop variable, that the sampler's scope runs after building it. The name must hold the sampler
    whenever the loop runs: bound on every path before it, and only to samplers (or to None: the call
    goes under `if sampler is not None:`)."""
    if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0].target, cst.Name)):
        return None
    name = statement.targets[0].target.value
    values = [branch for value in scope_bindings(ctx, scope).get(name, []) for branch in branches(value)]
    if any(value is call for value in branches(statement.value)):
        stepped, guarded = name, any(is_literal(value, None) for value in values)
        if not all(is_literal(value, None) or isinstance(value, cst.Call) and ctx.qualify(value.func) in DISTRIBUTED_SAMPLERS for value in values):
            return None
    elif isinstance(statement.value, cst.Call) and ctx.qualify(statement.value.func) in DATA_LOADERS and len(values) == 1:
        if argument(statement.value, "sampler", 3) is not call:
            return None
        stepped, guarded = f"{name}.sampler", False
    else:
        return None
    bound = binding_on_every_path(scope.body, name)
    loops = [loop for loop in for_loops(scope) if _epoch_variable(loop) is not None]
    # The outermost: a loop over epochs nested in another is not where an epoch starts.
    loops = [loop for loop in loops if not any(other is not loop and any(node is loop for node in descendants(other)) for other in loops)]
    loops = [loop for loop in loops if bound is not None and ctx.line(bound) < ctx.line(loop) and ctx.line(statement) < ctx.line(loop)]
    if not loops:
        return None
    newline, unit = ctx.module.default_newline, ctx.module.default_indent
    edits = []
    for loop in loops:
        indent = indentation(ctx, loop.body.body[0])  # type: ignore[union-attr]
        step = f"{stepped}.set_epoch({_epoch_variable(loop)})"
        text = f"if {name} is not None:{newline}{indent}{unit}{step}" if guarded else step
        edits.append(NodeEdit(loop.body.header, f"{indent}{text}{newline}", insert_after=True))  # type: ignore[union-attr]
    where = " and ".join(f"line {ctx.line(loop)}" for loop in loops)
    return FixSpec(f"Call `{step}` first in the epoch loop ({where})", tuple(edits), "unsafe")


def _epoch_variable(loop: cst.For) -> Optional[str]:
    """The loop's variable where it loops over epochs (`for epoch in range(args.epochs)`), on an indented body."""
    if not (isinstance(loop.target, cst.Name) and loop.target.value != "_" and isinstance(loop.body, cst.IndentedBlock)):
        return None
    return loop.target.value if _EPOCH.search(loop.target.value) or mentions(loop.iter, _EPOCH) else None


_VARYING_CALLS = {"time.time": "the time", "time.time_ns": "the time", "os.getpid": "the process id"}


def _varying(ctx: FileContext, seed: cst.BaseExpression) -> str:
    if ctx.varies(seed):
        return "the rank"
    for call in calls_in(seed):
        qualified = ctx.qualify(call.func) or ""
        if qualified in _VARYING_CALLS:
            return _VARYING_CALLS[qualified]
        if qualified.startswith(("random.", "numpy.random.")):
            return "an unseeded random draw"
    return ""
