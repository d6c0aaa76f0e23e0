from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.ddp import calls_in, exits
from dplint.analysis.execution import (
    ACCELERATOR_CLASS,
    DEEPSPEED_ENGINE,
    DEEPSPEED_OPTIMIZER,
    OPTIMIZER,
    builders_of,
    guards_exclude,
)
from dplint.analysis.names import Body, block_body, child_blocks, child_nodes, dotted, header_expressions
from dplint.analysis.patterns import GuardedPattern
from dplint.rule import Invalid, Report, Rule, Valid

_ACCELERATOR_BUILDERS = builders_of(ACCELERATOR_CLASS)
_DEEPSPEED_INITIALIZE = "deepspeed.initialize"
# What a tensor's `backward` takes by keyword; a framework's `backward(loss=...)` takes the loss.
_TENSOR_BACKWARD_KEYWORDS = frozenset({"gradient", "retain_graph", "create_graph", "inputs"})
_PREPARE_METHODS = frozenset({"prepare", "prepare_model"})


class BackwardBypassesEngine(Rule):
    """
    ## What it does
    Finds a tensor's `backward()` (`loss.backward()`, `scaler.scale(loss).backward()`) where the
    program trains through Accelerate's `Accelerator` (it built one and passed a model to
    `accelerator.prepare`) and that accelerator is in use on the path of the call; and, under DeepSpeed
    (the engine `deepspeed.initialize` hands back first), `loss.backward()` on a loss computed from the
    engine, and `optimizer.step()` on the optimizer `deepspeed.initialize` hands back (or on the torch
    optimizer passed to it), instead of `engine.backward(loss)` and `engine.step()`.

    ## Why is this bad?
    `accelerator.backward(loss)` scales the loss under fp16 mixed precision, divides it by the
    gradient-accumulation steps inside `accelerator.accumulate`, and hands it to DeepSpeed or Megatron
    when `accelerate launch` configures them. A plain `loss.backward()` skips all of that, silently:
    under fp16 the prepared optimizer's scaler unscales gradients that were never scaled, and with
    accumulation every micro-batch's gradient counts in full. A DeepSpeed engine does the same in
    `engine.backward(loss)` (loss scaling, the accumulation division, the gradient reduction it
    finishes) and `engine.step()` (the step at the accumulation boundary, gradient clipping, the
    scheduler, zeroing the gradients): a step around the engine skips them, and before DeepSpeed 0.18.3
    (which hooks a plain `loss.backward()` on the engine's output) so does a backward around it.

    ## Example
    ```python
    accelerator = Accelerator(mixed_precision="fp16")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    accelerator = Accelerator(mixed_precision="fp16")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
    ```
    Under DeepSpeed: `model_engine.backward(loss)`, then `model_engine.step()`.

    ## Known problems
    The accelerator or engine must be in view where the backward is written: a name or `self`
    attribute of the function (or of the functions around it) that holds it, as the program's
    assignments and calls show. A backward in a helper that receives only the prepared model is not
    reported. Where a name holds the framework's object on one path and something else on another
    (`accelerator = Accelerator() if args.accelerate else None`), it is not known to hold it, and
    nothing is reported; nor in the other branch of an `if` whose branch calls the framework's
    `backward`. Under DeepSpeed, a loss is only known to come from the engine when the function
    computes it from the engine's expression. With Accelerate and no mixed precision, no
    accumulation and no DeepSpeed, `loss.backward()` happens to compute the same gradients; it is
    reported all the same, since the launch configuration can turn them on.
    """

    code = "DPL518"
    preview = True
    preview_reason = (
        "Too few findings to judge: 7 on the 904 repositories of bench/wild, labelled blind: 6 in DeepSpeed's own examples "
        "(4 true, 2 false: a layer-wise distillation that steps an optimizer of its own), 1 moot (an Accelerator with no "
        "mixed precision or accumulation)."
    )
    name = "backward-bypasses-engine"
    summary = (
        "`loss.backward()` or `optimizer.step()` around an Accelerator or DeepSpeed engine: its loss scaling and "
        "gradient accumulation are skipped."
    )
    triggers = GuardedPattern(r"\.(?:backward|step)\s*\(", ["backward", "step"])

    VALID = [
        Valid(
            """
            import torch
            from accelerate import Accelerator

            def train(model, loader):
                accelerator = Accelerator(mixed_precision="fp16")
                optimizer = torch.optim.AdamW(model.parameters())
                model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
                for x in loader:
                    accelerator.backward(model(x).sum())
                    optimizer.step()
            """
        ),
        Valid(
            """
            import torch
            from accelerate import Accelerator

            class Trainer:
                def __init__(self, model, use_accelerate):
                    self.model = model
                    self.optimizer = torch.optim.AdamW(model.parameters())
                    self.accelerator = Accelerator() if use_accelerate else None
                    if self.accelerator is not None:
                        self.model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)

                def step(self, x):
                    loss = self.model(x).sum()
                    if self.accelerator is not None:
                        self.accelerator.backward(loss)
                    else:
                        loss.backward()
                    self.optimizer.step()
            """
        ),
        Valid(
            """
            import torch
            from accelerate import Accelerator

            def train(model, loader, use_accelerate):
                optimizer = torch.optim.AdamW(model.parameters())
                accelerator = Accelerator()
                model, optimizer = accelerator.prepare(model, optimizer)
                for x in loader:
                    loss = model(x).sum()
                    if use_accelerate:
                        accelerator.backward(loss)
                    else:
                        loss.backward()
            """
        ),
        Valid(
            """
            import torch
            from accelerate import Accelerator

            def train(model, loader):
                accelerator = Accelerator()
                loader = accelerator.prepare(loader)  # only the data is sharded: no model was prepared
                optimizer = torch.optim.AdamW(model.parameters())
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
            """
        ),
        Valid(
            """
            import deepspeed

            def train(args, model, loader):
                model_engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
                for x in loader:
                    loss = model_engine(x).sum()
                    model_engine.backward(loss)
                    model_engine.step()
            """
        ),
        Valid(
            """
            import torch

            class Clamp(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    return x.clamp(0, 1)

                @staticmethod
                def backward(ctx, grad):
                    return grad

            def train(model, loader):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for x in loader:
                    Clamp.apply(model(x)).sum().backward()  # no framework in this program
                    optimizer.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from accelerate import Accelerator

            def train(model, loader):
                accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
                optimizer = torch.optim.AdamW(model.parameters())
                model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
                for x in loader:
                    with accelerator.accumulate(model):
                        loss = model(x).sum()
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad()
            """,
            line=11,
        ),
        Invalid(
            """
            import torch
            from accelerate import Accelerator

            class Trainer:
                def __init__(self, model):
                    self.accelerator = Accelerator(mixed_precision="fp16")
                    self.scaler = torch.cuda.amp.GradScaler()
                    optimizer = torch.optim.AdamW(model.parameters())
                    self.model, self.optimizer = self.accelerator.prepare(model, optimizer)

                def step(self, x):
                    with self.accelerator.autocast():
                        loss = self.model(x).sum()
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
            """,
            line=14,
        ),
        Invalid(
            """
            import deepspeed

            def train(args, model, loader):
                model_engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
                for x in loader:
                    loss = model_engine(x).sum()
                    loss.backward()
                    model_engine.step()
            """,
            line=7,
        ),
        Invalid(
            """
            import deepspeed

            def train(args, model, loader):
                model_engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
                for x in loader:
                    loss = model_engine(x).sum()
                    model_engine.backward(loss)
                    optimizer.step()
            """,
            line=8,
        ),
        Invalid(
            """
            import deepspeed
            import torch

            def train(args, model, loader):
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
                for x in loader:
                    engine.backward(engine(x).sum())
                    optimizer.step()
            """,
            line=9,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        called = ctx.project.execution.called_names
        accelerate = not called.isdisjoint(_ACCELERATOR_BUILDERS)
        deepspeed = _DEEPSPEED_INITIALIZE in called
        if not (accelerate or deepspeed):
            return
        for scope in _scopes(ctx.module):
            if scope.node is not None and scope.node.name.value == "backward":
                continue  # an `autograd.Function`'s own backward, or a wrapper that is the framework's backward
            view: Optional[_View] = None
            for call, others in _calls_with_alternatives(scope.body, ()):
                method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
                if method not in ("backward", "step"):
                    continue
                if view is None:
                    view = _View(ctx, scope, accelerate, deepspeed)
                report = view.backward(call, others) if method == "backward" else view.step(call, others)
                if report is not None:
                    yield report


@dataclass(frozen=True)
class _Scope:
    node: Optional[cst.FunctionDef]  # None: the module's top level
    body: Body
    outer: Tuple[Body, ...]  # the bodies of the functions around it, innermost first


def _scopes(module: cst.Module) -> Iterator[_Scope]:
    """The module's top level and every function, with the bodies of the functions around each."""
    yield _Scope(None, module.body, ())
    pending: List[Tuple[Body, Tuple[Body, ...]]] = [(module.body, ())]
    while pending:
        body, outer = pending.pop()
        for statement in body:
            if isinstance(statement, cst.FunctionDef):
                inner = block_body(statement.body)
                yield _Scope(statement, inner, outer)
                pending.append((inner, (inner, *outer)))
            elif isinstance(statement, cst.ClassDef):
                pending.append((block_body(statement.body), outer))
            elif isinstance(statement, cst.BaseCompoundStatement):
                pending.extend((block, outer) for block in child_blocks(statement))


def _calls_with_alternatives(body: Body, others: Tuple[cst.CSTNode, ...]) -> Iterator[Tuple[cst.Call, Tuple[cst.CSTNode, ...]]]:
    """Every call of the block's own statements (not of nested functions), with the code that runs
    instead of it: the other branches of each `if` it is in, and the code after an `if` whose branch
    holding it leaves (`if not accelerator: loss.backward(); return`)."""
    for index, statement in enumerate(body):
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.If):
            rest = tuple(body[index + 1 :])
            for call in calls_in(statement.test):
                yield call, others
            branch = block_body(statement.body)
            orelse: Tuple[cst.CSTNode, ...] = (statement.orelse,) if statement.orelse is not None else ()
            yield from _calls_with_alternatives(branch, others + orelse + (rest if exits(branch) else ()))
            if isinstance(statement.orelse, cst.If):
                yield from _calls_with_alternatives((statement.orelse,), others + (statement.body,))
            elif statement.orelse is not None:
                alternative = block_body(statement.orelse.body)
                yield from _calls_with_alternatives(alternative, others + (statement.body,) + (rest if exits(alternative) else ()))
        elif isinstance(statement, cst.BaseCompoundStatement):
            for header in header_expressions(statement):
                for call in calls_in(header):
                    yield call, others
            for block in child_blocks(statement):
                yield from _calls_with_alternatives(block, others)
        else:
            for call in calls_in(statement):
                yield call, others


def _is_tensor_backward(call: cst.Call) -> bool:
    """`x.backward()`, `x.backward(retain_graph=True)`: no loss passed (a framework's `backward(loss)` takes one)."""
    return all(argument.keyword is not None and argument.keyword.value in _TENSOR_BACKWARD_KEYWORDS for argument in call.args)


def _referenced(body: Body) -> List[cst.BaseExpression]:
    """The names and `self` attributes a block's own statements read or bind, in order; not those of
    nested functions, nor the attributes and keywords named after a dot or before `=`."""
    found: List[cst.BaseExpression] = []
    pending: List[cst.CSTNode] = list(reversed(body))
    while pending:
        node = pending.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if isinstance(node, cst.Name):
            found.append(node)
        elif isinstance(node, cst.Attribute):
            if isinstance(node.value, cst.Name) and node.value.value == "self":
                found.append(node)
            else:
                pending.append(node.value)
        elif isinstance(node, cst.Arg):
            pending.append(node.value)
        else:
            pending.extend(reversed(child_nodes(node)))
    return found


def _codes_in(node: cst.CSTNode) -> Set[str]:
    """The names and attribute chains an expression or statement mentions (`loss`, `self.engine`, `out.logits`)."""
    found: Set[str] = set()
    pending: List[cst.CSTNode] = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, (cst.Name, cst.Attribute)):
            name = dotted(current)
            if name is not None:
                found.add(name)
        pending.extend(child_nodes(current))
    return found


