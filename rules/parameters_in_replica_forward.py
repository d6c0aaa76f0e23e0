from __future__ import annotations

import re
from typing import Iterator, List, Optional, Set, Tuple

import libcst as cst

from dplint.analysis.facts import Wrap
from dplint.analysis.inference import ClassModel, Inference, Scope
from dplint.analysis.names import block_body, child_nodes, dotted
from dplint.analysis.context import FileContext
from dplint.finding import FileReference
from dplint.rule import Invalid, Report, Valid, WrappedForwardRule

PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})
# Handlers that catch the StopIteration of an empty `parameters()`.
CATCHING = frozenset({"StopIteration", "Exception", "BaseException"})


class ParametersInReplicaForward(WrappedForwardRule):
    """
    ## What it does
    Checks `forward` of `nn.Module` subclasses wrapped in `nn.DataParallel` (or
    `data_parallel(...)`) somewhere in the project, the methods and properties of the class that
    `forward` uses (`self._device()`, `self.device`), and the `forward` of the submodule classes of
    the same file they build, for the first element of `self.parameters()`:
    `next(self.parameters())`, `next(iter(self.parameters()))`, `self.parameters().__next__()`,
    `list(self.parameters())[0]`, also through a child module (`next(self.encoder.parameters())`)
    and with `named_parameters()`. Usually `device = next(self.parameters()).device` or `.dtype`.

    At runtime, a replica's forward that stops on such a call is reported as this code, at its line,
    instead of torch's bare `StopIteration`.

    ## Why is this bad?
    Since torch 1.5, DataParallel's `replicate` sets each replica's weights as plain attributes
    (`setattr(replica, "weight", copy)`): the replicas, and their submodules, have no registered
    parameters, so `self.parameters()` is empty in `forward` and `next()` raises `StopIteration`
    ("Caught StopIteration in replica 0 on device 0", pytorch issue #40457); `list(...)[0]` raises
    IndexError. On one GPU, or with no wrapper, the module has its parameters and the code works.
    DistributedDataParallel runs the module itself, with its parameters: it is not reported there.

    ## Example
    ```python
    class Net(nn.Module):
        def forward(self, x):
            device = next(self.parameters()).device
            return self.fc(x.to(device))
    ```

    ## Use instead
    ```python
    class Net(nn.Module):
        def forward(self, x):
            return self.fc(x.to(self.fc.weight.device))  # a named weight is an attribute of the replica
    ```
    or take the device or dtype from an input (`x.device`) or a registered buffer, which replicas keep.

    ## Known problems
    Only methods and properties of the class itself (or of its bases in the same file) are followed,
    three calls deep; a property inherited from another file (`self.device` of a base model class) is
    not seen. A call inside a `try` that catches `StopIteration` is not reported, nor `next(...,
    default)`. Loops over `self.parameters()` in `forward` are not reported: they silently run zero
    times on replicas. A wrap over a single device (`device_ids=[0]`) runs no replicas and is
    reported all the same. At runtime, only a line that itself calls `parameters()` is reported: a
    `next()` over an iterator built on another line stays torch's StopIteration.
    """

    code = "DPL311"
    name = "parameters-in-replica-forward"
    summary = "`forward` of a DataParallel-wrapped module takes `next(self.parameters())`: replicas have none (StopIteration)."
    triggers = re.compile(r"parameters\(")

    VALID = [
        Valid(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 2)

                def forward(self, x):
                    return self.fc(x.to(self.fc.weight.device))  # a named weight: the replica's own

            model = nn.DataParallel(Net())
            device = next(model.parameters()).device  # the wrapper, outside forward: it has parameters
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Net(nn.Module):  # never wrapped in DataParallel
                def forward(self, x):
                    return x.to(next(self.parameters()).device)
            """
        ),
        Valid(
            """
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP

            class Net(nn.Module):
                def forward(self, x):
                    return x.to(next(self.parameters()).dtype)  # DDP runs the module itself

            model = DDP(Net().cuda(rank), device_ids=[rank])
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    try:
                        dtype = next(self.parameters()).dtype
                    except StopIteration:  # a replica: fall back on the input
                        dtype = x.dtype
                    return x.to(dtype)

                def init_hidden(self, batch):
                    weight = next(self.parameters())  # called from the training loop, not from forward
                    return weight.new_zeros(batch, 8)

            model = nn.DataParallel(Net())
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    device = next(self.parameters()).device
                    return self.fc(x.to(device))

            model = nn.DataParallel(Net())
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Seq2Seq(nn.Module):
                def forward(self, src):
                    if next(iter(self.encoder.parameters())).is_cuda:
                        src = src.cuda()
                    return self.decoder(self.encoder(src))

            model = nn.DataParallel(Seq2Seq(), device_ids=[0, 1])
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Bert(nn.Module):
                def forward(self, ids, mask):
                    mask = mask.to(dtype=self.dtype)
                    return self.encoder(ids, mask)

                @property
                def dtype(self):
                    return list(self.parameters())[0].dtype

            model = nn.DataParallel(Bert())
            """,
            line=10,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Decoder(nn.Module):
                def forward(self, x):
                    return self._step(x)

                def _step(self, x):
                    hidden = x.new_zeros(1).to(self.parameters().__next__().device)
                    return x + hidden

            model = nn.DataParallel(Decoder())
            """,
            line=8,
        ),
    ]

    # How deep `forward` → method → method is followed.
    MAX_DEPTH = 3

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        reported: Set[int] = set()
        for class_name, (wrap, via) in inference.replicated_classes().items():
            model = inference.classes[class_name]
            forward = model.methods.get("forward")
            if forward is None or forward[1].self_name is None:
                continue
            replica = "" if via is None else f" of `{class_name}` (in `{via}`)"
            pending: List[Tuple[cst.FunctionDef, Scope, int]] = [(forward[0], forward[1], 0)]
            followed = {id(forward[0])}
            while pending:
                function, scope, depth = pending.pop()
                for node, statement in _unguarded_nodes(inference, function, scope):
                    first = _first_parameter(node, scope.self_name)
                    if first is not None and id(node) not in reported:
                        reported.add(id(node))
                        yield self._report(ctx, node, statement, first, replica, function, wrap)
                    if depth >= self.MAX_DEPTH:
                        continue
                    helper = _own_member(inference, model, node, scope.self_name)
                    if helper is not None and id(helper[0]) not in followed:
                        followed.add(id(helper[0]))
                        pending.append((helper[0], helper[1], depth + 1))

    @staticmethod
    def _report(ctx: FileContext, node: cst.CSTNode, statement: cst.CSTNode, error: str, replica: str,
                function: cst.FunctionDef, wrap: Wrap) -> Report:
        wrapped_at = FileReference.to(wrap.filename, wrap.path, wrap.line)
        where = "" if function.name.value == "forward" else f" in `{function.name.value}`"
        return Report(
            node=node,
            message=(
                f"`{ctx.short_code(node, 32)}`{where} raises {error}: DataParallel replicas{replica} lack "
                f"parameters ({wrapped_at.text})."
            ),
            help="Take the device or dtype from an input (`x.device`), a buffer, or a weight (`self.fc.weight.device`).",
            statement=statement,
            references=(wrapped_at,),
        )


