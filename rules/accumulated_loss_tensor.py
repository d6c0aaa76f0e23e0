from __future__ import annotations

import re
from typing import Iterator, Sequence, Set, Tuple

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.inference import Binding, Inference
from dplint.analysis.names import Body, block_body, child_blocks, child_nodes
from dplint.analysis.outline import Outline
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid


class AccumulatedLossTensor(Rule):
    """
    ## What it does
    Checks training loops for `total += loss` (or `total = total + loss`) where `loss` is the tensor
    the same loop calls `.backward()` on, so it requires grad, and the accumulator itself is never
    back-propagated. Silent where no graph is recorded: inside `with torch.no_grad():` or
    `torch.inference_mode()`, and in functions decorated with them.

    ## Why is this bad?
    Adding a tensor that requires grad makes the accumulator require grad too, with an autograd
    history that grows by one node per iteration and references each iteration's `loss`. Before
    `backward()` runs (or with `retain_graph=True`) that keeps the whole graph of every iteration,
    activations included, alive; after it, the saved tensors are freed but the history still grows
    until the accumulator is rebound. On several GPUs this memory sits on the first GPU first.

    ## Example
    ```python
    running_loss = 0.0
    for inputs, labels in loader:
        loss = criterion(model(inputs), labels)
        loss.backward()
        optimizer.step()
        running_loss += loss
    ```

    ## Use instead
    ```python
    running_loss += loss.item()  # a Python float (or `loss.detach()` to stay a tensor)
    ```

    ## Fix safety
    `total += loss` → `total += loss.detach()` is safe: the values are the same, only the graph is
    dropped.

    ## Known problems
    Accumulating on purpose to back-propagate once after the loop (`total.backward()`) is
    recognised and not reported, and so are a loss made graph-free before the addition on every path
    (`loss = loss.item()`, `.detach()`, `float(loss)`) and an accumulator rebound before every
    addition (`total = 0` earlier in the same iteration). Two additions after one reset
    (`total = 0; total += a; total += b`) are reported though nothing grows across iterations.
    Accumulating into something else (a list, a metric object) is not checked.
    """

    code = "DPL402"
    preview = True
    preview_reason = (
        "Measured 0.82 on the 904 repositories of bench/wild (9 true, 2 false, 2 moot): a loss rebound to a float before the accumulation is reported."
    )
    name = "accumulated-loss-tensor"
    summary = "`total += loss` on a tensor that requires grad grows the sum's autograd history every iteration."
    fix_applicability = ("safe",)
    triggers = re.compile(r"\.backward\(")
    # `acc += name` or `acc = acc + name` alone on a line.
    accumulation = re.compile(r"^[ \t]*(\w+)[ \t]*(?:\+=[ \t]*\w+|=[ \t]*\1[ \t]*\+[ \t]*\w+)[ \t]*(?:#.*)?$", re.M)

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        return self.triggers.search(text) is not None and self.accumulation.search(text) is not None

    VALID = [
        Valid(
            """
            total = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total += loss.item()
            """
        ),
        Valid(
            """
            total = 0
            for chunk in chunks:
                loss = criterion(model(chunk), target)
                total += loss  # accumulated on purpose: one backward for all chunks
            total.backward()
            """
        ),
        Valid(
            """
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                stats += loss.detach()
            """
        ),
        Valid(
            """
            import torch

            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                with torch.no_grad():
                    total += loss  # no graph is recorded here
            """
        ),
        Valid(
            """
            import torch

            @torch.no_grad()
            def evaluate(model, loader):
                model.eval()
                total = 0
                for x, y in loader:
                    loss = criterion(model(x), y)
                    total += loss
                return total
            """
        ),
        Valid(
            """
            def evaluate(model, loader):
                model.eval()
                total = 0
                for x, y in loader:
                    loss = criterion(model(x), y)
                    total += loss  # no backward in this function: nothing is trained here
                return total / len(loader)
            """
        ),
        Valid(
            """
            total = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                loss = loss.item()
                total += loss  # a float by now
            """
        ),
        Valid(
            """
            for x, y in loader:
                total = 0
                loss = criterion(model(x), y)
                loss.backward()
                total += loss  # restarted every iteration
                print(total)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            running_loss = 0.0
            for inputs, labels in loader:
                loss = criterion(model(inputs), labels)
                loss.backward()
                optimizer.step()
                running_loss += loss
            """,
            line=6,
            expected_fix="""
            running_loss = 0.0
            for inputs, labels in loader:
                loss = criterion(model(inputs), labels)
                loss.backward()
                optimizer.step()
                running_loss += loss.detach()
            """,
        ),
        Invalid(
            """
            def train(epochs):
                total = 0
                for epoch in range(epochs):
                    for batch in loader:
                        loss = model(batch).mean()
                        loss.backward()
                        total = total + loss
                return total
            """,
            line=7,
        ),
        Invalid(
            """
            epoch_loss = 0
            while step < steps:
                loss = compute(step)
                if loss is not None:
                    loss.backward()
                    epoch_loss += loss
                step += 1
            """,
            line=6,
        ),
        Invalid(
            """
            for epoch in range(epochs):
                total = 0  # restarted every epoch, but it grows over the epoch's steps
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    total += loss
            """,
            line=6,
        ),
        Invalid(
            """
            total = 0
            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                if step % 10 == 0:
                    loss = loss.item()
                total += loss  # a float on one step in ten only
            """,
            line=7,
        ),
    ]

    def applies_to_outline(self, outline: Outline) -> bool:
        return not outline.accumulated.isdisjoint(outline.backward_receivers)

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference = Inference.of(ctx)
        reported: Set[cst.CSTNode] = set()  # a statement in nested loops is seen from each of them
        for body in _graph_building_bodies(ctx, ctx.module.body):
            backed_up = _backward_targets(body)
            without_graph = _under_no_grad(ctx, body)
            for loop in _loops(body):
                trained = _backward_targets(block_body(loop.body))
                for statement, accumulator, loss in _accumulations(block_body(loop.body)):
                    if statement in without_graph or statement in reported:
                        continue
                    if loss.value in trained and accumulator not in backed_up and _grows(inference, statement, accumulator, loss):
                        reported.add(statement)
                        yield self._report(ctx, statement, accumulator, loss)

    @staticmethod
    def _report(ctx: FileContext, statement: cst.CSTNode, accumulator: str, loss: cst.Name) -> Report:
        return Report(
            node=statement,
            message=(
                f"`{ctx.short_code(statement, 30)}`: `{loss.value}` requires grad, so `{accumulator}`'s autograd "
                "history grows every iteration."
            ),
            help=f"Add `{loss.value}.item()` (a float) or `{loss.value}.detach()` (a tensor without its graph).",
            fix=FixSpec(f"Add `{loss.value}.detach()`", (NodeEdit(loss, f"{loss.value}.detach()"),)),
            statement=statement,
        )


