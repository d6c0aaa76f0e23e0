"""Resolve names to qualified names through a file's imports (`import torch.nn as nn` → `torch.nn`).

This alias map answers like libcst's QualifiedNameProvider for imported names at a fraction of its
cost (it reads only import statements, no scope analysis).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from dplint.analysis.modules import absolute_module

Body = Sequence[Union[cst.BaseStatement, cst.BaseSmallStatement]]


def dotted(node: cst.BaseExpression) -> Optional[str]:
    """`a.b.c` for a chain of names and attributes, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


# CPython refuses to convert longer digit strings (sys.get_int_max_str_digits()); no device index is that long.
MAX_INTEGER_DIGITS = 4300


def integer_value(node: cst.BaseExpression) -> Optional[int]:
    """The value of an integer literal in any base (`1`, `0x1`, `0b1`, `1_000`), else None."""
    if not isinstance(node, cst.Integer) or len(node.value) > MAX_INTEGER_DIGITS:
        return None
    return int(node.value, 0)


def signed_integer_value(node: Optional[cst.BaseExpression]) -> Optional[int]:
    """The value of an integer literal, negated ones (`-1`) included, else None."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        value = integer_value(node.expression)
        return None if value is None else -value
    return integer_value(node) if node is not None else None


def decimal_value(digits: str) -> Optional[int]:
    """The value of a decimal digit string found in a literal (`"cuda:12"`), else None when it is too long."""
    return int(digits) if digits.isdecimal() and len(digits) <= MAX_INTEGER_DIGITS else None


def iter_small_statements(body: Body, *, into_functions: bool = True) -> Iterator[cst.BaseSmallStatement]:
    """Every small statement in a block, depth first, in source order."""
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            yield from statement.body
        elif isinstance(statement, cst.BaseCompoundStatement):
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and not into_functions:
                continue
            for block in child_blocks(statement):
                yield from iter_small_statements(block, into_functions=into_functions)


# Fields that hold only whitespace, brackets and punctuation: nothing below them is an expression.
_LAYOUT_FIELDS = ("whitespace", "lpar", "rpar", "lbracket", "rbracket", "lbrace", "rbrace", "leading_lines", "lines_after",
                  "header", "footer", "comma", "semicolon", "newline", "trailing_whitespace", "equal", "colon", "dot")
# Classes whose dataclass fields are not in source order (a libcst visitor walks them in source order).
_SOURCE_ORDER = {
    cst.IfExp: ("body", "test", "orelse"),
    cst.FunctionDef: ("decorators", "asynchronous", "name", "type_parameters", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.Parameters: ("posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params", "star_kwarg"),
    cst.Arg: ("keyword", "value"),
    cst.ExceptHandler: ("type", "name", "body"),
    cst.ExceptStarHandler: ("type", "name", "body"),
    cst.ImportFrom: ("relative", "module", "names"),
    cst.Slice: ("lower", "first_colon", "upper", "second_colon", "step"),
    cst.SimpleStatementSuite: ("leading_whitespace", "body", "trailing_whitespace"),
    cst.MatchCase: ("pattern", "guard", "body"),
}
_CHILD_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _child_fields(cls: type) -> Tuple[str, ...]:
    names = _CHILD_FIELDS.get(cls)
    if names is None:
        declared = [f.name for f in dataclasses.fields(cls)]
        first = [name for name in _SOURCE_ORDER.get(cls, ()) if name in declared]
        ordered = first + [name for name in declared if name not in first]
        names = _CHILD_FIELDS[cls] = tuple(name for name in ordered if not name.startswith(_LAYOUT_FIELDS))
    return names


def iter_calls(node: cst.CSTNode, *, into_lambdas: bool = True) -> Iterator[cst.Call]:
    """Every call inside a node (a small statement, an expression), outermost first, in source order.

    Reads the nodes' fields directly: a libcst visitor rebuilds every node it passes, which made
    collecting calls the largest cost of the distributed rules on big files.
    """
    pending: List[cst.CSTNode] = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, cst.Call):
            yield current
        elif isinstance(current, cst.Lambda) and not into_lambdas:
            continue
        pending.extend(reversed(child_nodes(current)))


def run_visitor(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a visitor that reads: its `visit_X`/`leave_X` methods are called in the
    same order (`visit_X` returning False skips the children), over the nodes `child_nodes` gives.

    libcst's own `visit` rebuilds every node on the way back up, even for a visitor that changes
    nothing: on torch's sources, most of the rules' time.
    """
    if visitor.on_visit(node):
        for child in child_nodes(node):
            run_visitor(child, visitor)
    visitor.on_leave(node)


def descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The node and every node inside it that can hold an expression (any order)."""
    pending: List[cst.CSTNode] = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(child_nodes(current))


def names_in(node: cst.CSTNode) -> Set[str]:
    """The identifiers of every `Name` inside a node, attribute names included (`a.b` holds `a` and `b`)."""
    found: Set[str] = set()
    pending: List[cst.CSTNode] = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, cst.Name):
            found.add(current.value)
        else:
            pending.extend(child_nodes(current))
    return found


def assigned_parts(target: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """What an assignment target binds: a name, an attribute or a subscript, also inside a tuple or a
    list (`a, (b, *c) = ...`)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from assigned_parts(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from assigned_parts(target.value)
    else:
        yield target


def child_nodes(node: cst.CSTNode) -> List[cst.CSTNode]:
    """The node's children that can hold expressions, in source order (no whitespace or punctuation)."""
    children: List[cst.CSTNode] = []
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            children.append(value)
        elif isinstance(value, (tuple, list)):
            children.extend(item for item in value if isinstance(item, cst.CSTNode))
    return children


def header_expressions(statement: cst.CSTNode) -> List[cst.CSTNode]:
    """The expressions a compound statement evaluates before entering its blocks (an `if` or `while`
    test, a `for` iterable, the `with` items, a `match` subject)."""
    if isinstance(statement, (cst.If, cst.While)):
        return [statement.test]
    if isinstance(statement, cst.For):
        return [statement.iter]
    if isinstance(statement, cst.With):
        return [item.item for item in statement.items]
    if isinstance(statement, cst.Match):
        return [statement.subject]
    return []


def child_blocks(statement: cst.BaseCompoundStatement) -> Iterator[Body]:
    """The statement lists directly inside a compound statement (bodies, else/except/finally)."""
    if isinstance(statement, cst.Match):
        for case in statement.cases:
            yield block_body(case.body)
        return
    yield block_body(statement.body)
    if isinstance(statement, cst.Try) or isinstance(statement, getattr(cst, "TryStar", ())):
        for handler in statement.handlers:
            yield block_body(handler.body)
    orelse = getattr(statement, "orelse", None)
    while orelse is not None:
        yield block_body(orelse.body)
        orelse = getattr(orelse, "orelse", None) if isinstance(orelse, cst.If) else None
    final = getattr(statement, "finalbody", None)
    if final is not None:
        yield block_body(final.body)


def iter_scope_bodies(module: cst.Module) -> Iterator[Body]:
    """The module's body and the body of every function in it (methods and nested ones included)."""
    yield module.body
    pending: List[Body] = [module.body]
    while pending:
        for statement in pending.pop():
            if isinstance(statement, cst.FunctionDef):
                yield block_body(statement.body)
            if isinstance(statement, cst.BaseCompoundStatement):
                pending.extend(child_blocks(statement))


@dataclass(frozen=True)
class SuiteLine(cst.SimpleStatementLine):
    """The statements of a one-line suite (`if c: x.cuda(); y = 1`) seen as a line of their own.

    The tree has no node for it, so it has no position: locate it by its first small statement.
    """


def block_body(suite: cst.BaseSuite) -> Body:
    """A block's statements; a one-line suite is one `SimpleStatementLine`, as if it were indented."""
    if isinstance(suite, cst.IndentedBlock):
        return suite.body
    if isinstance(suite, cst.SimpleStatementSuite):
        return (SuiteLine(body=suite.body),)
    return ()


def position_anchor(node: cst.CSTNode) -> cst.CSTNode:
    """The node of the tree that stands for `node` when it is located."""
    return node.body[0] if isinstance(node, SuiteLine) else node


class ImportMap:
    """Local name → qualified name, from every import in the file (at any depth)."""

    def __init__(self, module: cst.Module, package: str = "") -> None:
        self._aliases: Dict[str, str] = {}
        for statement in iter_small_statements(module.body):
            if isinstance(statement, cst.Import):
                for alias in statement.names:
                    full = dotted(alias.name)
                    if full is None:
                        continue
                    if alias.asname is not None:
                        self._aliases[alias.asname.name.value] = full
                    else:
                        top = full.split(".")[0]
                        self._aliases[top] = top
            elif isinstance(statement, cst.ImportFrom) and not isinstance(statement.names, cst.ImportStar):
                base = self.resolve_from(statement, package)
                for alias in statement.names:
                    imported = dotted(alias.name)
                    if imported is None:
                        continue
                    local = alias.asname.name.value if alias.asname is not None else imported
                    self._aliases[local] = f"{base}.{imported}" if base else imported

    @staticmethod
    def resolve_from(statement: cst.ImportFrom, package: str) -> str:
        """The absolute module a `from ... import` statement imports from."""
        module = dotted(statement.module) if statement.module is not None else ""
        return absolute_module(package, len(statement.relative), module or "")

    def qualify(self, node: cst.BaseExpression) -> Optional[str]:
        """The qualified name of an imported name or an attribute chain on one, else None."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        target = self._aliases.get(head)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target

    def imported(self, local: str) -> Optional[str]:
        return self._aliases.get(local)

    def modules(self) -> FrozenSet[str]:
        """The qualified names the file imports (modules, or names from them)."""
        return frozenset(self._aliases.values())
