from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

import libcst as cst

from dplint.analysis.names import Body, block_body, child_blocks, dotted
from dplint.analysis.context import FileContext
from dplint.analysis.outline import Outline
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.ddp import (
    NAMES_A_DISTRIBUTED_MODEL,
    USES_DISTRIBUTED_OR_A_FRAMEWORK,
    CALLS_A_FRAMEWORK_COLLECTIVE,
    CHECKPOINT_COLLECTIVES,
    GATHERING_TENSOR_METHODS,
    STATE_DICT_COLLECTIVES,
    FRAMEWORK_COLLECTIVES,
    FRAMEWORK_METHODS,
    SHARDED_ACCELERATE_COLLECTIVES,
    FSDP_COLLECTIVE_METHODS,
    shards_through_accelerate,
    on_a_subgroup,
    ScopeInfo,
    argument,
    collective_calls,
    collective_name,
    exits,
    is_literal,
    iter_scopes,
    passed_parameters,
    scope_calls,
)
from dplint.analysis.execution import ACCELERATOR_CLASS
from dplint.analysis.torch_api import FULLY_SHARDED_DATA_PARALLEL
from dplint.analysis.wrapping import DDP_CLASSES, FSDP_CLASSES, WrapSite, ddp_wraps_at, wrapped_names, wrapper_call


@dataclass(frozen=True)
class Collective:
    """A call every rank must make: `what` names it in messages and pairs branches."""

    what: str
    call: cst.Call
    buffers_only: bool = False  # a DDP forward: a collective only when the model has buffers to sync


