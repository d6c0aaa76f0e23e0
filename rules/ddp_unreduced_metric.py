from __future__ import annotations

import re
from typing import Iterator, List, Optional, Set

import libcst as cst

from dplint.analysis.names import dotted, run_visitor
from dplint.analysis.context import FileContext
from dplint.analysis.execution import DATA_LOADERS
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.ddp import (
    DISTRIBUTED_SAMPLERS,
    ScopeInfo,
    argument,
    branches,
    program,
    iter_scopes,
    scope_bindings,
    scope_calls,
)

_REDUCING = re.compile(r"reduce|gather", re.I)


class UnreducedMetric(Rule):
    """
    ## What it does
    Advice, off by default. Finds a metric divided by `len(loader.dataset)` in a function that iterates
    that loader and calls no `all_reduce`/`all_gather`/`reduce`/`gather` (nor any helper named so),
    where the loader is sharded: built with a `DistributedSampler` in the same file, or, for a loader
    from elsewhere, in a process-group program that shards its evaluation data
    (`DistributedSampler(..., shuffle=False)`).

    ## Why is this bad?
    With a `DistributedSampler` each rank iterates about 1/N of the dataset, but `len(loader.dataset)` is
    the full size: the accuracy or mean loss printed by rank 0 is about N times too small, and it
    describes only rank 0's shard. Nothing fails; the numbers are just wrong.

    ## Example
    ```python
    for images, labels in val_loader:
        correct += (model(images).argmax(1) == labels).sum().item()
    print(correct / len(val_loader.dataset))
    ```

    ## Use instead
    ```python
    counts = torch.tensor([correct, seen], dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    print((counts[0] / counts[1]).item())
    ```

    ## Known problems
    Heuristic: a loader from another file is taken as sharded when the program shards any evaluation
    data. Metrics that are printed unreduced without a division by the dataset size are not found.
    A `DistributedSampler` pads the last batches, so even reduced counts can include a few duplicates.
    """

    code = "DPL509"
    name = "unreduced-metric"
    summary = "Advice: a metric over a sharded loader divided by the full dataset size, never reduced across ranks."
    severity = "warning"
    enabled_by_default = False
    triggers = re.compile(r"len\([\w.]+\.dataset\)")

    VALID = [
        Valid(
            """
            import torch.distributed as dist
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False))

            def evaluate(model):
                correct = torch.zeros(1)
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum()
                dist.all_reduce(correct)
                return correct.item() / len(loader.dataset)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(val_set, batch_size=64)  # not sharded: rank 0 sees everything

            def evaluate(model):
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                return correct / len(loader.dataset)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False))

            def evaluate(model):
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                return reduce_sum(correct) / len(loader.dataset)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False))

            def evaluate(model):
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                return correct / len(loader.dataset)
            """,
            line=8,
        ),
        Invalid(
            """
            import torch.distributed as dist
            from torch.utils.data import DataLoader, DistributedSampler

            def test(model, dataset):
                dist.init_process_group("gloo")
                sampler = DistributedSampler(dataset, shuffle=False)
                test_loader = DataLoader(dataset, batch_size=32, sampler=sampler)
                loss = 0.0
                for x, y in test_loader:
                    loss += criterion(model(x), y).item() * len(x)
                print(f"test loss {loss / len(test_loader.dataset):.4f}")
            """,
            line=11,
        ),
        Invalid(
            """
            import torch.distributed as dist
            from torch.utils.data import DistributedSampler

            def build(val_set):
                return DistributedSampler(val_set, shuffle=False)

            def validate(model, val_loader):
                hits = 0
                for batch in val_loader:
                    hits += score(model, batch)
                return 100.0 * hits / len(val_loader.dataset)

            dist.init_process_group("gloo")
            """,
            line=11,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        sharded = _sharded_loaders(ctx)
        facts = program(ctx)
        program_shards = facts is not None and facts.shards_evaluation
        for scope in iter_scopes(ctx.module):
            calls = scope_calls(scope)
            if any(_REDUCING.search((dotted(call.func) or "").rpartition(".")[2]) for call in calls):
                continue
            iterated = _iterated(scope)
            for division in _divisions(scope):
                loader = _dataset_length_of(division.right)
                if loader is None or loader not in iterated:
                    continue
                if loader in sharded or (program_shards and loader not in _local_names(ctx, scope)):
                    yield Report(
                        node=division,
                        message=f"Each rank iterates ~1/N of `{loader}`, but this divides by its full size, unreduced across ranks.",
                        help="`dist.all_reduce` the sums and counts first, and divide the reduced sum by the reduced count.",
                    )


def _sharded_loaders(ctx: FileContext) -> Set[str]:
    """Names the file binds to a DataLoader with a DistributedSampler."""
    found: Set[str] = set()
    for scope in iter_scopes(ctx.module):
        bindings = scope_bindings(ctx, scope)
        samplers = {name for name, values in bindings.items() if any(_is_sampler(ctx, v) for v in values)}
        for name, values in bindings.items():
            for value in values:
                for branch in branches(value):
                    if isinstance(branch, cst.Call) and ctx.qualify(branch.func) in DATA_LOADERS:
                        sampler = argument(branch, "sampler", 3)
                        if sampler is not None and (_is_sampler(ctx, sampler) or dotted(sampler) in samplers):
                            found.add(name)
    return found


def _is_sampler(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    return any(isinstance(b, cst.Call) and ctx.qualify(b.func) in DISTRIBUTED_SAMPLERS for b in branches(expr))


def _local_names(ctx: FileContext, scope: ScopeInfo) -> Set[str]:
    return set(scope_bindings(ctx, scope))


def _iterated(scope: ScopeInfo) -> Set[str]:
    visitor = _Loops()
    for statement in scope.body:
        if not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            run_visitor(statement, visitor)
    return visitor.iterated


def _divisions(scope: ScopeInfo) -> List[cst.BinaryOperation]:
    visitor = _Divisions()
    for statement in scope.body:
        if not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            run_visitor(statement, visitor)
    return visitor.found


def _dataset_length_of(expr: cst.BaseExpression) -> Optional[str]:
    """`loader` for `len(loader.dataset)`."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "len" and len(expr.args) == 1:
        target = expr.args[0].value
        if isinstance(target, cst.Attribute) and target.attr.value == "dataset":
            return dotted(target.value)
    return None


class _Loops(cst.CSTVisitor):
    def __init__(self) -> None:
        self.iterated: Set[str] = set()

    def visit_For(self, node: cst.For) -> None:
        iterable = node.iter
        # `enumerate(loader)`, `tqdm(loader)`: the loader is the first argument.
        while isinstance(iterable, cst.Call) and iterable.args:
            iterable = iterable.args[0].value
        name = dotted(iterable)
        if name is not None:
            self.iterated.add(name)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


class _Divisions(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: List[cst.BinaryOperation] = []

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
            self.found.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False