def _unguarded_nodes(inference: Inference, function: cst.FunctionDef, scope: Scope) -> Iterator[Tuple[cst.CSTNode, cst.CSTNode]]:
    """Every expression node of a function's reachable code, with the statement holding it, except in a
    `try` that catches StopIteration, in nested functions, classes and lambdas."""

    def nodes(root: cst.CSTNode) -> Iterator[cst.CSTNode]:
        pending = [root]
        while pending:
            current = pending.pop()
            if isinstance(current, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
                continue
            yield current
            pending.extend(reversed(child_nodes(current)))

    def block(body, guarded: bool) -> Iterator[Tuple[cst.CSTNode, cst.CSTNode]]:
        for statement in body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if not guarded and inference.reachable(small, scope):
                        yield from ((node, small) for node in nodes(small))
                continue
            if not isinstance(statement, cst.BaseCompoundStatement) or not inference.reachable(statement, scope):
                continue
            if isinstance(statement, cst.Try):
                catches = any(_catches_stop_iteration(handler) for handler in statement.handlers)
                yield from block(block_body(statement.body), guarded or catches)
                for handler in statement.handlers:
                    yield from block(block_body(handler.body), guarded)
                for rest in (statement.orelse, statement.finalbody):
                    if rest is not None:
                        yield from block(block_body(rest.body), guarded)
                continue
            if not guarded:
                for header in _headers(statement):
                    yield from ((node, statement) for node in nodes(header))
            for inner in _child_statements(statement):
                yield from block(inner, guarded)

    yield from block(block_body(function.body), False)


def _headers(statement: cst.BaseCompoundStatement) -> List[cst.CSTNode]:
    """The expressions a compound statement evaluates itself (an `if` test, a `for` iterable, ...)."""
    headers: List[cst.CSTNode] = []
    current: Optional[cst.CSTNode] = statement
    while isinstance(current, cst.If):  # `elif` tests too
        headers.append(current.test)
        current = current.orelse
    if isinstance(statement, cst.While):
        headers.append(statement.test)
    elif isinstance(statement, cst.For):
        headers.append(statement.iter)
    elif isinstance(statement, cst.With):
        headers.extend(item.item for item in statement.items)
    elif isinstance(statement, cst.Match):
        headers.append(statement.subject)
    return headers


def _child_statements(statement: cst.BaseCompoundStatement) -> Iterator:
    if isinstance(statement, cst.Match):
        for case in statement.cases:
            yield block_body(case.body)
        return
    yield block_body(statement.body)
    orelse = getattr(statement, "orelse", None)
    while orelse is not None:
        yield block_body(orelse.body)
        orelse = getattr(orelse, "orelse", None) if isinstance(orelse, cst.If) else None


def _catches_stop_iteration(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = [element.value for element in handler.type.elements] if isinstance(handler.type, cst.Tuple) else [handler.type]
    return any((dotted(t) or "").rpartition(".")[2] in CATCHING for t in types)


def _is_parameters(node: cst.BaseExpression, self_name: Optional[str]) -> bool:
    """`self.parameters()`, `self.encoder.parameters()`, `self.named_parameters()`: a replica's are empty."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
        return False
    if node.func.attr.value not in PARAMETER_METHODS or any(arg.star for arg in node.args):
        return False
    receiver = dotted(node.func.value)
    return self_name is not None and receiver is not None and receiver.split(".")[0] == self_name


def _first_parameter(node: cst.CSTNode, self_name: Optional[str]) -> Optional[str]:
    """The error taking the first parameter raises on a replica, when `node` does that."""
    if isinstance(node, cst.Call):
        func = node.func
        if isinstance(func, cst.Name) and func.value == "next" and len(node.args) == 1 and not node.args[0].star:
            iterated = node.args[0].value
            if isinstance(iterated, cst.Call) and isinstance(iterated.func, cst.Name) and iterated.func.value == "iter":
                iterated = iterated.args[0].value if len(iterated.args) == 1 and not iterated.args[0].star else None
            if iterated is not None and _is_parameters(iterated, self_name):
                return "StopIteration"
        if isinstance(func, cst.Attribute) and func.attr.value == "__next__" and not node.args:
            if _is_parameters(func.value, self_name):
                return "StopIteration"
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        index = node.slice[0].slice.value
        if isinstance(index, cst.UnaryOperation) and isinstance(index.operator, cst.Minus):
            index = index.expression
        listed = node.value
        if (
            isinstance(index, cst.Integer)
            and isinstance(listed, cst.Call)
            and isinstance(listed.func, cst.Name)
            and listed.func.value in ("list", "tuple")
            and len(listed.args) == 1
            and not listed.args[0].star
            and _is_parameters(listed.args[0].value, self_name)
        ):
            return "IndexError"
    return None


def _own_member(inference: Inference, model: ClassModel, node: cst.CSTNode, self_name: Optional[str]) -> Optional[Tuple[cst.FunctionDef, Scope]]:
    """The method that `self.method(...)` calls, or the property that `self.prop` reads, in the class
    or its bases of this file."""
    if isinstance(node, cst.Call):
        target, wants_property = node.func, False
    elif isinstance(node, cst.Attribute):
        target, wants_property = node, True
    else:
        return None
    if not isinstance(target, cst.Attribute) or not isinstance(target.value, cst.Name) or target.value.value != self_name:
        return None
    name = target.attr.value
    if name == "forward" or self_name is None:
        return None
    pending, seen = [model], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        member = current.methods.get(name)
        if member is not None:
            decorators = {dotted(d.decorator) for d in member[0].decorators}
            is_property = decorators == {"property"}
            if is_property != wants_property or (decorators - {"property"}):
                return None  # a staticmethod, a cached property, a decorated method: not followed
            return member if member[1].self_name is not None else None
        pending.extend(inference.classes.get(dotted(base.value) or "") for base in current.node.bases)
    return None