# Context managers and decorators under which no autograd graph is recorded.
NO_GRAD = frozenset(
    {"torch.no_grad", "torch.autograd.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.inference_mode",
     "torch.autograd.grad_mode.no_grad"}
)


# Methods whose result holds no autograd graph (`loss = loss.item()` before `total += loss`).
GRAPH_FREE_METHODS = frozenset({"item", "detach", "tolist", "numpy"})
GRAPH_FREE_BUILTINS = frozenset({"float", "int"})


def _grows(inference: Inference, statement: cst.BaseSmallStatement, accumulator: str, loss: cst.Name) -> bool:
    """Whether the sum may carry a graph from one iteration to the next: unless what reaches the added
    name is always graph-free (`loss = loss.item()`), or the accumulator is rebound before every
    addition (`total = 0` earlier in the same iteration). Unknown counts as growing."""
    scope = inference.scope_of(statement)
    if scope is None:
        return True
    added = inference.reaching_bindings(loss, scope)
    if added and all(binding.value is not None and not binding.keeps_previous and _graph_free(binding.value) for binding in added):
        return False
    read = statement.target if isinstance(statement, cst.AugAssign) else statement.value.left  # type: ignore[attr-defined]
    before = inference.reaching_bindings(read, scope)
    return not before or not all(_resets(binding, accumulator) for binding in before)


def _graph_free(value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute):
        return func.attr.value in GRAPH_FREE_METHODS
    return isinstance(func, cst.Name) and func.value in GRAPH_FREE_BUILTINS


