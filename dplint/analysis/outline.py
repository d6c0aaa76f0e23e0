"""What a file's statements hold, read from CPython's `ast` tree (strings and comments aside).

The rules' text triggers also match docstrings, comments and continuation lines; before libcst parses
a file (ten times the cost of `ast.parse`), each rule's `applies_to_outline` asks the outline whether
the code itself has what the rule needs, and a file no rule still wants is not parsed again. Only
statements are walked, never all the expressions: the outline stays a small part of the cost it saves.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import List, Set

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass
class Outline:
    # `x.method(...)` as a whole statement: the method names.
    discarded_methods: Set[str] = field(default_factory=set)
    # `loss.backward(...)` as a whole statement: the receivers' names.
    backward_receivers: Set[str] = field(default_factory=set)
    # `total += name` or `total = total + name`: the added names.
    accumulated: Set[str] = field(default_factory=set)
    # The names, attributes and strings in the conditions of `if`/`elif`/`while` statements and in
    # decorators.
    condition_words: Set[str] = field(default_factory=set)

    @classmethod
    def of(cls, tree: ast.Module) -> "Outline":
        outline = cls()
        pending: List[ast.stmt] = list(tree.body)
        while pending:
            statement = pending.pop()
            if isinstance(statement, ast.Expr):
                outline._read_statement_call(statement.value)
            elif isinstance(statement, ast.AugAssign):
                outline._read_augmented(statement)
            elif isinstance(statement, ast.Assign):
                outline._read_assignment(statement)
            elif isinstance(statement, (ast.If, ast.While)):
                outline._read_condition(statement.test)
            elif isinstance(statement, _DEFINITIONS):
                for decorator in statement.decorator_list:
                    outline._read_condition(decorator)
            pending.extend(_inner_statements(statement))
        return outline

    def _read_statement_call(self, value: ast.expr) -> None:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            self.discarded_methods.add(value.func.attr)
            if value.func.attr == "backward" and isinstance(value.func.value, ast.Name):
                self.backward_receivers.add(value.func.value.id)

    def _read_augmented(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.Add) and isinstance(node.target, ast.Name) and isinstance(node.value, ast.Name):
            self.accumulated.add(node.value.id)

    def _read_assignment(self, node: ast.Assign) -> None:
        value = node.value
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(value, ast.BinOp)
            and isinstance(value.op, ast.Add)
            and isinstance(value.left, ast.Name)
            and value.left.id == node.targets[0].id
            and isinstance(value.right, ast.Name)
        ):
            self.accumulated.add(value.right.id)

    def _read_condition(self, expression: ast.expr) -> None:
        for node in ast.walk(expression):
            if isinstance(node, ast.Name):
                self.condition_words.add(node.id)
            elif isinstance(node, ast.Attribute):
                self.condition_words.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.condition_words.add(node.value)


def _inner_statements(statement: ast.stmt) -> List[ast.stmt]:
    """The statements directly inside a compound statement: bodies, else, handlers, finally, cases."""
    inner: List[ast.stmt] = []
    for name in ("body", "orelse", "finalbody"):
        inner += getattr(statement, name, ())
    for handler in getattr(statement, "handlers", ()):
        inner += handler.body
    for case in getattr(statement, "cases", ()):
        inner += case.body
    return inner
