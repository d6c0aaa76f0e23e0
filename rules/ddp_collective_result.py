from __future__ import annotations

import re
from typing import Dict, Iterator, Optional, Sequence, Set

import libcst as cst

from dplint.analysis.names import names_in, run_visitor
from dplint.analysis.context import FileContext
from dplint.edits import code_at, indentation
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.ddp import ASYNC_OP_POSITION, argument, collective_calls, collective_name, is_literal


class CollectiveResultAssigned(Rule):
    """
    ## What it does
    Finds the result of a `torch.distributed` collective (`all_reduce`, `broadcast`, `all_gather`,
    `reduce`, `barrier`, …) called without `async_op=True` being assigned or used in an expression:
    `total = dist.all_reduce(total)`, `return dist.all_reduce(correct) / world_size`.

    ## Why is this bad?
    Collectives work in place on their tensor arguments and return `None` (or a work handle with
    `async_op=True`). The assigned name holds `None`: the next use raises `TypeError`, or, when the
    result is only checked for truthiness or logged, the reduced value is silently lost.

    ## Example
    ```python
    loss = dist.all_reduce(loss)
    return dist.all_reduce(correct) / world_size
    ```

    ## Use instead
    ```python
    dist.all_reduce(loss)
    dist.all_reduce(correct)
    return correct / world_size
    ```

    ## Fix safety
    `x = dist.all_reduce(x)` → `dist.all_reduce(x)` is safe: `x`, the tensor the collective writes
    into, then holds the result instead of `None`. Offered only where the name assigned is that tensor
    (`y = dist.all_reduce(x)`, a result used in an expression, and `gather`, which writes into its
    second argument, get none).

    ## Known problems
    `torch.distributed.nn.functional.all_reduce` (the differentiable variant) returns a tensor and is not
    reported. A call with a non-literal `async_op=` is not reported. `return dist.all_reduce(t)` on its
    own is not reported: the function hands its callers the `None`, which breaks only a caller that
    uses it, and callers are not followed (wrappers such as `def barrier(): return dist.barrier()` are
    called for their effect).
    """

    code = "DPL512"
    name = "collective-result-assigned"
    summary = "The result of an in-place collective (`None`) assigned or used: `x = dist.all_reduce(x)`."
    fix_applicability = ("safe",)
    # Collectives are qualified names of torch.distributed: the file imports it (or names it in full),
    # and then `applies_to` looks for a call of one whose result is used.
    requires = GuardedPattern(r"torch\.distributed|from[ \t]+torch[ \t]+import[^\n]*\bdistributed\b", ["distributed"], one_line=True)

    VALID = [
        Valid(
            """
            import torch
            import torch.distributed as dist
            parts = [torch.empty_like(ids) for _ in range(dist.get_world_size())]
            ids = dist.all_gather(parts, ids)  # the None is replaced on the next line, unread
            ids = torch.cat(parts)
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
            """
        ),
        Valid(
            """
            import torch.distributed as dist

            def all_to_all(output, input, group):
                return dist.all_to_all_single(output, input, group=group)  # its callers use `output`
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            work = dist.all_reduce(grad, async_op=True)
            work.wait()
            """
        ),
        Valid(
            """
            import torch.distributed.nn.functional as dfn
            total = dfn.all_reduce(features)  # the differentiable variant returns a tensor
            """
        ),
        Valid(
            """
            import torch.distributed as dist
            # torch's own tests: async_op passed by position, as a flag
            req = dist.reduce_scatter(out, chunks, dist.ReduceOp.SUM, group, async_val)
            if async_val:
                req.wait()
            """
        ),
        Valid(
            """
            import torch
            import torch.distributed as dist
            picked = torch.gather(scores, 1, index)  # a tensor op, not the collective
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.distributed as dist
            loss = dist.all_reduce(loss)
            loss = loss / dist.get_world_size()  # reads the None
            """,
            line=2,
            expected_fix="""
            import torch.distributed as dist
            dist.all_reduce(loss)
            loss = loss / dist.get_world_size()  # reads the None
            """,
        ),
        Invalid(
            """
            import torch.distributed as dist
            loss = dist.all_reduce(loss)
            """,
            line=2,
            expected_fix="""
            import torch.distributed as dist
            dist.all_reduce(loss)
            """,
        ),
        Invalid(
            """
            from torch import distributed as dist

            def mean(t):
                return dist.all_reduce(t, op=dist.ReduceOp.SUM) / dist.get_world_size()
            """,
            line=4,
        ),
        Invalid(
            """
            import torch.distributed as dist

            def gather(tensors, t):
                tensors = dist.all_gather(tensors, t)
                return tensors
            """,
            line=4,
            expected_fix="""
            import torch.distributed as dist

            def gather(tensors, t):
                dist.all_gather(tensors, t)
                return tensors
            """,
        ),
        Invalid(
            """
            from torch.distributed import all_reduce as sum_over_ranks

            correct = sum_over_ranks(
                correct
            ).item()
            """,
            line=3,
        ),
        Invalid(
            """
            import torch.distributed as dist

            def sync(stats, world_size):
                for key in stats:
                    stats[key] = dist.all_reduce(  # summed over ranks
                        stats[key],
                        op=dist.ReduceOp.SUM,
                    )
                    stats[key] /= world_size
            """,
            line=5,
            expected_fix="""
            import torch.distributed as dist

            def sync(stats, world_size):
                for key in stats:
                    dist.all_reduce(  # summed over ranks
                        stats[key],
                        op=dist.ReduceOp.SUM,
                    )
                    stats[key] /= world_size
            """,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        if not super().applies_to(text, module_classes, project):
            return False
        return any(_result_used(text, call) for call in collective_calls(text).finditer(text))

    def check(self, ctx: FileContext) -> Iterator[Report]:
        visitor = _UsedResults(ctx)
        run_visitor(ctx.module, visitor)
        for call, name in visitor.found:
            yield Report(
                node=call,
                message=f"`dist.{name}` works in place and returns `None` here; this code uses that `None` as its result.",
                help=f"Call `dist.{name}(...)` as a statement and use the tensor you passed to it.",
                fix=_call_alone(ctx, visitor.assignments.get(id(call)), call, name),
            )


# The parameter each collective writes its result into (torch 2.13's signatures), always its first.
# `gather` and `gather_object` write into their second: `t = dist.gather(t, ...)` meant the gathered list.
_OUTPUT_PARAMETER = {
    "all_reduce": "tensor", "reduce": "tensor", "broadcast": "tensor", "scatter": "tensor", "all_gather": "tensor_list",
    "all_gather_into_tensor": "output_tensor", "reduce_scatter": "output", "reduce_scatter_tensor": "output",
    "all_to_all": "output_tensor_list", "all_to_all_single": "output", "all_gather_object": "object_list",
    "broadcast_object_list": "object_list", "scatter_object_list": "scatter_object_output_list",
}  # fmt: skip


def _call_alone(ctx: FileContext, assignment: Optional[cst.Assign], call: cst.Call, name: str) -> Optional[FixSpec]:
    """`x = dist.all_reduce(x)` → `dist.all_reduce(x)`: safe where `x` is what the collective writes
    into, since it then holds the result rather than `None`."""
    if assignment is None or len(assignment.targets) != 1 or name not in _OUTPUT_PARAMETER:
        return None
    output = argument(call, _OUTPUT_PARAMETER[name], 0)
    target = assignment.targets[0].target
    if output is None or not output.deep_equals(target):
        return None
    edit = NodeEdit(assignment, code_at(ctx, call, indentation(ctx, assignment)))
    return FixSpec(f"Drop the assignment: `dist.{name}` writes into `{ctx.short_code(target, 30)}`", (edit,))


# Before the call on its line: an assignment, or an operator it is an operand of.
_USED_BEFORE = re.compile(r"(?<![=!<>])=(?!=)|[-+*/%@&|^]")
_USED_AFTER = re.compile(r"[ \t]*[.\-+*/%@&|^]")


def _result_used(text: str, call: "re.Match[str]") -> bool:
    """Whether the text around a collective's call can use its result (a generous prefilter)."""
    if _USED_BEFORE.search(text, text.rfind("\n", 0, call.start()) + 1, call.start()):
        return True
    depth = 1
    for index in range(call.end(), len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return _USED_AFTER.match(text, index + 1) is not None
    return False


def _assigned_name(statement: cst.BaseStatement) -> Optional[str]:
    """The name a statement line of one plain assignment (`x = ...`) binds."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        assign = statement.body[0]
        if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
            return assign.targets[0].target.value
    return None


class _UsedResults(cst.CSTVisitor):
    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.found: list = []
        self.assignments: Dict[int, cst.Assign] = {}  # by the `id` of the value assigned
        self.overwritten: Set[int] = set()  # values assigned to a name the next statement rebinds unread

    def visit_Module(self, node: cst.Module) -> None:
        self._note_overwritten(node.body)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._note_overwritten(node.body)

    def _note_overwritten(self, body: Sequence[cst.BaseStatement]) -> None:
        """`x = dist.all_gather(xs, x)` with the next statement `x = torch.cat(xs)`: the `None` is
        replaced before anything reads it."""
        for statement, following in zip(body, body[1:]):
            name = _assigned_name(statement)
            if name is not None and _assigned_name(following) == name:
                value = following.body[0].value  # type: ignore[union-attr]
                if name not in names_in(value):
                    self.overwritten.add(id(statement.body[0].value))  # type: ignore[union-attr]

    def _check(self, value: Optional[cst.BaseExpression]) -> None:
        if not isinstance(value, cst.Call) or id(value) in self.overwritten:
            return
        name = collective_name(self.ctx, value)
        if name is None:
            return
        if any(arg.star for arg in value.args):
            return  # `*args` may pass async_op=True
        async_op = argument(value, "async_op", ASYNC_OP_POSITION.get(name))
        if (async_op is None or is_literal(async_op, False)) and all(value is not seen for seen, _ in self.found):
            self.found.append((value, name))

    def visit_Assign(self, node: cst.Assign) -> None:
        self._check(node.value)
        self.assignments[id(node.value)] = node

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._check(node.value)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        self._check(node.left)
        self._check(node.right)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check(node.value)