def _resets(binding: Binding, accumulator: str) -> bool:
    """`total = 0`: a binding that starts the sum afresh (not `total = total + x`, not `total += x`)."""
    return binding.value is not None and not binding.keeps_previous and not _reads(binding.value, accumulator)


def _reads(node: cst.CSTNode, name: str) -> bool:
    return (isinstance(node, cst.Name) and node.value == name) or any(_reads(child, name) for child in child_nodes(node))


def _disables_grad(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """`torch.no_grad()`, `torch.inference_mode()`, `torch.no_grad` (a decorator), `torch.set_grad_enabled(False)`."""
    call = expr if isinstance(expr, cst.Call) else None
    qualified = ctx.qualify(call.func if call is not None else expr)
    if qualified in NO_GRAD:
        return True
    if qualified == "torch.set_grad_enabled" and call is not None and call.args:
        value = call.args[0].value
        return isinstance(value, cst.Name) and value.value == "False"
    return False


def _graph_building_bodies(ctx: FileContext, body: Body) -> Iterator[Body]:
    """The module's body and every function's, except functions decorated with `@torch.no_grad()`."""
    yield body
    for statement in body:
        if isinstance(statement, cst.FunctionDef):
            if any(_disables_grad(ctx, decorator.decorator) for decorator in statement.decorators):
                continue
            yield from _graph_building_bodies(ctx, block_body(statement.body))
        elif isinstance(statement, cst.BaseCompoundStatement):
            for block in child_blocks(statement):
                for inner in _graph_building_bodies(ctx, block):
                    if inner is not block:
                        yield inner


def _under_no_grad(ctx: FileContext, body: Body) -> Set[cst.CSTNode]:
    """Small statements inside `with torch.no_grad():` (or `inference_mode`) blocks of a body."""
    inside: Set[cst.CSTNode] = set()
    for statement in _statements(body):
        if isinstance(statement, cst.With) and any(_disables_grad(ctx, item.item) for item in statement.items):
            for nested in _statements(block_body(statement.body)):
                if isinstance(nested, cst.SimpleStatementLine):
                    inside.update(nested.body)
                elif isinstance(nested, cst.BaseSmallStatement):
                    inside.add(nested)
    return inside


def _statements(body: Body) -> Iterator[cst.CSTNode]:
    """Statements of a body, nested blocks included, nested functions and classes excluded."""
    for statement in body:
        yield statement
        if isinstance(statement, cst.BaseCompoundStatement) and not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            for block in child_blocks(statement):
                yield from _statements(block)


def _small_statements(body: Body) -> Iterator[cst.BaseSmallStatement]:
    """Small statements of a body (one-line suites included), nested functions and classes excluded."""
    for statement in _statements(body):
        if isinstance(statement, cst.SimpleStatementLine):
            yield from statement.body
        elif isinstance(statement, cst.BaseSmallStatement):
            yield statement


def _loops(body: Body) -> Iterator[cst.BaseCompoundStatement]:
    return (s for s in _statements(body) if isinstance(s, (cst.For, cst.While)))


def _backward_targets(body: Body) -> Set[str]:
    """Names `x` with an `x.backward(...)` statement in the body."""
    names = set()
    for small in _small_statements(body):
        call = small.value if isinstance(small, cst.Expr) else None
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "backward"
            and isinstance(call.func.value, cst.Name)
        ):
            names.add(call.func.value.value)
    return names


def _accumulations(body: Body) -> Iterator[Tuple[cst.CSTNode, str, cst.Name]]:
    """`acc += name` and `acc = acc + name` statements: (statement, accumulator, added name)."""
    for small in _small_statements(body):
        if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign):
            if isinstance(small.target, cst.Name) and isinstance(small.value, cst.Name):
                yield small, small.target.value, small.value
        elif isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            value, accumulator = small.value, small.targets[0].target.value
            if (
                isinstance(value, cst.BinaryOperation)
                and isinstance(value.operator, cst.Add)
                and isinstance(value.left, cst.Name)
                and value.left.value == accumulator
                and isinstance(value.right, cst.Name)
            ):
                yield small, accumulator, value.right
