from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.ddp import STATE_DICT_COLLECTIVES, ScopeInfo, argument, is_literal, iter_scopes, passed_argument, scope_calls, values_of
from dplint.analysis.names import Body, block_body, child_blocks, dotted
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.torch_api import FULLY_SHARDED_DATA_PARALLEL
from dplint.rule import Invalid, Report, Rule, Valid

# FSDP1's static methods that set the state dict type of every FSDP module under the one given: a context
# manager, and a setter that holds until the next one.
_STATE_DICT_TYPE_CONTEXT = frozenset(f"{cls}.state_dict_type" for cls in FULLY_SHARDED_DATA_PARALLEL)
_SET_STATE_DICT_TYPE = frozenset(f"{cls}.set_state_dict_type" for cls in FULLY_SHARDED_DATA_PARALLEL)
# `StateDictType` is defined in torch.distributed.fsdp.api and re-exported by the package and its FSDP module.
_FULL_STATE_DICT = frozenset(
    f"torch.distributed.fsdp.{module}StateDictType.FULL_STATE_DICT" for module in ("", "api.", "fully_sharded_data_parallel.")
)
_FULL_STATE_DICT_CONFIG = frozenset(
    f"torch.distributed.fsdp.{module}FullStateDictConfig" for module in ("", "api.", "fully_sharded_data_parallel.")
)
# torch.distributed.checkpoint.state_dict's getters, and what each gathers.
_GATHERED = {
    "get_model_state_dict": "the whole model",
    "get_optimizer_state_dict": "the whole optimizer state",
    "get_state_dict": "the whole model and optimizer state",
}
_GETTERS = {name: _GATHERED[name.rpartition(".")[2]] for name in STATE_DICT_COLLECTIVES if name.rpartition(".")[2] in _GATHERED}
_STATE_DICT_OPTIONS = "torch.distributed.checkpoint.state_dict.StateDictOptions"