class _Callees:
    """The file's top-level functions and methods, and the collectives each runs on every rank."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.scopes: Dict[Tuple[Optional[str], str], ScopeInfo] = {}
        for scope in iter_scopes(ctx.module):
            if scope.node is not None:
                owner = scope.owner.name.value if scope.owner is not None else None
                self.scopes.setdefault((owner, scope.node.name.value), scope)
        self._own: Dict[int, List[Collective]] = {}

    def resolve(self, call: cst.Call, caller: ScopeInfo) -> Optional[ScopeInfo]:
        name = dotted(call.func)
        if name is None:
            return None
        if "." not in name:
            return self.scopes.get((None, name))
        if name.startswith("self.") and name.count(".") == 1 and caller.owner is not None:
            return self.scopes.get((caller.owner.name.value, name[5:]))
        return None

    def own_collectives(self, scope: ScopeInfo) -> List[Collective]:
        """Collectives the function runs on every rank that calls it (those under its own rank tests excluded)."""
        key = id(scope.node)
        if key not in self._own:
            self._own[key] = [
                found
                for call in scope_calls(scope)
                for found in direct_collectives(self.ctx, scope, call)
                if _on_every_rank(self.ctx, call)
            ]
        return self._own[key]


def _on_every_rank(ctx: FileContext, call: cst.Call) -> bool:
    where = ctx.local_where(call)
    return where is not None and where.on_every_rank


def direct_collectives(ctx: FileContext, scope: ScopeInfo, call: cst.Call) -> List[Collective]:
    name = collective_name(ctx, call)
    if name is not None:
        # On a subgroup of its own, the ranks a condition leaves out may not be members: unknown.
        return [] if on_a_subgroup(ctx, call, name) else [Collective(f"`dist.{name}()`", call)]
    qualified = ctx.qualify(call.func) or ""
    owner, _, method = qualified.rpartition(".")
    if owner in FULLY_SHARDED_DATA_PARALLEL and method in FSDP_COLLECTIVE_METHODS:
        return [Collective(f"`FSDP.{method}()`", call)]
    if qualified in CHECKPOINT_COLLECTIVES:
        return [Collective(f"`{ctx.code(call.func)}()` (torch.distributed.checkpoint)", call)]
    if qualified in STATE_DICT_COLLECTIVES:
        return [Collective(f"`{ctx.code(call.func)}()`", call)]
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in GATHERING_TENSOR_METHODS and not call.args:
        return [Collective(f"`{ctx.code(call.func)}()` (a DTensor's gather)", call)]
    target = dotted(call.func)
    if target is not None and target in wrapped_names(ctx, scope):
        wraps = ddp_wraps_at(ctx, scope, call)
        sites = wraps.get(target, frozenset()) if wraps is not None else None
        if sites is None or (sites and not all(_syncs_no_buffers(ctx, site) for site in sites)):
            return [Collective(f"the forward of DDP model `{target}`", call, buffers_only=True)]
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "state_dict":
        receiver = dotted(call.func.value)
        if receiver is not None and receiver in wrapped_names(ctx, scope, FSDP_CLASSES):
            return [Collective(f"FSDP `{receiver}.state_dict()`", call)]
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in FRAMEWORK_METHODS:
        held = ctx.object_class(call.func.value) or ""
        if call.func.attr.value in FRAMEWORK_COLLECTIVES.get(held, ()):
            return [Collective(f"`{ctx.code(call.func)}()`", call)]
        if held == ACCELERATOR_CLASS and call.func.attr.value in SHARDED_ACCELERATE_COLLECTIVES and shards_through_accelerate(ctx):
            return [Collective(f"`{ctx.code(call.func)}()` (under DeepSpeed or FSDP)", call)]
    return []


def _syncs_no_buffers(ctx: FileContext, site: WrapSite) -> bool:
    """Whether the wrap is a DDP wrap of this file whose forward runs no collective: made with
    `broadcast_buffers=False`, or of a model known to hold no buffers."""
    wrap = wrapper_call(ctx, site.node, DDP_CLASSES) if isinstance(site.node, cst.BaseExpression) else None
    if wrap is None:
        return False
    model = argument(wrap, "module", 0)
    return is_literal(argument(wrap, "broadcast_buffers"), False) or (model is not None and ctx.holds_modules_without_buffers(model))


def collectives_of(ctx: FileContext, callees: _Callees, scope: ScopeInfo, block: Body) -> List[Collective]:
    """The collectives a block runs, one call level deep into the file's own functions."""
    found: List[Collective] = []
    for call in scope_calls(ScopeInfo(scope.node, block, scope.owner)):
        where = ctx.local_where(call)
        if where is None or not where.in_group:
            continue  # the body of `if local_rank == -1:` runs in no process group
        direct = direct_collectives(ctx, scope, call)
        if direct:
            found.extend(direct)
            continue
        callee = callees.resolve(call, scope)
        if callee is None or callee.node is scope.node:
            continue
        inner = callees.own_collectives(callee)
        if inner:
            if inner[0].buffers_only:
                found.append(Collective(f"`{callee.node.name.value}()` (a DDP forward)", call, buffers_only=True))
            else:
                found.append(Collective(f"`{callee.node.name.value}()`, which calls {inner[0].what}", call))
            continue
        forwarded = _forwards_through_parameter(ctx, call, callee, wrapped_names(ctx, scope))
        if forwarded:
            found.append(Collective(f"`{callee.node.name.value}()` (a DDP forward)", call, buffers_only=True))
    return found


def _forwards_through_parameter(ctx: FileContext, call: cst.Call, callee: ScopeInfo, ddp_names: FrozenSet[str]) -> Optional[str]:
    """The DDP model passed to `callee` whose parameter it calls (`model(x)`), if any."""
    if not ddp_names:
        return None
    parameters = set(passed_parameters(call, callee.node, ddp_names))
    if not parameters:
        return None
    for inner in scope_calls(callee):
        if isinstance(inner.func, cst.Name) and inner.func.value in parameters:
            return inner.func.value
    return None


