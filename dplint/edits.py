"""Building the text of fix edits so that the code around them reads as it did: code generated at the
indentation it will sit at (the continuation lines of its brackets move with it, its strings do not)."""

from __future__ import annotations

import io
from typing import List

import libcst as cst
from libcst._nodes.internal import CodegenState

from dplint.context import FileContext


def _source_lines(ctx: FileContext) -> List[str]:
    # Split as libcst counts lines (`\n`, `\r\n`, `\r`), so that its positions index this list.
    return ctx.memo("source-lines", lambda: io.StringIO(ctx.source, newline="").readlines())


def indentation(ctx: FileContext, statement: cst.CSTNode) -> str:
    """The whitespace before the code of the line that `statement` starts on: its block's indentation."""
    line = _source_lines(ctx)[ctx.line(statement) - 1]
    return line[: len(line) - len(line.lstrip(" \t\f"))]


def code_at(ctx: FileContext, node: cst.CSTNode, indent: str) -> str:
    """`node`'s code as libcst writes it inside a block indented by `indent`. A node's own code
    (`ctx.code`) is written at no indentation: the continuation lines of a call spanning lines would
    lose the block's indentation."""
    state = CodegenState(default_indent=ctx.module.default_indent, default_newline=ctx.module.default_newline, indent_tokens=[indent])
    node._codegen(state)
    return "".join(state.tokens)
