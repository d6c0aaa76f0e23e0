from __future__ import annotations

import re
from typing import Dict, Iterator, Optional

import libcst as cst

from dplint.analysis.facts import MODULE_RETURNING_METHODS
from dplint.analysis.names import dotted
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.torch_api import FULLY_SHARDED_DATA_PARALLEL
from dplint.analysis.ddp import argument, calls_in, iter_scopes, iter_statements

FULLY_SHARD = frozenset(
    {"torch.distributed.fsdp.fully_shard", "torch.distributed._composable.fsdp.fully_shard", "torch.distributed._composable.fsdp.fully_shard.fully_shard"}
)


class OptimizerBeforeFsdpWrap(Rule):
    """
    ## What it does
    Finds an optimizer built from `model.parameters()` before `FullyShardedDataParallel(model)` or
    `fully_shard(model)` in the same function.

    ## Why is this bad?
    FSDP replaces the module's parameters with flat or sharded ones. The optimizer keeps the original
    tensors, which no longer take part in the forward: `optimizer.step()` updates nothing the model
    uses, the loss stays flat, and no error is raised (verified with `fully_shard` on CPU).

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model = FSDP(model)
    ```

    ## Use instead
    ```python
    model = FSDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ```

    ## Known problems
    Only an optimizer and a wrap in the same function are compared.
    """

    code = "DPL515"
    name = "optimizer-before-fsdp-wrap"
    summary = "An optimizer built before the FSDP wrap: it holds parameters the sharded model no longer uses."
    triggers = GuardedPattern(r"FullyShardedDataParallel|FSDP|fully_shard", ["FullyShardedDataParallel", "FSDP", "fully_shard"])
    # The optimizer is built from `model.parameters()` in the same function.
    requires = re.compile(r"\.(?:named_)?parameters\(")

    VALID = [
        Valid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            """
        ),
        Valid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
        Valid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            optimizer = torch.optim.SGD(head.parameters(), lr=0.1)  # another module
            backbone = FSDP(backbone)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            model = FSDP(model)
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard

            def setup(model):
                opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                fully_shard(model)
                return model, opt
            """,
            line=6,
        ),
        Invalid(
            """
            from torch import optim
            from torch.distributed.fsdp import FullyShardedDataParallel

            class Trainer:
                def __init__(self, net):
                    self.optimizer = optim.Adam(net.parameters())
                    self.model = FullyShardedDataParallel(net.cuda(), use_orig_params=True)
            """,
            line=7,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for scope in iter_scopes(ctx.module):
            optimizers: Dict[str, cst.Call] = {}  # module name → the optimizer built from it
            for small in iter_statements(scope):
                for call in calls_in(small):
                    qualified = ctx.qualify(call.func) or ""
                    if qualified.startswith("torch.optim.") and qualified.rpartition(".")[2][:1].isupper():
                        owner = _parameters_owner(argument(call, "params", 0))
                        if owner is not None:
                            optimizers.setdefault(owner, call)
                    elif qualified in FULLY_SHARDED_DATA_PARALLEL or qualified in FULLY_SHARD:
                        wrapped = _strip(argument(call, "module", 0))
                        name = dotted(wrapped) if wrapped is not None else None
                        if name in optimizers:
                            yield Report(
                                node=call,
                                message=f"The optimizer on line {ctx.line(optimizers[name])} holds `{name}`'s parameters from before this FSDP wrap: it updates nothing.",
                                help="Build the optimizer after the wrap, from the wrapped model's `parameters()`.",
                            )


def _parameters_owner(expr: Optional[cst.BaseExpression]) -> Optional[str]:
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("parameters", "named_parameters"):
        return dotted(expr.func.value)
    return None


def _strip(expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in MODULE_RETURNING_METHODS:
        expr = expr.func.value
    return expr
