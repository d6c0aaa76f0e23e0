from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from dplint.analysis.names import dotted
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.analysis.execution import DATA_LOADERS
from dplint.edits import code_at, indentation
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid
from dplint.analysis.ddp import (
    ScopeInfo,
    argument,
    branches,
    is_literal,
    iter_scopes,
    scope_calls,
    values_of,
)


class ShuffleWithDistributedSampler(Rule):
    """
    ## What it does
    Finds `DataLoader(..., shuffle=True, sampler=...)` (or `batch_sampler=`) where the sampler is
    built here: `DistributedSampler(...)`, a name assigned one, or `sampler if distributed else None`.

    ## Why is this bad?
    `DataLoader` raises `ValueError: sampler option is mutually exclusive with shuffle` whenever a
    sampler is given together with `shuffle=True`. The sampler is usually passed only in the
    multi-GPU branch, so the script works on one GPU and crashes at startup on the cluster. The
    sampler does the shuffling (`DistributedSampler(shuffle=True)` is its default).

    ## Example
    ```python
    sampler = DistributedSampler(dataset) if distributed else None
    loader = DataLoader(dataset, batch_size=32, shuffle=True, sampler=sampler)
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(dataset) if distributed else None
    loader = DataLoader(dataset, batch_size=32, shuffle=(sampler is None), sampler=sampler)
    ```

    ## Fix safety
    The fix is safe: the loader raises today wherever the sampler is set. Where the sampler is always
    set, `shuffle=True` is dropped; where it may be `None`, the fix writes `shuffle=(sampler is None)`,
    which keeps shuffling when there is no sampler. A `shuffle` passed by position gets no fix.

    ## Known problems
    A sampler that arrives as a function parameter is not followed: it may be None at every call.
    """

    code = "DPL502"
    name = "shuffle-with-distributed-sampler"
    summary = "`DataLoader(shuffle=True, sampler=...)`: raises at startup, typically only in the multi-GPU branch."
    fix_applicability = ("safe",)
    triggers = GuardedPattern(r"\bshuffle[ \t]*=[ \t]*True", ["shuffle"], one_line=True)

    VALID = [
        Valid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler = DistributedSampler(dataset) if distributed else None
            loader = DataLoader(dataset, batch_size=32, shuffle=(sampler is None), sampler=sampler)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, batch_size=32, shuffle=True, sampler=None)
            """
        ),
        Valid(
            """
            from torch.utils.data import DataLoader

            def make_loader(dataset, sampler=None):
                # the parameter may be None at every call: not followed
                return DataLoader(dataset, shuffle=True, sampler=sampler)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(dataset, batch_size=32, shuffle=True, sampler=DistributedSampler(dataset))
            """,
            line=2,
            expected_fix="""
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
            """,
        ),
        Invalid(
            """
            import torch
            from torch.utils.data.distributed import DistributedSampler

            def build(dataset, args):
                train_sampler = DistributedSampler(dataset) if args.distributed else None
                return torch.utils.data.DataLoader(
                    dataset, batch_size=args.batch_size, shuffle=True, sampler=train_sampler
                )
            """,
            line=6,
            expected_fix="""
            import torch
            from torch.utils.data.distributed import DistributedSampler

            def build(dataset, args):
                train_sampler = DistributedSampler(dataset) if args.distributed else None
                return torch.utils.data.DataLoader(
                    dataset, batch_size=args.batch_size, shuffle=(train_sampler is None), sampler=train_sampler
                )
            """,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader, BatchSampler, DistributedSampler
            batches = BatchSampler(DistributedSampler(dataset), batch_size=8, drop_last=True)
            loader = DataLoader(dataset, shuffle=True, batch_sampler=batches)
            """,
            line=3,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader, DistributedSampler

            def make_loader(dataset, args):
                sampler = DistributedSampler(dataset, num_replicas=args.world_size, rank=args.rank)
                return DataLoader(
                    dataset,
                    batch_size=args.batch_size,
                    sampler=sampler,  # shards the data
                    shuffle=True
                )
            """,
            line=5,
            expected_fix="""
            from torch.utils.data import DataLoader, DistributedSampler

            def make_loader(dataset, args):
                sampler = DistributedSampler(dataset, num_replicas=args.world_size, rank=args.rank)
                return DataLoader(
                    dataset,
                    batch_size=args.batch_size,
                    sampler=sampler  # shards the data
                )
            """,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for scope in iter_scopes(ctx.module):
            for call in scope_calls(scope):
                if ctx.qualify(call.func) not in DATA_LOADERS or not is_literal(argument(call, "shuffle", 2), True):
                    continue
                for keyword, index in (("sampler", 3), ("batch_sampler", 4)):
                    sampler = argument(call, keyword, index)
                    if sampler is not None and _builds_sampler(ctx, scope, sampler):
                        always = _always_a_sampler(ctx, scope, sampler)
                        yield Report(
                            node=call,
                            message=f"`DataLoader` gets `shuffle=True` and a `{keyword}`: it raises ValueError whenever the {keyword} is set.",
                            help="Drop `shuffle=True`; the sampler shuffles."
                            if always
                            else f"Pass `shuffle=({dotted(sampler) or keyword} is None)`; the sampler shuffles.",
                            fix=_shuffle_fix(ctx, call, sampler, always),
                        )
                        break


def _builds_sampler(ctx: FileContext, scope: ScopeInfo, expr: cst.BaseExpression) -> bool:
    for value in values_of(ctx, scope, expr):
        for branch in branches(value):
            if isinstance(branch, cst.Call) and _callee_name(branch).endswith("Sampler"):
                return True
    return False


def _always_a_sampler(ctx: FileContext, scope: ScopeInfo, expr: cst.BaseExpression) -> bool:
    """Whether every value the sampler argument can hold is a sampler built here (never `None`)."""
    return all(isinstance(branch, cst.Call) and _callee_name(branch).endswith("Sampler") for value in values_of(ctx, scope, expr) for branch in branches(value))


def _shuffle_fix(ctx: FileContext, call: cst.Call, sampler: cst.BaseExpression, always: bool) -> Optional[FixSpec]:
    """Safe: the loader raises today wherever the sampler is set. Where it always is, `shuffle=True` goes;
    where it may be `None`, `shuffle=(sampler is None)` keeps shuffling there."""
    index = next((i for i, arg in enumerate(call.args) if arg.keyword is not None and arg.keyword.value == "shuffle"), None)
    if index is None:
        return None  # passed by position: dropping it would move the arguments after it
    if not always:
        name = dotted(sampler)
        if name is None:
            return None
        return FixSpec(f"Pass `shuffle=({name} is None)`", (NodeEdit(call.args[index].value, f"({name} is None)"),))
    edit = NodeEdit(call, code_at(ctx, _without_argument(call, index), indentation(ctx, call)))
    return FixSpec("Drop `shuffle=True`", (edit,))


def _without_argument(call: cst.Call, index: int) -> cst.Call:
    """`call` without its argument at `index`. Over several lines, the comment on that argument's line
    goes with it, and the comment lines after it stay before what followed it."""
    args = list(call.args)
    dropped = args.pop(index)
    last = index == len(args)
    trailing = isinstance(dropped.comma, cst.Comma)
    # The space before the argument (after the comma before it, or after `(`) and the space after it.
    before = call.whitespace_before_args if index == 0 else args[index - 1].comma.whitespace_after  # type: ignore[union-attr]
    after = dropped.comma.whitespace_after if trailing else dropped.whitespace_after_arg  # type: ignore[union-attr]
    if isinstance(before, cst.ParenthesizedWhitespace) and isinstance(after, cst.ParenthesizedWhitespace):
        merged = before.with_changes(empty_lines=[*before.empty_lines, *after.empty_lines], indent=after.indent, last_line=after.last_line)
        if index == 0:
            return call.with_changes(args=args, whitespace_before_args=merged)
        previous = args[index - 1]
        if last and not trailing:
            args[index - 1] = previous.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=merged)
        else:
            args[index - 1] = previous.with_changes(comma=previous.comma.with_changes(whitespace_after=merged))  # type: ignore[union-attr]
    elif last:  # on one line: the argument before takes its comma (or none) and the space before `)`
        args[-1] = args[-1].with_changes(comma=dropped.comma, whitespace_after_arg=dropped.whitespace_after_arg)
    return call.with_changes(args=args)


def _callee_name(call: cst.Call) -> str:
    name: Optional[str] = dotted(call.func)
    return (name or "").rpartition(".")[2]
