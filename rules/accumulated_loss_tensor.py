from __future__ import annotations

import re
from typing import Iterator, Sequence, Set, Tuple

import libcst as cst

from dplint.context import FileContext
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.names import Body, block_body, child_blocks, iter_scope_bodies
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid


class AccumulatedLossTensor(Rule):
    """
    ## What it does
    Checks training loops for `total += loss` (or `total = total + loss`) where `loss` is the tensor
    the same loop calls `.backward()` on, so it requires grad, and the accumulator itself is never
    back-propagated.

    ## Why is this bad?
    Adding a tensor that requires grad keeps its whole autograd graph (activations included) alive
    in the accumulator, one graph per iteration, until memory runs out. On several GPUs the graphs
    live on every device, so the out-of-memory error arrives sooner, and on the first GPU first.

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
    recognised and not reported; accumulating into something else (a list, a metric object) is not
    checked.
    """

    code = "DPL402"
    name = "accumulated-loss-tensor"
    summary = "`total += loss` keeps every iteration's autograd graph alive; add `loss.item()` or `loss.detach()`."
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
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        reported: Set[cst.CSTNode] = set()  # a statement in nested loops is seen from each of them
        for body in iter_scope_bodies(ctx.module):
            backed_up = _backward_targets(body)
            for loop in _loops(body):
                trained = _backward_targets(block_body(loop.body))
                for statement, accumulator, loss in _accumulations(block_body(loop.body)):
                    if loss.value in trained and accumulator not in backed_up and statement not in reported:
                        reported.add(statement)
                        yield self._report(ctx, statement, accumulator, loss)

    @staticmethod
    def _report(ctx: FileContext, statement: cst.CSTNode, accumulator: str, loss: cst.Name) -> Report:
        return Report(
            node=statement,
            message=(
                f"`{ctx.short_code(statement)}` adds `{loss.value}`, which this loop back-propagates, so it requires "
                f"grad: `{accumulator}` keeps every iteration's autograd graph alive until memory runs out (sooner, "
                f"and on GPU 0 first, with several GPUs); add `{loss.value}.item()` or `{loss.value}.detach()`."
            ),
            help=f"Add `{loss.value}.item()` (a float) or `{loss.value}.detach()` (a tensor without its graph).",
            fix=FixSpec(f"Add `{loss.value}.detach()`", (NodeEdit(loss, f"{loss.value}.detach()"),)),
            statement=statement,
        )


def _statements(body: Body) -> Iterator[cst.CSTNode]:
    """Statements of a body, nested blocks included, nested functions and classes excluded."""
    for statement in body:
        yield statement
        if isinstance(statement, cst.BaseCompoundStatement) and not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            for block in child_blocks(statement):
                yield from _statements(block)


def _loops(body: Body) -> Iterator[cst.BaseCompoundStatement]:
    return (s for s in _statements(body) if isinstance(s, (cst.For, cst.While)))


def _backward_targets(body: Body) -> Set[str]:
    """Names `x` with an `x.backward(...)` statement in the body."""
    names = set()
    for statement in _statements(body):
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
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
    for statement in _statements(body):
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
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
