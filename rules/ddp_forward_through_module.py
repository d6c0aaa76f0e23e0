from __future__ import annotations

import re
from typing import Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

import libcst as cst

from dplint.analysis.names import Body, child_blocks, dotted, run_visitor
from dplint.analysis.context import FileContext
from dplint.rule import Invalid, Report, Rule, Valid
from dplint.analysis.ddp import USES_DISTRIBUTED, ScopeInfo, argument, calls_in, is_literal, iter_scopes, passed_parameters, scope_calls
from dplint.analysis.wrapping import wrapped_names
from dplint.rules.wrapper_attribute_access import WRAPPER_ATTRIBUTES

NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"})
# nn.Module's own API on `.module` (state_dict, parameters, ...) runs no forward.
_MODULE_API = WRAPPER_ATTRIBUTES - {"forward"}


def ddp_models(ctx: FileContext) -> Dict[int, FrozenSet[str]]:
    """id(scope node) → names that hold a DDP model there: bound in it, or a parameter a caller of the
    same file passes a DDP model to."""

    def compute() -> Dict[int, FrozenSet[str]]:
        scopes = list(iter_scopes(ctx.module))
        by_name = {(s.owner.name.value if s.owner else None, s.node.name.value): s for s in scopes if s.node is not None}
        found: Dict[int, Set[str]] = {id(s.node): set(wrapped_names(ctx, s)) for s in scopes}
        for scope in scopes:
            names = wrapped_names(ctx, scope)
            if not names:
                continue
            for call in scope_calls(scope):
                name = dotted(call.func) or ""
                owner = scope.owner.name.value if scope.owner is not None and name.startswith("self.") else None
                callee = by_name.get((owner, name[5:] if owner else name))
                if callee is not None and callee.node is not scope.node:
                    found[id(callee.node)].update(passed_parameters(call, callee.node, names))
        return {key: frozenset(value) for key, value in found.items()}

    return ctx.memo("ddp-models", compute)