class RankConditionalCollective(Rule):
    """
    ## What it does
    Finds a collective that runs under a rank condition (`if rank == 0:`, `if is_main_process():`,
    `local_rank in (-1, 0)`, after `if rank != 0: return`, in a `@rank_zero_only` function):
    `dist.barrier/all_reduce/all_gather/broadcast/reduce/...`, the object collectives, the forward of a
    DDP model (it syncs buffers), FSDP `state_dict()`/`summon_full_params`, `torch.distributed.checkpoint`'s
    `save`/`load` and its `get_model_state_dict`/`get_state_dict`/`set_model_state_dict` family, a DTensor's
    `full_tensor()` (FSDP2's parameters), the frameworks' methods that
    run collectives (Accelerate's `accelerator.wait_for_everyone/gather/gather_for_metrics/reduce/
    pad_across_processes`, a DeepSpeed engine's `save_checkpoint`, Lightning's
    `trainer.save_checkpoint`, Fabric's `barrier/all_gather/all_reduce/broadcast/save`, on an object the
    program built), and calls to functions of the same file that run one of these. Under
    `if accelerator.is_main_process:`, `if trainer.is_global_zero:` or `@rank_zero_only` they hang the
    same way. Complementary branches are paired: a barrier in both branches
    of the `if`, or in two rank conditions of the same block (the "download on rank 0 first" idiom), is
    fine.

    ## Why is this bad?
    Every rank must enter every collective, in the same order. When only rank 0 calls `barrier()` it
    waits for peers that never come: the job hangs until the NCCL timeout (30 minutes by default) and
    dies with a timeout far from the cause. Rank-0-only evaluation through the DDP model hangs the same
    way when the model has buffers (BatchNorm).

    ## Example
    ```python
    if rank == 0:
        validate(model, val_loader)   # model is the DDP model
        dist.barrier()
    ```

    ## Use instead
    ```python
    if rank == 0:
        validate(model.module, val_loader)   # no DDP forward, no collective
    dist.barrier()                           # every rank
    ```

    ## Known problems
    Functions of other files are not followed. Conditions on values that differ between ranks but are
    not named like a rank (a per-rank loss, a file that exists on one node) are not recognised. A
    collective on a process group of its own (`group=`) is not reported: whether the ranks the condition
    leaves out belong to that group is not known. A DDP model of a project class whose parts are all
    known to hold no buffers (convolutions, linear layers, layer or group norms; no batch norm, no
    `register_buffer`) syncs nothing in its forward and is not reported. Where its parts are not all
    known (a model library's class, a registry, a module passed in), its rank-0-only forward is
    reported: that does not hang for a model without buffers, or with `broadcast_buffers=False` passed
    elsewhere than at the wrap. A forward counts as DDP's only where
    the name may hold the wrapper at that statement (one written before `model = DDP(model)` goes
    through the bare model), and only where a wrap that reaches it syncs buffers (not
    `DDP(model, broadcast_buffers=False)`). The body of
    `if local_rank == -1:` runs only without a process group
    and is not checked. Accelerate's `save_state` and `get_state_dict` gather only under DeepSpeed or
    FSDP: they are reported where the program itself sets those up (a `DeepSpeedPlugin` or
    `FullyShardedDataParallelPlugin`, or `Accelerator(deepspeed_plugin=...)`), not where only the launch
    configuration (`accelerate config`) chooses them. A single-device Lightning
    Trainer's `trainer.save_checkpoint` under `is_global_zero` is reported too, though it runs no
    collective there.
    """

    code = "DPL507"
    preview = True
    preview_reason = (
        "Measured 0.73 on the 904 repositories of bench/wild (32 true, 12 false, 13 moot): a forward through a DDP model "
        "built by a registry or a model library (whose buffers are not known), a model reloaded unwrapped, or collectives "
        "that the ranks pair on purpose (a server and its workers, staggered creation) are reported; the frameworks' "
        "collectives made 2 findings, both true."
    )
    name = "rank-conditional-collective"
    summary = "A collective (barrier, all_reduce, a DDP forward, ...) that only some ranks run: the job hangs."
    triggers = GuardedPattern(r"\bif\b", ["if"])
    requires = USES_DISTRIBUTED_OR_A_FRAMEWORK

    VALID = [
        Valid(
            """
            import torch.distributed as dist

            def share_lengths(lengths, tensor_parallel_rank, pipeline_group, first_stage_rank):
                if tensor_parallel_rank == 0:  # the pipeline group holds exactly these ranks
                    dist.broadcast(lengths, first_stage_rank, pipeline_group)
            """
        ),
        Valid(
            """
            from accelerate import Accelerator

            def train(model, optimizer, output_dir):
                accelerator = Accelerator()  # DDP unless `accelerate config` chose otherwise
                model, optimizer = accelerator.prepare(model, optimizer)
                if accelerator.is_main_process:
                    accelerator.save_state(output_dir)
            """
        ),
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP

            def train(args, model):
                model = DDP(model, device_ids=[args.local_rank])
                for step in range(args.steps):
                    if args.local_rank in [-1, 0] and step % args.logging_steps == 0:
                        if args.local_rank == -1:  # only without a process group: no rank of a DDP job
                            evaluate(args, model)

            def evaluate(args, model):
                return model(args.batch)
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            if dist.get_rank() == 0:
                print("saving")
            dist.barrier()
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            if args.local_rank not in [-1, 0]:
                dist.barrier()  # the others wait while rank 0 downloads
            dataset = load_dataset(args.data)
            if args.local_rank == 0:
                dist.barrier()  # rank 0 releases them
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            if dist.get_rank() == 0:
                with torch.no_grad():
                    preds = model.module(batch)  # no DDP forward
                objects = [preds]
            else:
                objects = [None]
            dist.broadcast_object_list(objects, src=0)
            """
        ),
        Valid(
            """
            from accelerate import Accelerator

            accelerator = Accelerator()
            accelerator.wait_for_everyone()  # every rank
            if accelerator.is_main_process:
                accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
            """
        ),
        Valid(
            """
            import os
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            ddp = int(os.environ.get("RANK", -1)) != -1
            if ddp:
                dist.init_process_group("nccl")
            master_process = not ddp or dist.get_rank() == 0
            if master_process:
                reference = model(x)  # the bare model: the wrap comes below
            if ddp:
                model = DDP(model)
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            def train(net, rank, loader):
                dist.init_process_group("nccl")
                model = DDP(net, device_ids=[rank], broadcast_buffers=False)  # its forward syncs nothing
                for x in loader:
                    model(x).sum().backward()
                if rank == 0:
                    with torch.no_grad():
                        preview = model(x)
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP

            class Generator(nn.Module):  # weight-normed convolutions: no buffers
                def __init__(self, channels):
                    super().__init__()
                    self.conv = nn.utils.weight_norm(nn.Conv1d(channels, channels, 3, padding=1))

                def forward(self, x):
                    return self.conv(x)

            def train(rank, loader):
                dist.init_process_group("nccl")
                model = DDP(Generator(80).to(rank), device_ids=[rank])
                for x in loader:
                    model(x).sum().backward()
                if rank == 0:
                    with torch.no_grad():
                        sample = model(x)  # no buffers to sync: no collective
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.distributed as dist

            def save(model, path):
                if dist.get_rank() == 0:  # FSDP2: every rank holds a shard of each parameter
                    torch.save({name: p.full_tensor() for name, p in model.state_dict().items()}, path)
            """,
            line=6,
        ),
        Invalid(
            """
            from accelerate import Accelerator, DeepSpeedPlugin

            def train(model, optimizer, output_dir):
                accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
                model, optimizer = accelerator.prepare(model, optimizer)
                if accelerator.is_main_process:
                    accelerator.save_state(output_dir)  # DeepSpeed: every rank saves its shard
            """,
            line=7,
        ),
        Invalid(
            """
            from accelerate import Accelerator

            def train(model):
                accelerator = Accelerator()
                model = accelerator.prepare(model)
                if accelerator.is_main_process:
                    accelerator.wait_for_everyone()
            """,
            line=7,
        ),
        Invalid(
            """
            import torch.distributed as dist
            import torch.distributed.checkpoint as dcp

            def save(model, step):
                if dist.get_rank() == 0:
                    dcp.save({"model": model.state_dict()}, checkpoint_id=f"ckpt/{step}")
            """,
            line=6,
        ),
        Invalid(
            """
            import deepspeed

            def main(args, model):
                engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
                if engine.global_rank == 0:
                    engine.save_checkpoint(args.output_dir)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.distributed as dist
            if dist.get_rank() == 0:
                save(model)
                dist.barrier()
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def evaluate(model, loader):
                with torch.no_grad():
                    return [model(x) for x, _ in loader]

            def main(net, rank, loader):
                model = DDP(net)
                if rank == 0:
                    evaluate(model, loader)
            """,
            line=11,
        ),
        Invalid(
            """
            import torch.distributed as dist

            def log_metrics(loss, rank):
                if rank != 0:
                    return
                dist.all_reduce(loss)
                print(loss.item())
            """,
            line=6,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        if not super().applies_to(text, module_classes, project):
            return False
        # Every collective this rule knows is a torch.distributed call, a DDP/FSDP model built here, or a
        # framework's method called by name.
        return (
            NAMES_A_DISTRIBUTED_MODEL.search(text) is not None
            or collective_calls(text).search(text) is not None
            or CALLS_A_FRAMEWORK_COLLECTIVE.search(text) is not None
        )

    def applies_to_outline(self, outline: Outline) -> bool:
        return bool(outline.condition_words)  # an `if`, a `while` or a decorator: something to run some ranks only

    def check(self, ctx: FileContext) -> Iterator[Report]:
        callees = _Callees(ctx)
        for scope in iter_scopes(ctx.module):
            yield from self._block(ctx, callees, scope, scope.body)

    def _block(self, ctx: FileContext, callees: _Callees, scope: ScopeInfo, body: Body) -> Iterator[Report]:
        unbalanced: List[Tuple[Tuple[str, ...], Collective]] = []
        for index, statement in enumerate(body):
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, cst.If) and ctx.splits_ranks(statement.test):
                branches = [collectives_of(ctx, callees, scope, block) for block in child_blocks(statement)]
                if statement.orelse is None:
                    if exits(block_body(statement.body)):
                        # `if rank != 0: return`: the rest of the block runs on the other ranks only.
                        branches.append(collectives_of(ctx, callees, scope, body[index + 1 :]))
                    else:
                        branches.append([])
                counts = [Counter(_pairing_key(c) for c in branch) for branch in branches]
                if any(count != counts[0] for count in counts):
                    odd = next(c for branch in branches for c in branch)
                    unbalanced.append((tuple(sorted(set().union(*counts))), odd))
                if statement.orelse is None and exits(block_body(statement.body)):
                    break
                continue
            if isinstance(statement, cst.BaseCompoundStatement):
                for block in child_blocks(statement):
                    yield from self._block(ctx, callees, scope, block)
        signatures = Counter(signature for signature, _ in unbalanced)
        for signature, collective in unbalanced:
            if signatures[signature] > 1:
                continue  # complementary conditions with the same collectives: they meet
            if collective.buffers_only:
                yield Report(
                    node=collective.call,
                    message=f"Only some ranks run {collective.what} here: DDP syncs buffers there, so a model with buffers hangs.",
                    help="Evaluate through the unwrapped `.module` on the one rank, or run the forward on every rank.",
                )
            else:
                yield Report(
                    node=collective.call,
                    message=f"Only some ranks run {collective.what} here: the other ranks never join, so it hangs.",
                    help="Run the collective on every rank, outside the rank condition (or in every branch of it).",
                )


def _pairing_key(collective: Collective) -> str:
    return collective.what


