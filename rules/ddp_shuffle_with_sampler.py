from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from dplint.analysis.names import dotted
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.ddp import (
    DATA_LOADERS,
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

    ## Known problems
    A sampler that arrives as a function parameter is not followed: it may be None at every call.
    """

    code = "DPL502"
    name = "shuffle-with-distributed-sampler"
    summary = "`DataLoader(shuffle=True, sampler=...)`: raises at startup, typically only in the multi-GPU branch."
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
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader, BatchSampler, DistributedSampler
            batches = BatchSampler(DistributedSampler(dataset), batch_size=8, drop_last=True)
            loader = DataLoader(dataset, shuffle=True, batch_sampler=batches)
            """,
            line=3,
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
                        yield Report(
                            node=call,
                            message=f"`DataLoader` gets `shuffle=True` and a `{keyword}`: it raises ValueError whenever the {keyword} is set.",
                            help=f"Pass `shuffle=({dotted(sampler) or keyword} is None)`; the sampler shuffles.",
                        )
                        break


def _builds_sampler(ctx: FileContext, scope: ScopeInfo, expr: cst.BaseExpression) -> bool:
    for value in values_of(ctx, scope, expr):
        for branch in branches(value):
            if isinstance(branch, cst.Call) and _callee_name(branch).endswith("Sampler"):
                return True
    return False


def _callee_name(call: cst.Call) -> str:
    name: Optional[str] = dotted(call.func)
    return (name or "").rpartition(".")[2]