class FullStateDictOnDevice(Rule):
    """
    ## What it does
    Finds a full state dict of a sharded model taken without offloading it to the CPU:
    `model.state_dict()` under `with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT)` (or
    after `FSDP.set_state_dict_type` in the same function) with no state dict config, or with a
    `FullStateDictConfig` whose `offload_to_cpu` is not `True`; and
    `torch.distributed.checkpoint.state_dict`'s `get_model_state_dict`, `get_optimizer_state_dict` or
    `get_state_dict` given `StateDictOptions(full_state_dict=True)` without `cpu_offload=True`. It is
    reported at the call that sets the state dict up. Loading a full state dict
    (`model.load_state_dict` under `FULL_STATE_DICT`) unshards one FSDP unit at a time and is not
    reported.

    ## Why is this bad?
    A full state dict unshards every parameter. `FullStateDictConfig` defaults to
    `offload_to_cpu=False` and `rank0_only=False`: under `FULL_STATE_DICT`, `model.state_dict()`
    all-gathers each FSDP unit and keeps a clone of every unsharded parameter on the GPU, on every
    rank (on rank 0 alone with `rank0_only=True`). The ranks then hold the whole model on top of their
    shards, their optimizer state and the cached allocations of training: a model sharded because it
    did not fit one GPU runs out of memory at its first checkpoint. The getters do the same without
    `cpu_offload=True`: every rank gathers each `DTensor` with `full_tensor()` and keeps it on its GPU.
    With `cpu_offload=True` they move each gathered tensor to the CPU and only rank 0 keeps it (the
    other ranks get an empty dict), as `offload_to_cpu=True, rank0_only=True` does for FSDP1.

    ## Example
    ```python
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        state = model.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, "model.pt")
    ```

    ## Use instead
    ```python
    config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
        state = model.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, "model.pt")
    ```
    With FSDP2: `get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
    cpu_offload=True))` on every rank, saved on rank 0. Or save a sharded state dict with
    `torch.distributed.checkpoint.save`, which never unshards.

    ## Known problems
    The options must be in view at the call: a `FullStateDictConfig(...)` or `StateDictOptions(...)`
    written there, or assigned once to a name by the same function. Options that come from a
    parameter, another function or a `**kwargs` are not read, and nothing is reported; nor is a state
    dict that a helper takes (`get_peft_model_state_dict(model)` under the `with`). The size of the
    model is not known: a model small enough that every GPU holds a gathered copy beside its training
    state is saved all the same, and the finding is then moot. Under `ShardingStrategy.NO_SHARD` every rank holds the whole model already, and FSDP refuses
    `offload_to_cpu=True` (`NotImplementedError`).
    """

    code = "DPL524"
    preview = True
    preview_reason = (
        "Too few findings to judge: 3 on the 904 repositories of bench/wild, all true but moot (models that fit one GPU; "
        "labelled blind); the 12 FSDP trainers held back for it all offload their full state dicts."
    )
    name = "full-state-dict-on-device"
    severity = "warning"
    summary = (
        "A full FSDP state dict taken without CPU offload (`FULL_STATE_DICT` without `offload_to_cpu=True`, "
        "`full_state_dict=True` without `cpu_offload=True`): the whole model is gathered into GPU memory, by default on every rank."
    )
    triggers = GuardedPattern(r"FULL_STATE_DICT|full_state_dict", ["FULL_STATE_DICT", "full_state_dict"])

    VALID = [
        Valid(
            """
            import torch
            from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, StateDictType

            def save(model, path, rank):
                config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
                with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
                    state = model.state_dict()
                if rank == 0:
                    torch.save(state, path)
            """
        ),
        Valid(
            """
            import torch.distributed.checkpoint as dcp
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

            def save(model, path):
                with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
                    dcp.save({"model": model.state_dict()}, checkpoint_id=path)
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            def save(model, path):
                state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                if dist.get_rank() == 0:
                    torch.save(state, path)
            """
        ),
        Valid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

            def load(model, path):
                # loading unshards one FSDP unit at a time: nothing is gathered to keep
                with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
                    model.load_state_dict(torch.load(path, map_location="cpu"))
            """
        ),
        Valid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

            def save(model, state_dict_config):
                # the config comes from the caller: what it holds is not known here
                with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, state_dict_config):
                    return model.state_dict()
            """
        ),
        Valid(
            """
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            def snapshot(model, optimizer, args):
                options = StateDictOptions(full_state_dict=True, cpu_offload=args.offload)
                return get_state_dict(model, optimizer, options=options)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.distributed as dist
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

            def save(model, path):
                with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
                    state = model.state_dict()
                if dist.get_rank() == 0:
                    torch.save(state, path)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch
            from torch.distributed import fsdp

            def save(model, path, rank):
                config = fsdp.FullStateDictConfig(rank0_only=True)
                fsdp.FullyShardedDataParallel.set_state_dict_type(model, fsdp.StateDictType.FULL_STATE_DICT, config)
                state = model.state_dict()
                if rank == 0:
                    torch.save(state, path)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            def save(model, path):
                options = StateDictOptions(full_state_dict=True)
                state = get_model_state_dict(model, options=options)
                if dist.get_rank() == 0:
                    torch.save(state, path)
            """,
            line=7,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for scope in iter_scopes(ctx.module):
            calls = scope_calls(scope)
            managed = {item.item: statement for statement in _withs(scope.body) for item in statement.items}
            for index, call in enumerate(calls):
                qualified = ctx.qualify(call.func)
                if qualified in _STATE_DICT_TYPE_CONTEXT and call in managed:
                    # Under the `with`: what its body runs.
                    taken = _takes_state_dict(call, scope_calls(ScopeInfo(None, block_body(managed[call].body), None)))
                    report = _fsdp1_report(ctx, scope, call) if taken else None
                elif qualified in _SET_STATE_DICT_TYPE:
                    report = _fsdp1_report(ctx, scope, call) if _takes_state_dict(call, calls[index + 1 :]) else None
                elif qualified in _GETTERS:
                    report = _getter_report(ctx, scope, call, _GETTERS[qualified])
                else:
                    continue
                if report is not None:
                    yield report


def _withs(body: Body) -> Iterator[cst.With]:
    """The `with` statements of a scope's body (not of the functions in it)."""
    for statement in body:
        if isinstance(statement, cst.With):
            yield statement
        if isinstance(statement, cst.BaseCompoundStatement) and not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            for block in child_blocks(statement):
                yield from _withs(block)


def _takes_state_dict(setup: cst.Call, following: List[cst.Call]) -> bool:
    """Whether `following` calls `state_dict()` on the module whose state dict type `setup` sets: loading a
    full state dict (`load_state_dict`) unshards one FSDP unit at a time and gathers nothing to keep."""
    module = argument(setup, "module", 0)
    name = dotted(module) if module is not None else None
    return name is not None and any(
        isinstance(call.func, cst.Attribute) and call.func.attr.value == "state_dict" and dotted(call.func.value) == name
        for call in following
    )


def _fsdp1_report(ctx: FileContext, scope: ScopeInfo, call: cst.Call) -> Optional[Report]:
    _, kind = passed_argument(ctx, scope, call, "state_dict_type", 1)
    kind = _visible(ctx, scope, kind) if kind is not None else None
    if kind is None or ctx.qualify(kind) not in _FULL_STATE_DICT:
        return None
    known, config = passed_argument(ctx, scope, call, "state_dict_config", 2)
    if not known:
        return None
    if config is None or is_literal(config, None):
        offload, rank0_only = False, False  # FSDP builds `FullStateDictConfig()`: both default to False
    else:
        built = _visible(ctx, scope, config)
        if not isinstance(built, cst.Call) or ctx.qualify(built.func) not in _FULL_STATE_DICT_CONFIG:
            return None
        offload = _flag(ctx, scope, built, "offload_to_cpu", 0)
        rank0_only = _flag(ctx, scope, built, "rank0_only", 1)
    if offload is not False:
        return None
    if rank0_only is None:
        holders = "rank 0's GPU memory (every rank's unless `rank0_only=True`)"
    else:
        holders = "rank 0's GPU memory" if rank0_only else "every rank's GPU memory"
    return Report(
        node=call,
        message=f"`FULL_STATE_DICT` without `offload_to_cpu=True`: `state_dict()` gathers the whole model into {holders}.",
        help=(
            "Pass `FullStateDictConfig(offload_to_cpu=True, rank0_only=True)` as the state dict config: rank 0 alone "
            "keeps the gathered model, in CPU memory. Or save a sharded state dict (`StateDictType.SHARDED_STATE_DICT`) "
            "with `torch.distributed.checkpoint.save`."
        ),
    )


def _getter_report(ctx: FileContext, scope: ScopeInfo, call: cst.Call, gathered: str) -> Optional[Report]:
    known, options = passed_argument(ctx, scope, call, "options")
    if not known or options is None:
        return None  # no options: a sharded state dict
    built = _visible(ctx, scope, options)
    if not isinstance(built, cst.Call) or ctx.qualify(built.func) != _STATE_DICT_OPTIONS:
        return None
    if _flag(ctx, scope, built, "full_state_dict", 0) is not True or _flag(ctx, scope, built, "cpu_offload", 1) is not False:
        return None
    return Report(
        node=call,
        message=f"`full_state_dict=True` without `cpu_offload=True`: every rank gathers {gathered} into its GPU memory.",
        help=(
            "Pass `StateDictOptions(full_state_dict=True, cpu_offload=True)`, call the getter on every rank and save "
            "on rank 0: it alone keeps the gathered tensors, in CPU memory. Or save the sharded state dict with "
            "`torch.distributed.checkpoint.save`."
        ),
    )


def _visible(ctx: FileContext, scope: ScopeInfo, expr: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """What `expr` holds where the file shows it: itself unless it is a plain name; for a name, the one value
    the function assigns to it, where it is not also a parameter; None where that is not known."""
    if not isinstance(expr, cst.Name) or ctx.imports.imported(expr.value) is not None:
        return expr
    if scope.node is not None and expr.value in _parameters(scope.node):
        return None
    values = values_of(ctx, scope, expr)
    return values[0] if len(values) == 1 else None


def _parameters(function: cst.FunctionDef) -> Iterator[str]:
    params = function.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        yield param.name.value
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            yield star.name.value


def _flag(ctx: FileContext, scope: ScopeInfo, built: cst.Call, keyword: str, index: int) -> Optional[bool]:
    """The value of a boolean field of the dataclass `built` builds: False when not passed (these fields all
    default to False), None where the file does not show it."""
    known, value = passed_argument(ctx, scope, built, keyword, index)
    if not known:
        return None
    if value is None:
        return False
    for literal in (True, False):
        if is_literal(value, literal) or is_literal(_visible(ctx, scope, value), literal):
            return literal
    return None