class _View:
    """The Accelerator and DeepSpeed objects in view in one function, and what it computes from them."""

    def __init__(self, ctx: FileContext, scope: _Scope, accelerate: bool, deepspeed: bool) -> None:
        self.ctx = ctx
        self.scope = scope
        self.accelerate = accelerate
        self.deepspeed = deepspeed
        self._classes: Dict[Tuple[str, int], Optional[str]] = {}
        # Names bound by `deepspeed.initialize(...)` in these functions: (code, line) of each engine and optimizer.
        self.local_engines: List[Tuple[str, int]] = []
        self.local_optimizers: List[Tuple[str, int]] = []
        self._candidates: List[str] = []
        seen: Set[str] = set()
        bodies = (scope.body, *scope.outer)
        for body in bodies:
            for expr in _referenced(body):
                code = ctx.code(expr)
                if code not in seen:
                    seen.add(code)
                    self._candidates.append(code)
            if deepspeed:
                self._local_initializations(body)
        if scope.node is not None:
            for param in scope.node.params.params:
                if param.name.value not in seen:
                    seen.add(param.name.value)
                    self._candidates.append(param.name.value)

    def _local_initializations(self, body: Body) -> None:
        pending: List[cst.CSTNode] = list(body)
        while pending:
            node = pending.pop()
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                continue
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and self.ctx.qualify(node.value.func) == _DEEPSPEED_INITIALIZE:
                line = self.ctx.line(node)
                target = node.targets[0].target
                if isinstance(target, (cst.Tuple, cst.List)):
                    elements = [element.value for element in target.elements]
                    for position, bound in ((0, self.local_engines), (1, self.local_optimizers)):
                        if len(elements) > position and dotted(elements[position]) not in (None, "_"):
                            bound.append((self.ctx.code(elements[position]), line))
                continue
            pending.extend(child_nodes(node))

    def object_class(self, code: str, line: int) -> Optional[str]:
        key = (code, line)
        if key not in self._classes:
            value = self.ctx.execution.value(code, line)
            self._classes[key] = value[1] if value[0] == "object" else None
        return self._classes[key]

    def _in_use(self, code: str, line: int, bound_at: Optional[int] = None) -> bool:
        """Whether the object the expression holds may be the one in use at the line: no condition of the
        statement there rules it out (nor the other branch of where it was bound, for a local binding)."""
        execution = self.ctx.execution
        if execution.rules_out_object(line, code):
            return False
        if bound_at is not None:
            if bound_at > line:
                return False
            here, there = execution.statement_guard(line), execution.statement_guard(bound_at)
            if here is None or there is None or guards_exclude(here, there):
                return False
        return True

    def objects(self, object_class: str, line: int) -> List[str]:
        """The expressions in view that hold an object of the class and may be in use at the line."""
        found = [code for code in self._candidates if self.object_class(code, line) == object_class and self._in_use(code, line)]
        if object_class == DEEPSPEED_ENGINE:
            found += [code for code, bound in self.local_engines if code not in found and self._in_use(code, line, bound)]
        return found

    def _framework_call_among(self, others: Sequence[cst.CSTNode], line: int) -> bool:
        """Whether the code that runs instead calls a framework's backward (`accelerator.backward(loss)`,
        `engine.backward(loss)`, `self.manual_backward(loss)`), or, for a step, an engine's step."""
        engines = {code for code, _ in self.local_engines}
        for other in others:
            for call in calls_in(other):
                if not isinstance(call.func, cst.Attribute):
                    continue
                method = call.func.attr.value
                if method == "manual_backward" or (method == "backward" and not _is_tensor_backward(call)):
                    return True
                receiver = dotted(call.func.value)
                if method in ("backward", "step") and receiver is not None:
                    if receiver in engines or self.object_class(receiver, line) in (ACCELERATOR_CLASS, DEEPSPEED_ENGINE):
                        return True
        return False

    # -- the two findings ------------------------------------------------------------------------------

    def backward(self, call: cst.Call, others: Sequence[cst.CSTNode]) -> Optional[Report]:
        assert isinstance(call.func, cst.Attribute)
        if not _is_tensor_backward(call) or self.ctx.qualify(call.func) is not None:
            return None  # `accelerator.backward(loss)`, `torch.autograd.backward(...)`
        ctx = self.ctx
        line = ctx.line(call)
        receiver = call.func.value
        receiver_code = dotted(receiver)
        if receiver_code is not None and self.object_class(receiver_code, line) is not None:
            return None
        shown = ctx.short_code(call)
        if self.accelerate and not self._framework_call_among(others, line):
            accelerators = self.objects(ACCELERATOR_CLASS, line)
            if accelerators and self._prepared_a_model(line):
                return Report(
                    node=call,
                    message=f"`{shown}` bypasses the Accelerator: its loss scaling and accumulation are skipped.",
                    help=f"Call `{accelerators[0]}.backward(loss)` instead (it scales the loss itself: pass the loss, not "
                    "`scaler.scale(loss)`; the prepared optimizer's `step()` does the rest).",
                )
        if self.deepspeed and not self._framework_call_among(others, line):
            for engine in self.objects(DEEPSPEED_ENGINE, line):
                if self._computed_from(receiver, engine):
                    return Report(
                        node=call,
                        message=f"`{shown}` goes around the DeepSpeed engine, whose backward steps DeepSpeed < 0.18.3 then skips.",
                        help=f"Call `{engine}.backward(loss)` instead, then `{engine}.step()` (not the optimizer's `step()`).",
                    )
        return None

    def step(self, call: cst.Call, others: Sequence[cst.CSTNode]) -> Optional[Report]:
        assert isinstance(call.func, cst.Attribute)
        if not self.deepspeed or call.args:
            return None
        ctx = self.ctx
        receiver = dotted(call.func.value)
        if receiver is None:
            return None
        line = ctx.line(call)
        held = self.object_class(receiver, line)
        engine_optimizer = (held == DEEPSPEED_OPTIMIZER and self._in_use(receiver, line)) or any(
            code == receiver and self._in_use(code, line, bound) for code, bound in self.local_optimizers
        )
        passed = not engine_optimizer and held == OPTIMIZER and self._in_use(receiver, line) and self._passed_to_initialize(receiver, line)
        if not (engine_optimizer or passed) or self._framework_call_among(others, line):
            return None
        engines = self.objects(DEEPSPEED_ENGINE, line)
        if not engines:
            return None
        what = "the engine's optimizer" if engine_optimizer else "an optimizer given to the engine"
        return Report(
            node=call,
            message=f"`{receiver}.step()` steps {what} behind the DeepSpeed engine, skipping `{engines[0]}.step()`.",
            help=f"Call `{engines[0]}.step()` instead of `{receiver}.step()` (after `{engines[0]}.backward(loss)`).",
        )

    # -- what the program did ------------------------------------------------------------------------

    def _prepared_a_model(self, line: int) -> bool:
        """Whether the programs running the line hand a model to an Accelerator: `prepare_model(...)`, or a
        `prepare(...)` of a torch optimizer or of a variable whose `parameters()` the project reads."""
        model = self.ctx.execution.model
        for filename, site, evaluation in self.ctx.execution.object_calls(line, ACCELERATOR_CLASS, _PREPARE_METHODS):
            if site.callee[2] == "prepare_model":
                return True
            for argument in site.arguments:
                if evaluation.value(argument, filename) == ("object", OPTIMIZER):
                    return True
                if argument[0] == "v" and model.method_called_on(argument[1], "parameters"):
                    return True
        return False

    def _passed_to_initialize(self, receiver: str, line: int) -> bool:
        """Whether the programs running the line pass this optimizer to `deepspeed.initialize(optimizer=...)`,
        under conditions that do not exclude the line's."""
        execution = self.ctx.execution
        here = execution.statement_guard(line) or ()
        for _, site, _ in execution.library_calls(line, _DEEPSPEED_INITIALIZE):
            passed = dict(site.keywords).get("optimizer") or (site.arguments[2] if len(site.arguments) > 2 else None)
            if passed is not None and execution.same_variable(receiver, line, passed) and not guards_exclude(here, site.guard):
                return True
        return False

    def _computed_from(self, receiver: cst.BaseExpression, engine: str) -> bool:
        """Whether the tensor is computed, in these functions, from the engine (`loss = model_engine(x).sum()`)."""
        sources = {engine}
        assignments: List[Tuple[Set[str], Set[str]]] = []  # (the names bound, the names the value mentions)
        for body in (self.scope.body, *self.scope.outer):
            pending: List[cst.CSTNode] = list(body)
            while pending:
                node = pending.pop()
                if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                    continue
                if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and node.value is not None:
                    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                    bound = set().union(*(_codes_in(target) for target in targets))
                    assignments.append((bound, _codes_in(node.value)))
                pending.extend(child_nodes(node))
        changed = True
        while changed:
            changed = False
            for bound, mentioned in assignments:
                if not bound <= sources and mentioned & sources:
                    sources |= bound
                    changed = True
        return bool(_codes_in(receiver) & sources)