class ForwardThroughDdpModule(Rule):
    """
    ## What it does
    Finds `ddp_model.module(x)` or `ddp_model.module.some_method(x)` (a DDP model bound in the same
    function or class, or passed to a function of the same file) whose result reaches `.backward()`.
    Calls under `torch.no_grad()`/`inference_mode()` and results that never reach a backward are fine,
    and so is a `.module` method whose result reaches a backward that the DDP model's own forward
    precedes in the same function (a loss computed from its outputs, `model.module.get_loss(ret, gt)`,
    or embeddings looked up through `.module` and fed to it): that forward armed the all-reduce.

    ## Why is this bad?
    DDP arms its gradient all-reduce in its own `forward`. A forward through `.module` skips it: the
    backward computes local gradients only, each rank steps with its own, and the replicas drift apart
    silently. Training is effectively one GPU's worth of data per replica. (Through `.module` under
    `no_grad` is the recommended way to evaluate on one rank.)

    ## Example
    ```python
    model = DDP(net, device_ids=[local_rank])
    logits = model.module(images)
    loss = criterion(logits, labels)
    loss.backward()
    ```

    ## Use instead
    ```python
    model = DDP(net, device_ids=[local_rank])
    logits = model(images)
    loss = criterion(logits, labels)
    loss.backward()
    ```
    For a custom method, route it through `forward` (e.g. a `mode` argument) so DDP sees the call.

    ## Known problems
    The result is followed through assignments in the same function only; DDP models from other
    files are not known.
    """

    code = "DPL504"
    name = "forward-through-ddp-module"
    summary = "A training forward through `ddp_model.module`: DDP does not average these gradients."
    triggers = re.compile(r"\.module[ \t]*[(.]")
    requires = USES_DISTRIBUTED
    distributed_programs_only = True

    VALID = [
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP

            def train(net, loader, optimizer, local_rank):
                model = DDP(net, device_ids=[local_rank])
                for ids, target in loader:
                    embeddings = model.module.embed(ids)  # fed to the DDP forward below, which arms the all-reduce
                    loss = (model(embeddings) - target).pow(2).mean()
                    loss.backward()
                    optimizer.step()
            """
        ),
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP

            def train(net, loader, optimizer):
                model = DDP(net)
                for points, gt in loader:
                    ret = model(points)
                    loss = model.module.get_loss(ret, gt)  # from the outputs of DDP's forward
                    loss.backward()
                    optimizer.step()
            """
        ),
        Valid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            loss = criterion(model(images), labels)
            loss.backward()
            """
        ),
        Valid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            with torch.no_grad():
                teacher = model.module(images)  # evaluation through .module
            loss = criterion(student(images), teacher)
            loss.backward()
            """
        ),
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            torch.save(model.module.state_dict(), "ckpt.pt")
            features = model.module.encode(images)
            print(features.shape)  # never reaches a backward
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            logits = model.module(images)
            loss = criterion(logits, labels)
            loss.backward()
            """,
            line=3,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Trainer:
                def __init__(self, net, rank):
                    self.model = nn.parallel.DistributedDataParallel(net, device_ids=[rank])

                def step(self, batch):
                    loss = self.model.module.compute_loss(batch)
                    self.scaler.scale(loss).backward()
            """,
            line=8,
        ),
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP

            def train_step(model, batch, optimizer):
                out, aux = model.module(batch["x"])
                (out.mean() + aux).backward()
                optimizer.step()

            def main(net, batch, optimizer):
                ddp = DDP(net)
                train_step(ddp, batch, optimizer)
            """,
            line=4,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        models = ddp_models(ctx)
        for scope in iter_scopes(ctx.module):
            names = models.get(id(scope.node), frozenset())
            if names:
                yield from self._scope(ctx, scope, names)

    def _scope(self, ctx: FileContext, scope: ScopeInfo, names: FrozenSet[str]) -> Iterator[Report]:
        tainted: Dict[str, cst.Call] = {}
        forwarded = False  # the DDP model's own forward ran: it armed the all-reduce for every backward after it
        for small, no_grad in _statements(ctx, scope.body, False):
            forwarded = forwarded or any(dotted(c.func) in names for c in calls_in(small))
            sources = [] if no_grad else [c for c in calls_in(small) if _bypasses(c, names)]
            for call in calls_in(small):
                if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
                    origin = _origin(call, tainted, sources)
                    if origin is not None and not forwarded:
                        owner = dotted(origin.func) or "model.module"
                        yield Report(
                            node=origin,
                            message=f"`{owner}(...)` skips DDP's forward and reaches `.backward()`: gradients are not averaged.",
                            help=f"Call the DDP model itself (`{owner.split('.module')[0]}(...)`), so DDP syncs the gradients.",
                        )
                        return
            if isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                origin = _first_source(small.value, tainted, sources) if small.value is not None else None
                targets = small.targets if isinstance(small, cst.Assign) else [small]
                for target in targets:
                    for name in _target_names(target.target):
                        if origin is not None:
                            tainted[name] = origin
                        elif not isinstance(small, cst.AugAssign):
                            tainted.pop(name, None)


def _bypasses(call: cst.Call, names: FrozenSet[str]) -> bool:
    target = dotted(call.func)
    if target is None:
        return False
    for name in names:
        if target == f"{name}.module":
            return True
        prefix = f"{name}.module."
        if target.startswith(prefix) and target.count(".") == prefix.count(".") and target[len(prefix):] not in _MODULE_API:
            return True
    return False


def _origin(call: cst.Call, tainted: Dict[str, cst.Call], sources: List[cst.Call]) -> Optional[cst.Call]:
    for part in [call.func.value, *(arg.value for arg in call.args)]:  # type: ignore[attr-defined]
        origin = _first_source(part, tainted, sources)
        if origin is not None:
            return origin
    return None


def _first_source(expr: cst.BaseExpression, tainted: Dict[str, cst.Call], sources: List[cst.Call]) -> Optional[cst.Call]:
    for call in calls_in(expr):
        if any(call is source for source in sources):
            return call
    collector = _Dotted()
    run_visitor(expr, collector)
    for name in collector.names:
        if name in tainted:
            return tainted[name]
    return None


class _Dotted(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: List[str] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.names.append(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        name = dotted(node)
        if name is not None:
            self.names.append(name)


def _target_names(target: cst.BaseExpression) -> List[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _target_names(element.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    name = dotted(target)
    return [name] if name is not None else []


def _statements(ctx: FileContext, body: Body, no_grad: bool) -> Iterator[Tuple[cst.BaseSmallStatement, bool]]:
    """The scope's small statements in source order, and whether they run under `torch.no_grad()`."""
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                yield small, no_grad
        elif isinstance(statement, cst.BaseCompoundStatement):
            inner = no_grad or (isinstance(statement, cst.With) and any(_is_no_grad(ctx, item.item) for item in statement.items))
            for block in child_blocks(statement):
                yield from _statements(ctx, block, inner)


def _is_no_grad(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    if not isinstance(expr, cst.Call):
        return False
    qualified = ctx.qualify(expr.func)
    return qualified in NO_GRAD or (qualified == "torch.set_grad_enabled" and is_literal(argument(expr, "mode", 0), False))
