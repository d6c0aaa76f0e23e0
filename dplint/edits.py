"""Building fix edits so that the code around them reads as it did: code generated at the indentation
it will sit at (the continuation lines of its brackets move with it, its strings do not), and an import
added beside the file's own."""

from __future__ import annotations

import io
from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst
from libcst._nodes.internal import CodegenState

from dplint.analysis.names import block_body, child_nodes, dotted
from dplint.analysis.context import FileContext
from dplint.rule import NodeEdit


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


def binding_on_every_path(body: Sequence[cst.BaseStatement], name: str) -> Optional[cst.BaseStatement]:
    """The first statement of `body` that assigns the dotted `name` on every path through it (an `if`
    assigning it in each branch): where a fix may use the name, the name holds what was assigned."""
    return next((statement for statement in body if _binds(statement, name)), None)


def _binds(statement: cst.BaseStatement, name: str) -> bool:
    if isinstance(statement, cst.SimpleStatementLine):
        return any(isinstance(small, cst.Assign) and any(dotted(t.target) == name for t in small.targets) for small in statement.body)
    if isinstance(statement, cst.If) and statement.orelse is not None and binding_on_every_path(block_body(statement.body), name) is not None:
        orelse = statement.orelse
        return _binds(orelse, name) if isinstance(orelse, cst.If) else binding_on_every_path(block_body(orelse.body), name) is not None
    return False


def code_at(ctx: FileContext, node: cst.CSTNode, indent: str) -> str:
    """`node`'s code as libcst writes it inside a block indented by `indent`. A node's own code
    (`ctx.code`) is written at no indentation: the continuation lines of a call spanning lines would
    lose the block's indentation."""
    state = CodegenState(default_indent=ctx.module.default_indent, default_newline=ctx.module.default_newline, indent_tokens=[indent])
    node._codegen(state)
    return "".join(state.tokens)


def _import_lines(body: Sequence[cst.BaseStatement]) -> List[cst.SimpleStatementLine]:
    """The lines of the first run of import lines in `body`."""
    lines: List[cst.SimpleStatementLine] = []
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body):
            lines.append(statement)
        elif lines:
            break
    return lines


def _packages(ctx: FileContext, line: cst.SimpleStatementLine) -> List[str]:
    """The top-level packages a line of imports imports from (`__future__` for `from __future__ import ...`)."""
    found = []
    for small in line.body:
        if isinstance(small, cst.Import):
            found += [ctx.module.code_for_node(alias.name).split(".")[0] for alias in small.names]
        elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
            found.append(ctx.module.code_for_node(small.module).split(".")[0])
    return found


def module_name(ctx: FileContext, module: str) -> Optional[str]:
    """How the code names `module` through a top-level import: `dist` after `import torch.distributed as
    dist` or `from torch import distributed as dist`, `os` after `import os`; None where no such import is."""
    code = ctx.module.code_for_node
    for statement in ctx.module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    name = code(alias.name)
                    if alias.asname is not None and name == module:
                        return code(alias.asname.name)
                    if alias.asname is None and (name == module or name.startswith(f"{module}.")):
                        return module
            elif isinstance(small, cst.ImportFrom) and small.module is not None and not isinstance(small.names, cst.ImportStar):
                package, _, last = module.rpartition(".")
                if package and not small.relative and code(small.module) == package:
                    for alias in small.names:
                        if code(alias.name) == last:
                            return code(alias.asname.name) if alias.asname is not None else last
    return None


def import_edit(ctx: FileContext, statement: str, package: str, used: cst.CSTNode) -> Optional[NodeEdit]:
    """`statement`, an import from `package`, added to the file's first run of top-level import lines:
    in the group (lines between blank lines) that imports from `package`, else in the first group of
    other than `from __future__` imports, in alphabetical place. None where the run does not come
    before `used`, the node that needs the import."""
    lines = _import_lines(ctx.module.body)
    if not lines or ctx.line(lines[-1]) >= ctx.line(used):
        return None
    groups: List[List[cst.SimpleStatementLine]] = []
    for line in lines:
        if not groups or any(not empty.comment for empty in line.leading_lines):
            groups.append([])
        groups[-1].append(line)
    own = [group for group in groups if any(package in _packages(ctx, line) for line in group)]
    group = (own or [g for g in groups if any("__future__" not in _packages(ctx, line) for line in g)] or groups)[0]
    after = None
    for line in group:
        packages = _packages(ctx, line)
        if "__future__" not in packages and any(name > package for name in packages):
            break
        after = line
    newline = ctx.module.default_newline
    if after is None:
        return NodeEdit(group[0], f"{statement}{newline}", insert_before=True)
    # After the line's comment and newline: the new line is a line of its own.
    return NodeEdit(after.trailing_whitespace, f"{statement}{newline}", insert_after=True)


def under_if(ctx: FileContext, call: cst.Call, test: str) -> Optional[NodeEdit]:
    """The statement that is only `call` put under `if test:`, at its place: its comment lines stay above
    the `if`, its trailing comment on its line. None where the call is not a statement alone on its line."""
    line = _statements(ctx).get(id(call))
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
        return None
    statement = line.body[0]
    if not (isinstance(statement, cst.Expr) and statement.value is call):
        return None
    indent, newline = indentation(ctx, line), ctx.module.default_newline
    inner = indent + ctx.module.default_indent
    return NodeEdit(statement, f"if {test}:{newline}{inner}{code_at(ctx, call, inner)}")
