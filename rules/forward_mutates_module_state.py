from __future__ import annotations

import re
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.inference import Inference
from dplint.analysis.names import block_body, child_blocks, dotted, iter_calls, run_visitor
from dplint.finding import FileReference
from dplint.rule import Invalid, Report, Valid, WrappedForwardRule


class ForwardMutatesModuleState(WrappedForwardRule):
    """
    ## What it does
    Statically: inside `forward` of an `nn.Module` subclass that is wrapped in `nn.DataParallel`
    somewhere in the project, reports assignments to `self.<attr>` whose value outlives the call:
    the attribute is read outside `forward` (in another method, or through the model from outside
    the class, `model.module.steps`), or the assignment builds on the old value (`self.steps += 1`,
    `self.n = self.n + 1`). A scratch attribute reset at every call and read only inside `forward`
    is harmless and not reported, nor is code after `return`/`raise`. In-place updates of
    registered buffers (`self.running.mul_(0.9)`) are how BatchNorm keeps statistics and are not
    reported.

    At runtime, compares each replica of the wrapped module and its submodules before and after
    its forward, and reports `forward` rebinding an attribute (`self.steps += 1`), a registered
    buffer (`self.ema = 0.9 * self.ema + ...`), a parameter or a child module, or changing a list,
    dict, set or plain tensor attribute in place (`self.history.append(loss)`, `self.cache[k] = v`,
    `self.total += loss`).

    ## Why is this bad?
    DataParallel runs `forward` on replicas: shallow copies of the module made for every call. A
    rebinding happens on a replica and is thrown away with it, so the counter never advances and the
    cache stays empty, while on one GPU (no replicas) it works. An in-place change of a shared list or
    dict runs concurrently from every replica's thread, in no fixed order.

    ## Example
    ```python
    class Net(nn.Module):
        def forward(self, x):
            self.steps += 1
            return self.fc(x)
    ```

    ## Use instead
    Keep such state outside the module (in the training loop), or in a registered buffer updated in
    place (`self.steps.add_(1)`), which is how BatchNorm keeps its statistics; note that buffer
    updates are kept only from the replica on `device_ids[0]`.

    ## Known problems
    Statically, only `forward` itself is read, not the methods it calls; reads of the attribute in
    other files are not seen, so a scratch attribute read only there is not reported. In-place
    changes of a list or dict attribute (`self.history.append(x)`) are left to the runtime check.
    At runtime, attributes are compared one level deep: a change inside an object held by an
    attribute is not seen. What torch maintains itself is left alone: torch's own modules, the
    attributes torch's base classes use (a user subclass of `nn.LSTM` refreshes `_flat_weights`),
    and those recomputed by `spectral_norm`, `weight_norm` and pruning hooks.
    """

    code = "DPL304"
    preview = True
    preview_reason = (
        "Measured 0.67 on the 904 repositories of bench/wild (2 true, 1 false, 4 moot): an attribute set in `forward` and never read afterwards is reported."
    )
    name = "forward-mutates-module-state"
    summary = "`forward` of a DataParallel-wrapped module changes module attributes, which replicas lose."
    triggers = re.compile(r"self\.\w+\s*(?::[^=\n]*)?(?:[-+*/@%|&^]|//|\*\*|<<|>>)?=(?!=)")

    VALID = [
        Valid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.steps = 0  # __init__ is not forward
                    self.register_buffer("running", torch.zeros(4))

                def forward(self, x):
                    self.running.mul_(0.9).add_(x.mean(0))  # in place on a buffer: BatchNorm's way
                    return x

            model = nn.DataParallel(Net())
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Net(nn.Module):  # never wrapped: attribute updates persist
                def forward(self, x):
                    self.last = x
                    return x

                def plot(self):
                    return self.last
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Decoder(nn.Module):
                def forward(self, x):
                    self.batch_size = x.size(0)  # scratch: set on every call, read only here
                    return x.view(self.batch_size, -1)

            model = nn.DataParallel(Decoder())
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    return x
                    self.steps += 1  # unreachable

                def report(self):
                    return self.steps

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
                    self.steps += 1
                    return x

            model = nn.DataParallel(Net())
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Attention(nn.Module):
                def forward(self, q, k):
                    scores = q @ k.transpose(-1, -2)
                    self.last_scores = scores.detach()
                    return scores

                def plot(self):
                    show(self.last_scores)  # read after the call: empty under DataParallel

            model = nn.DataParallel(Attention().cuda())
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Base(nn.Module):
                def forward(self, x):
                    if self.training:
                        self.seen: int = self.seen + len(x)
                    return x

            class Net(Base):
                pass

            net = nn.DataParallel(Net())
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Tagger(nn.Module):
                def forward(self, x):
                    self.attention = x.softmax(-1)
                    return x

            model = nn.DataParallel(Tagger())
            heatmap = model.module.attention  # read through the model
            """,
            line=5,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        for class_name, forward, scope, wraps in inference.wrapped_forwards():
            related = {name for name, model in inference.classes.items() if _related(inference, name, class_name)}
            read_elsewhere = _attributes_read_outside(ctx, class_name, forward, related)
            for statement in _reachable_small_statements(block_body(forward.body)):
                targets = []
                if isinstance(statement, cst.Assign):
                    targets = [target.target for target in statement.targets]
                elif isinstance(statement, (cst.AugAssign, cst.AnnAssign)):
                    targets = [statement.target]
                for target in targets:
                    if not _is_self_attribute(target, scope.self_name):
                        continue
                    name = target.attr.value
                    builds_on_old = isinstance(statement, cst.AugAssign) or _reads_self_attribute(
                        statement.value, scope.self_name, name
                    )
                    if builds_on_old or name in read_elsewhere:
                        yield self._report(ctx, class_name, statement, target, wraps[0])

    @staticmethod
    def _report(ctx: FileContext, class_name: str, statement: cst.CSTNode, target: cst.Attribute, wrap) -> Report:
        attribute = ctx.code(target)
        wrapped_at = FileReference.to(wrap.filename, wrap.path, wrap.line)
        return Report(
            node=statement,
            message=(
                f"`{class_name}.forward` sets `{attribute}` on a DataParallel replica ({wrapped_at.text}): "
                "the change is lost."
            ),
            help=f"Move `{attribute}` out of forward (into the training loop), or keep it in a buffer updated in place.",
            statement=statement,
            references=(wrapped_at,),
        )


def _related(inference: Inference, name: str, class_name: str) -> bool:
    """Whether `name` is `class_name`, one of its bases, or a subclass of it (in this file)."""
    def ancestors(start: str) -> Set[str]:
        seen, pending = set(), [start]
        while pending:
            current = pending.pop()
            model = inference.classes.get(current)
            if current in seen or model is None:
                continue
            seen.add(current)
            pending.extend(dotted(base.value) or "" for base in model.node.bases)
        return seen | {start}

    return name in ancestors(class_name) or class_name in ancestors(name)


def _is_self_attribute(target: cst.BaseExpression, self_name) -> bool:
    return isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == self_name


def _reachable_small_statements(body) -> Iterator[cst.BaseSmallStatement]:
    """Small statements of a block and its nested blocks, none after `return`/`raise`/`continue`/`break`."""
    for statement in body:
        smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else (
            (statement,) if isinstance(statement, cst.BaseSmallStatement) else ()
        )
        for small in smalls:
            yield small
            if isinstance(small, (cst.Return, cst.Raise, cst.Continue, cst.Break)):
                return
        if isinstance(statement, cst.BaseCompoundStatement) and not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            for block in child_blocks(statement):
                yield from _reachable_small_statements(block)


class _AttributeReads(cst.CSTVisitor):
    """Every attribute read (not assigned) in the file, with the class and the functions it is in, and
    the names bound to a call of each class (`model = Net()`, `model = nn.DataParallel(Net())`).

    One pass per file, shared by every wrapped class the rule looks at."""

    def __init__(self) -> None:
        self.targets: Set[int] = set()
        self.instances: Dict[str, Set[str]] = {}  # class name → names bound to a call of it
        self.classes: List[str] = []
        self.self_names: List[Optional[str]] = []
        self.functions: List[int] = []
        # (attribute, base, class, self name, ids of the enclosing functions)
        self.reads: List[Tuple[str, str, Optional[str], Optional[str], Tuple[int, ...]]] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        params = node.params.params
        self.self_names.append(params[0].name.value if params else None)
        self.functions.append(id(node))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.self_names.pop()
        self.functions.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        self.targets.update(id(target.target) for target in node.targets)
        names = [t.target.value for t in node.targets if isinstance(t.target, cst.Name)]
        for call in iter_calls(node.value) if names else ():
            callee = dotted(call.func)
            if callee is not None:
                self.instances.setdefault(callee.rpartition(".")[2], set()).update(names)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.targets.add(id(node.target))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        base = dotted(node.value)
        if id(node) not in self.targets and base is not None:
            owner = self.classes[-1] if self.classes else None
            self_name = self.self_names[-1] if self.self_names else None
            self.reads.append((node.attr.value, base, owner, self_name, tuple(self.functions)))


def _attributes_read_outside(ctx: FileContext, class_name: str, forward: cst.FunctionDef, related: Set[str]) -> Set[str]:
    """Attributes read on the model outside its `forward`: `self.x` in the class's (or a related
    class's) other methods, and `model.x` / `model.module.x` where `model` holds an instance of it."""

    def collect() -> _AttributeReads:
        reads = _AttributeReads()
        run_visitor(ctx.module, reads)
        return reads

    reads = ctx.memo("forward-state:attribute-reads", collect)
    instances = reads.instances.get(class_name, set())
    found = set()
    for attribute, base, owner, self_name, functions in reads.reads:
        if id(forward) in functions:
            continue
        on_self = owner in related and base == self_name
        root, _, _ = base.partition(".")
        through_model = root in instances and base.rpartition(".")[2] in (root, "module")
        if on_self or through_model:
            found.add(attribute)
    return found


def _reads_self_attribute(value: Optional[cst.BaseExpression], self_name: str, name: str) -> bool:
    if value is None:
        return False
    found = []

    class Finder(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if node.attr.value == name and isinstance(node.value, cst.Name) and node.value.value == self_name:
                found.append(node)

    run_visitor(value, Finder())
    return bool(found)


def message(class_name: str, changes: Sequence[str]) -> str:
    return (
        f"`{class_name}.forward` {', '.join(changes)}: under DataParallel, forward runs on per-call replicas, so "
        "rebindings are lost when the call returns and in-place changes race between replicas' threads; keep "
        "the state outside the module, or in a registered buffer updated in place."
    )
