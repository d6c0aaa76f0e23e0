from __future__ import annotations

from typing import Iterator, List, Sequence, Set

import libcst as cst

from dplint.analysis.names import block_body, descendants
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.execution import ACCELERATOR_CLASS, DATA_LOADERS
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.ddp import (
    ScopeInfo,
    argument,
    for_loops,
    program,
    is_literal,
    iter_scopes,
    iterated_loader,
    scope_calls,
    trains,
    values_of,
)

ITERABLE_DATASETS = frozenset({"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"})


class TrainingLoaderNotSharded(Rule):
    """
    ## What it does
    In a program that wraps a model in DDP (or FSDP), finds a training `DataLoader(..., shuffle=True)`
    with no `sampler=`/`batch_sampler=` in a file that builds no `DistributedSampler` (outside a branch
    on the distributed mode), and `IterableDataset` classes whose code never reads the rank or world
    size (`dist.get_rank()`, the `RANK` variable, a rank the class was given) and whose objects the
    project hands to a `DataLoader` as its data set (a stage that a pipeline shards later, such as
    webdataset's `split_by_node`, is not one): splitting the stream between a loader's workers
    (`get_worker_info`) still gives every rank the same data.

    Under Hugging Face Accelerate, finds a `DataLoader(..., shuffle=True)` that a training loop (one
    whose body calls `backward` or steps an optimizer, in a function that uses the `Accelerator`)
    iterates as built: no `accelerator.prepare` (or `prepare_data_loader`) handed it back, wherever
    the loader was built, passed or returned. It is reported where it is built, or at the loop where
    that is in another file.

    ## Why is this bad?
    DDP averages gradients; it does not split the data. Without a `DistributedSampler` every rank
    iterates the whole dataset: with equal seeds the ranks see the same batches (N GPUs do the work of
    one), otherwise every epoch is N times longer than intended and overlaps at random. Nothing warns.
    Under `accelerate launch`, only the loader `accelerator.prepare` returns shards the batches
    between the processes; the one passed to it is unchanged.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=32, shuffle=True)
    model = DDP(net, device_ids=[local_rank])
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(train_set)   # shuffles; call sampler.set_epoch(epoch) every epoch
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    model = DDP(net, device_ids=[local_rank])
    ```

    ## Known problems
    Loaders without `shuffle=True` are taken for evaluation loaders and are not reported, nor are
    data sets built from the rank or the world size (`split_dataset_by_node(ds, rank, world_size)`,
    `Shards(root, dist.get_rank())`): they hold one rank's share. A data set that shards itself inside
    (reading the rank in its own `__init__`) is not recognised.
    Projects using Lightning are skipped (its Trainer shards for you). Under Accelerate, a loop that
    trains only through a function it calls, or whose function never calls the `Accelerator`, is not
    taken for training; a loader that may or may not be prepared is not reported.
    """

    code = "DPL503"
    preview = True
    preview_reason = (
        "Measured 0.60 on the 904 repositories of bench/wild (9 true, 6 false, 1 moot; its Accelerate part 3 of 3 true): "
        "shards made by a collate function or inside a data set's own code, `__main__` debug blocks and helpers no script "
        "calls are reported."
    )
    name = "training-loader-not-sharded"
    summary = "A DDP program's training loader has no `DistributedSampler`, or an Accelerate one is iterated unprepared: every rank trains on the same data."
    triggers = GuardedPattern(r"shuffle[ \t]*=[ \t]*True|IterableDataset", ["shuffle", "IterableDataset"], one_line=True)
    distributed_programs_only = True

    def outside_distributed_programs(self, project: ProjectFacts) -> bool:
        # The distributed programs' facts do not count an `Accelerator` as starting a group: in a project
        # that uses Accelerate, the execution model says where one runs.
        return project.uses_accelerate

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        # Where Accelerate is used, also a file that trains without building the loader it iterates.
        return super().applies_to(text, module_classes, project) or (project.uses_accelerate and ".backward(" in text)

    VALID = [
        Valid(
            """
            import webdataset as wds
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader, IterableDataset

            class ShardList(IterableDataset):  # a pipeline's first stage: split_by_node shards what it yields
                def __iter__(self):
                    yield from self.urls

            model = DDP(net)
            loader = DataLoader(wds.DataPipeline(ShardList(), wds.split_by_node, wds.tarfile_to_samples()), batch_size=None)
            """
        ),
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader, DistributedSampler
            model = DDP(net)
            sampler = DistributedSampler(train_set)
            loader = DataLoader(train_set, batch_size=32, sampler=sampler)
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            model = DDP(net)
            if dist.get_world_size() == 1:
                loader = DataLoader(train_set, shuffle=True)  # single process
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader, IterableDataset

            class Shards(IterableDataset):
                def __iter__(self):
                    for i, line in enumerate(open(self.path)):
                        if i % dist.get_world_size() == dist.get_rank():
                            yield line

            model = DDP(net)
            loader = DataLoader(Shards(), batch_size=8)
            """
        ),
        Valid(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            accelerator = Accelerator()
            loader = DataLoader(train_set, shuffle=True, batch_size=32)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                accelerator.backward(model(batch).loss)
                optimizer.step()
            """
        ),
        Valid(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            def loaders(accelerator):
                train = DataLoader(train_set, shuffle=True, batch_size=32)
                val = DataLoader(val_set, batch_size=32)
                return accelerator.prepare(train, val)

            def main():
                accelerator = Accelerator()
                train_dl, val_dl = loaders(accelerator)
                model, optimizer = accelerator.prepare(model, optimizer)
                for batch in train_dl:
                    accelerator.backward(model(batch).loss)
                    optimizer.step()
                raw = DataLoader(train_set, shuffle=True, batch_size=32)
                for batch in raw:  # no training here
                    accelerator.print(model(batch).loss)

            main()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            accelerator = Accelerator()
            loader = DataLoader(train_set, shuffle=True, batch_size=32)
            model, optimizer = accelerator.prepare(model, optimizer)
            for batch in loader:
                accelerator.backward(model(batch).loss)
                optimizer.step()
            """,
            line=5,
        ),
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            model = DDP(net)
            loader = DataLoader(train_set, batch_size=32, shuffle=True)
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist

            def main(args):
                dist.init_process_group("gloo")
                train_loader = torch.utils.data.DataLoader(
                    build_dataset(args), batch_size=args.batch_size, shuffle=True, num_workers=4
                )
                model = torch.nn.parallel.DistributedDataParallel(build_model())
                train(model, train_loader)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            class TokenStream(torch.utils.data.IterableDataset):
                def __init__(self, files):
                    self.files = files

                def __iter__(self):
                    for path in self.files:
                        yield from read_tokens(path)

            model = DDP(net)
            loader = torch.utils.data.DataLoader(TokenStream(files), batch_size=8)
            """,
            line=4,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        facts = program(ctx)
        if ctx.project.uses_accelerate and (facts is None or facts.trainer_framework):
            # Accelerate's programs (Lightning's shard by themselves): the execution model knows where
            # an `Accelerator` is built, and so whether the loop runs in a process group.
            yield from self._unprepared_loaders(ctx)
            return
        if facts is None or facts.trainer_framework or not facts.wraps_model:
            return
        if "DistributedSampler" not in ctx.source:
            for scope in iter_scopes(ctx.module):
                yield from self._loaders(ctx, scope)
        yield from self._iterable_datasets(ctx)

    def _loaders(self, ctx: FileContext, scope: ScopeInfo) -> Iterator[Report]:
        for call in scope_calls(scope):
            if ctx.qualify(call.func) not in DATA_LOADERS:
                continue
            where = ctx.where(call)
            if where is None or not where.in_group or not where.on_every_rank:
                continue  # one process, some ranks only, or code no program is known to run
            if not is_literal(argument(call, "shuffle", 2), True):
                continue
            if argument(call, "sampler", 3) is not None or argument(call, "batch_sampler", 4) is not None:
                continue
            dataset = argument(call, "dataset", 0)
            if dataset is None or any(ctx.reads_rank(value) for value in [dataset, *values_of(ctx, scope, dataset)]):
                continue  # a data set built for this rank's share (`split_dataset_by_node(ds, rank, world_size)`)
            yield Report(
                node=call,
                message="This training `DataLoader` has no `DistributedSampler`: every DDP rank iterates the same data.",
                help="Pass `sampler=DistributedSampler(dataset)` (and drop `shuffle=True`; the sampler shuffles).",
            )

    def _unprepared_loaders(self, ctx: FileContext) -> Iterator[Report]:
        """Accelerate: a training loop that iterates a `DataLoader(..., shuffle=True)` as built, where no
        `accelerator.prepare` handed it back (sharded)."""
        reported: Set[cst.CSTNode] = set()
        for scope in iter_scopes(ctx.module):
            loops = [loop for loop in for_loops(scope) if trains(ctx, loop)]
            if not loops or not _uses_accelerator(ctx, scope):
                continue
            for loop in loops:
                iterated = iterated_loader(ctx, loop.iter)
                where = ctx.where(loop)
                if where is None or not where.in_group or not where.on_every_rank:
                    continue
                built = ctx.unprepared_loader(iterated)
                if built is None or not _shuffles_unsharded(ctx, *built):
                    continue
                filename, call = built
                if filename != ctx.filename:
                    if not ctx.project.import_connected(ctx.filename, filename):
                        continue  # a same-named function's variable in a program these files are not part of
                    node: cst.CSTNode = iterated
                    message = "This loop trains on a `DataLoader` that never goes through `accelerator.prepare`: every process trains on all the data."
                else:
                    found = next((c for c in _loader_calls(ctx) if ctx.same_call(c, call)), None)
                    if found is None:
                        continue
                    node = found
                    message = "This training `DataLoader` never goes through `accelerator.prepare`: every process trains on all the data."
                if node in reported:
                    continue
                reported.add(node)
                yield Report(
                    node=node,
                    message=message,
                    help="Pass the loader to `accelerator.prepare` (`model, optimizer, loader = accelerator.prepare(model, optimizer, loader)`) and iterate what it returns: it shards the batches between the processes.",
                )

    def _iterable_datasets(self, ctx: FileContext) -> Iterator[Report]:
        for statement in _classes(ctx.module.body):
            if not any(ctx.qualify(base.value) in ITERABLE_DATASETS for base in statement.bases):
                continue
            defines_iter = any(isinstance(s, cst.FunctionDef) and s.name.value == "__iter__" for s in block_body(statement.body))
            if defines_iter and ctx.execution.feeds_a_loader(statement.name.value) and not _reads_rank(ctx, statement):
                yield Report(
                    node=statement.name,
                    message=f"`{statement.name.value}` never reads the rank or world size: every DDP rank streams the same data.",
                    help="Yield only this rank's part (e.g. every `world_size`-th item from `rank`, or `split_dataset_by_node`).",
                )


def _uses_accelerator(ctx: FileContext, scope: ScopeInfo) -> bool:
    """Whether the function's own code calls a method of an Accelerate `Accelerator`."""
    return any(isinstance(call.func, cst.Attribute) and ctx.object_class(call.func.value) == ACCELERATOR_CLASS for call in scope_calls(scope))


def _loader_calls(ctx: FileContext) -> List[cst.Call]:
    return ctx.memo(
        "dpl503-loader-calls", lambda: [c for scope in iter_scopes(ctx.module) for c in scope_calls(scope) if ctx.qualify(c.func) in DATA_LOADERS]
    )


def _reads_rank(ctx: FileContext, cls: cst.ClassDef) -> bool:
    """Whether the class's code reads the rank or the world size somewhere (`dist.get_rank()`, `self.rank`
    given one): what an iterable data set that yields only its rank's items does."""
    return any(ctx.reads_rank(node) for node in descendants(cls.body) if isinstance(node, (cst.Call, cst.Attribute)))


def _shuffles_unsharded(ctx: FileContext, filename: str, call: tuple) -> bool:
    """Whether a `DataLoader(...)` call (symbolic, of the file) shuffles its dataset itself (`shuffle=True`:
    no sampler can be given beside it), of a dataset not built from the rank or the world size."""
    _, _, arguments, keywords = call
    named = dict(keywords)
    if "*" in named or "**" in named or len(arguments) > 3 or "sampler" in named or "batch_sampler" in named:
        return False
    shuffle = named.get("shuffle", arguments[2] if len(arguments) > 2 else None)
    dataset = named.get("dataset", arguments[0] if arguments else None)
    return shuffle == ("c", True) and dataset is not None and not ctx.project.execution.reads_rank(dataset, filename)


def _classes(body) -> List[cst.ClassDef]:
    return [statement for statement in body if isinstance(statement, cst.ClassDef)]
