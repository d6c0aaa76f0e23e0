"""Building the text of fix edits so that the code around them reads as it did: code generated at the
indentation it will sit at (the continuation lines of its brackets move with it, its strings do not)."""

from __future__ import annotations

import io
from typing import Dict, List, Tuple

import libcst as cst
from libcst._nodes.internal import CodegenState

from dplint.analysis.names import child_nodes
from dplint.context import FileContext


def _source_lines(ctx: FileContext) -> List[str]:
    # Split as libcst counts lines (`\n`, `\r\n`, `\r`), so that its positions index this list.
    return ctx.memo("source-lines", lambda: io.StringIO(ctx.source, newline="").readlines())


def _statements(ctx: FileContext) -> Dict[int, cst.CSTNode]:
    """The statement holding each node (by `id`): a line of simple statements, or a compound statement
    for the nodes of its header."""

    def compute() -> Dict[int, cst.CSTNode]:
        found: Dict[int, cst.CSTNode] = {}
        pending: List[Tuple[cst.CSTNode, cst.CSTNode]] = [(ctx.module, ctx.module)]
        while pending:
            node, statement = pending.pop()
            for child in child_nodes(node):
                holder = child if isinstance(child, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) else statement
                found[id(child)] = holder
                pending.append((child, holder))
        return found

    return ctx.memo("edits-statements", compute)


def indentation(ctx: FileContext, node: cst.CSTNode) -> str:
    """The indentation of the block holding `node`: the whitespace before the first line of its statement
    (a node may start on a continuation line, which is indented further)."""
    line = _source_lines(ctx)[ctx.line(_statements(ctx)[id(node)]) - 1]
    return line[: len(line) - len(line.lstrip(" \t\f"))]


def code_at(ctx: FileContext, node: cst.CSTNode, indent: str) -> str:
    """`node`'s code as libcst writes it inside a block indented by `indent`. A node's own code
    (`ctx.code`) is written at no indentation: the continuation lines of a call spanning lines would
    lose the block's indentation."""
    state = CodegenState(default_indent=ctx.module.default_indent, default_newline=ctx.module.default_newline, indent_tokens=[indent])
    node._codegen(state)
    return "".join(state.tokens)
