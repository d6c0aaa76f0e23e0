from __future__ import annotations

import re
from typing import Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.inference import Inference, Kind, Scope
from dplint.analysis.names import assigned_parts, descendants, dotted
from dplint.analysis.outline import Outline
from dplint.analysis.tensor_api import TORCH_FUNCTIONS
from dplint.analysis.torch_api import DTYPES
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid

MOVES = frozenset({"to", "cuda", "cpu"})
# What may stand before the move at the start of a statement line: names, attributes, calls, subscripts.
_STATEMENT_PREFIX = re.compile(r"[ \t]*[A-Za-z_][\w.]*(?:(?:\([^()\n]*\)|\[[^\]\n]*\])[\w.]*)*")
# A line opening a one-line suite: its `:` is followed by a statement (a dict's or lambda's is not).
_COMPOUND_HEADER = re.compile(r"[ \t]*(?:if|elif|else|for|while|with|try|except|finally|def|class|async|case)\b")


class DiscardedTensorMove(Rule):
    """
    ## What it does
    Checks for expression statements that call `.to(...)`, `.cuda(...)` or `.cpu()` on a tensor and
    throw the result away, also at the end of a chain such as `loss.detach().cpu()`.

    ## Why is this bad?
    `Tensor.to` returns a moved *copy*; the tensor it is called on stays where it was. (`nn.Module.to`
    is different: it moves the module in place and returns it, so `model.to(device)` is correct.) The
    code after a discarded move keeps using the tensor on its old device: on a GPU run it fails with a
    device-mismatch error at best, and at worst keeps silently computing on the CPU or on GPU 0 while
    the other GPUs wait.

    ## Example
    ```python
    for data, target in loader:
        data.to(device)
        target.to(device)
        output = model(data)
    ```

    ## Use instead
    ```python
    for data, target in loader:
        data = data.to(device)
        target = target.to(device)
        output = model(data)
    ```

    A `.to()` given only a dtype (`mask.to(torch.float16)`, `bias.to(q.dtype)`) casts and moves
    nothing: discarding it is not reported here. Nor is a move written straight in a `try:` whose
    handlers catch: it is made to see whether it raises (a probe for a usable GPU). Nor is a move of
    a tensor the statement makes itself (`torch.zeros(1).cuda()`, for a CUDA context), or of a local
    variable that nothing reads afterwards: no code is left using the tensor that stayed behind.

    ## Fix safety
    The fix assigns the result back (`x = x.to(device)`) for a local name or a `self.<attr>` that is
    not an `nn.Parameter` (assigning a plain tensor to a parameter's name raises). It is offered as safe.

    ## Known problems
    The rule reports only values it can show are tensors *at that line*, following the function's
    control flow (a name rebound to something unknown earlier on any path is unknown; code after
    `return`, `raise`, `break`, `continue` or `sys.exit()` is never reported). Evidence: the `torch`
    and `torch.nn.functional` functions and `Tensor` methods and attributes whose type stubs return a
    tensor (a table generated from torch's stubs), `nn.Parameter`, `Variable(...)`, registered buffers
    and tensor attributes set in any method of the class or returned by its `@property`, arguments
    annotated `torch.Tensor`, arithmetic and comparisons (`scores > t`) on tensors, the result of
    `.detach()`, `.unsqueeze()`, `.type_as()`, `.new_zeros()` and other methods no common non-tensor
    type defines, the values of a call made with `return_tensors="pt"` (Hugging Face tokenizers),
    elements of a loop over a `torch.utils.data.DataLoader` built without `collate_fn` (a `**kwargs`
    argument is assumed not to carry one) or over a tensor, what unpacking or indexing those gives,
    lists, tuples and dicts built only from tensors (literals and comprehensions, never given
    anything else later), `module.parameters()`, functions of the project every `return` of which
    gives a tensor (also where they are imported, and module-level names assigned their result), and
    the parameters of a function, or of a class's `__init__`, to which every call in the project
    passes a tensor (or leaves out a parameter whose default is one): `Loss(anchors)` in `train.py`
    after `anchors = make_anchors(...)`, or `Loss(cfg.anchors)` where the module `cfg` assigns
    `anchors = make_anchors(...)`, makes `anchors` a tensor inside `loss.py`. A call in another file
    counts what its arguments show without running that file's flow: a local name through all of its
    assignments in its function, a torch call, a project function or module-level name. Such a
    parameter is unknown when there is no call, when the function or class is used any other way
    (passed on, stored, subclassed, re-exported, imported by a file that names no torch and is not
    read), when a call splats `*args`/`**kwargs`, when a decorator may change the arguments, and for
    a class that a class method or `type(self)(...)` may build; the project is taken to be closed
    (nothing outside it calls its functions). Attributes of an object set just before the call
    (`cfg.anchors = ...; Loss(cfg.anchors)`) and lists filled by `append` after `[]` are not followed.
    Everything else is unknown and stays silent: objects whose `.to()` works in place (PyG's `Data`,
    Hugging Face's `BatchEncoding`, any `nn.Module`) must never be reported, so a value the rule
    cannot trace to a tensor is given the benefit of the doubt. A container filled by another
    function (`fill(batch)`) is not seen.
    """

    code = "DPL101"
    name = "discarded-tensor-move"
    summary = "The result of `tensor.to()`, `.cuda()` or `.cpu()` is discarded, so the tensor never moves."
    fix_applicability = ("safe",)
    triggers = re.compile(r"\.(?:to|cuda|cpu)\(")

    VALID = [
        Valid(
            """
            import torch
            probe = torch.zeros(1)
            usable = []
            for i in range(8):
                try:
                    probe.to(device=i)  # raises for a GPU this process cannot use
                    usable.append(i)
                except RuntimeError:
                    pass
            """
        ),
        Valid(
            """
            import torch
            def attention_bias(query, length):
                bias = torch.zeros(length, length, dtype=query.dtype)
                bias.to(query.dtype)  # a cast, not a move
                bias.to(dtype=torch.float16)
                return bias
            """
        ),
        Valid(
            """
            import torch.nn as nn
            model = nn.Linear(5, 2)
            model.to("cuda")
            """
        ),
        Valid(
            """
            import torch
            x = torch.zeros(3)
            x = x.to("cuda")
            y = x.cpu()
            """
        ),
        Valid(
            """
            def move(batch, device):
                batch.to(device)  # a PyG Data or BatchEncoding moves in place: unknown, not a tensor
            """
        ),
        Valid(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, collate_fn=collate_graphs)
            for graph in loader:
                graph.to("cuda")
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 4)

                def setup(self, device):
                    self.to(device)
                    self.fc.to(device)
            """
        ),
        Valid(
            """
            import torch
            x = torch.zeros(3) if cond else Data()
            x.to("cuda")
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn

            class Decoder(nn.Module):
                def forward(self, x, h):
                    h = torch.zeros(1, x.size(0), 8)
                    h = self.rnn(x, h)  # rebound to what the RNN returns: no longer known to be a tensor
                    h.cuda()
                    return h
            """
        ),
        Valid(
            """
            import torch
            if use_graph:
                x = Data(pos=torch.zeros(3))
            else:
                x = torch.zeros(3)
            x.to("cuda")  # a tensor on one branch only
            """
        ),
        Valid(
            """
            import torch
            x = torch.zeros(3)
            for graph in graphs:
                x.to("cuda")  # from the second iteration on, `x` is a graph
                x = graph
            """
        ),
        Valid(
            """
            import torch
            def step(x):
                x = torch.zeros(3)
                return x
                x.cuda()  # unreachable
            """
        ),
        Valid(
            """
            import torch
            inputs = {"mask": torch.ones(4)}
            inputs["graph"] = Graph()
            inputs["graph"].to("cuda")  # the dict no longer holds only tensors
            """
        ),
        Valid(
            """
            import torch
            def make(n):
                if n:
                    return torch.zeros(n)
            make(3).cuda()  # may return None
            """
        ),
        Valid(
            """
            import torch
            try:
                x = torch.zeros(3)
                x = load_graph()
            except OSError:
                pass
            x.to("cuda")  # a graph when the load succeeded
            """
        ),
        Valid(
            """
            def snapshot(batch, model):
                batch.clone().cuda()  # PyG's `Data.clone()`: its `.cuda()` moves in place
                model.float().cuda()  # nn.Module: in place
            """
        ),
        Valid(
            """
            def encode(tokenizer, texts, device):
                inputs = tokenizer(texts, return_tensors="pt")
                inputs.to(device)  # a BatchEncoding moves in place
                inputs[0].to(device)  # the first text's `Encoding`, not a tensor
            """
        ),
        Valid(
            """
            import torch

            class Buffer:
                def __init__(self, array):
                    self.data = torch.from_numpy(array)

                def reset(self):
                    self.data = Batch()

                def move(self, device):
                    self.data.to(device)  # a Batch after `reset()`
            """
        ),
        Valid(
            """
            import torch
            x = torch.zeros(3)
            inside = 0 < x < 1  # a chained comparison is an `and` of two: a bool
            inside.cuda()
            """
        ),
        Valid(
            """
            class EMA:
                def __init__(self, model):
                    self.model = model
                    self.shadow = self.copy_params()

                def copy_params(self):
                    return [p.clone() for p in self.model.parameters()]  # `model` is unknown here

                def cuda(self, i):
                    self.shadow[i].cuda()
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Head:
                def __init__(self, layer, device):
                    self.layer = layer
                    self.layer.to(device)  # every call passes a module, which moves in place

            head = Head(nn.Linear(4, 2), "cuda")
            """
        ),
        Valid(
            """
            import torch

            class YoloLoss:
                def __init__(self, anchors, device):
                    self.anchors = anchors
                    self.anchors.to(device)

            criterion = YoloLoss(torch.ones(3, 2), "cuda")
            fallback = YoloLoss(Anchors.load("anchors.txt"), "cuda")  # not known to be a tensor
            """
        ),
        Valid(
            """
            import torch

            class YoloLoss:
                def __init__(self, anchors, device):
                    self.anchors = anchors
                    self.anchors.to(device)

            LOSSES = {"yolo": YoloLoss}  # built from a config elsewhere, with arguments not seen here
            criterion = YoloLoss(torch.ones(3, 2), "cuda")
            """
        ),
        Valid(
            """
            import torch

            def place(boxes, device):
                boxes = Boxes(boxes)  # rebound before the move: a project object, moved in place
                boxes.to(device)
                return boxes

            place(torch.zeros(4, 4), "cuda")
            """
        ),
        Valid(
            """
            import torch

            @registry.register
            def move(batch, device):
                batch.to(device)  # the registry may call it with anything

            move(torch.zeros(2), "cuda")
            """
        ),
        Valid(
            """
            import torch

            def occupy_gpus(gpus):
                for g in gpus:
                    torch.zeros(1).cuda(g)  # a tensor made here for a CUDA context; nothing holds it
            """
        ),
        Valid(
            """
            import torch

            def fit(weight):
                weight_2d = weight.reshape(weight.shape[0], -1)
                centroids = kmeans(weight_2d)
                weight_2d.cpu()  # discarded, but nothing reads `weight_2d` again
                return centroids
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch

            def collect(loader, device):
                counts = None
                for batch in loader:
                    if counts is not None:
                        total = counts.sum()  # the next iteration reads the tensor left on the CPU
                    counts = torch.zeros(len(batch))
                    counts.to(device)
            """,
            line=9,
        ),
        Invalid(
            """
            import torch
            batch = torch.zeros(4, 3)
            try:
                batch.to("cuda")  # no handler: nothing is probed
                out = model(batch)
            finally:
                release()
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            x = torch.randn(8, 3)
            x.to("cuda")
            """,
            line=3,
            expected_fix="""
            import torch
            x = torch.randn(8, 3)
            x = x.to("cuda")
            """,
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=30, shuffle=True)
            for batch_idx, (data, target) in enumerate(loader):
                data.to(device)  # keep this comment
                output = model(data)
            """,
            line=6,
            expected_fix="""
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=30, shuffle=True)
            for batch_idx, (data, target) in enumerate(loader):
                data = data.to(device)  # keep this comment
                output = model(data)
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.register_buffer("mask", torch.ones(4))

                def forward(self, x):
                    self.mask.cuda()
                    return x * self.mask
            """,
            line=10,
        ),
        Invalid(
            """
            import torch
            def log_loss(loss: torch.Tensor):
                loss.detach().cpu()
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader

            def train(model, loader, device):
                for inputs, labels in loader:
                    inputs.cuda()
                    model(inputs)

            def main():
                loader = DataLoader(dataset, batch_size=64)
                train(model, loader, "cuda")
            """,
            line=6,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Decoder(nn.Module):
                def forward(self, x, use_cuda):
                    h = torch.zeros(1, x.size(0), 8)
                    if use_cuda:
                        h.cuda()
                    h = self.rnn(x, h)
                    return h
            """,
            line=8,
            expected_fix="""
            import torch
            import torch.nn as nn

            class Decoder(nn.Module):
                def forward(self, x, use_cuda):
                    h = torch.zeros(1, x.size(0), 8)
                    if use_cuda:
                        h = h.cuda()
                    h = self.rnn(x, h)
                    return h
            """,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=32)
            for batch in loader:
                inputs, targets = batch
                inputs.to(device)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.nn as nn

            def snapshot(model: nn.Module, i):
                params = [p.data.clone() for p in model.parameters()]
                params[i].cuda()
            """,
            line=5,
        ),
        Invalid(
            """
            import torch
            tensors = {"a": torch.zeros(1), "b": torch.ones(1)}
            tensors["a"].cuda()
            """,
            line=3,
        ),
        Invalid(
            """
            import torch

            def make_priors(n):
                priors = torch.zeros(n, 4)
                return priors.clamp(0, 1)

            def anchors(n):
                return make_priors(n) * 2

            anchors(8).cuda()
            """,
            line=10,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Tracker(nn.Module):
                def init_hidden(self, n):
                    return torch.zeros(1, n, 16)

                def reset(self, n):
                    self.hidden = self.init_hidden(n)

                def to_gpu(self):
                    self.hidden.cuda()
            """,
            line=12,
        ),
        Invalid(
            """
            import torch
            for chunk in torch.split(torch.arange(10), 4):
                chunk.cuda()
            """,
            line=3,
        ),
        Invalid(
            """
            import torch

            def preprocess(a):
                inp = torch.from_numpy(a).float().div(255.0).unsqueeze_(0)
                inp.cuda()
                return inp
            """,
            line=5,
        ),
        Invalid(
            """
            import torch

            def keep(scores: torch.Tensor, threshold):
                mask = scores > threshold  # elementwise: a bool tensor
                mask.cuda()
                return scores[mask]
            """,
            line=5,
        ),
        Invalid(
            """
            def log(d_loss, writer):
                d_loss.detach().cpu()  # `detach()` returns a tensor whatever `d_loss` is
                writer.add_scalar("d_loss", d_loss.item())
            """,
            line=2,
        ),
        Invalid(
            """
            from torch.autograd import Variable

            def step(x, device):
                v = Variable(x)
                v.cuda()
                return v
            """,
            line=5,
        ),
        Invalid(
            """
            def encode(tokenizer, texts, device):
                inputs = tokenizer(texts, padding=True, return_tensors="pt")
                for k in inputs:
                    inputs[k].to(device)
                return inputs
            """,
            line=4,
        ),
        Invalid(
            """
            import torch

            class Dataset:
                def __init__(self, array):
                    self.data = torch.from_numpy(array)

                def move(self, device):
                    self.data.to(device)
            """,
            line=8,
        ),
        Invalid(
            """
            class EMA:
                def __init__(self, model):
                    self.model = model
                    self.ema_params = self.clone_params()

                def clone_params(self):
                    return [p.clone().detach() for p in self.model.parameters()]

                def cuda(self):
                    for i in range(len(self.ema_params)):
                        self.ema_params[i].cuda()
            """,
            line=11,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            def make_anchors(sizes):
                return torch.tensor(sizes, dtype=torch.float32) / 32

            class YoloLoss(nn.Module):
                def __init__(self, anchors, device="cuda"):
                    super(YoloLoss, self).__init__()
                    self.anchors = anchors
                    self.anchors.to(device)

            criterion = YoloLoss(make_anchors([[10, 13], [16, 30]]))
            """,
            line=11,
            expected_fix="""
            import torch
            import torch.nn as nn

            def make_anchors(sizes):
                return torch.tensor(sizes, dtype=torch.float32) / 32

            class YoloLoss(nn.Module):
                def __init__(self, anchors, device="cuda"):
                    super(YoloLoss, self).__init__()
                    self.anchors = anchors
                    self.anchors = self.anchors.to(device)

            criterion = YoloLoss(make_anchors([[10, 13], [16, 30]]))
            """,
        ),
        Invalid(
            """
            import torch

            def normalize(images, mean=torch.tensor([0.485, 0.456, 0.406])):
                mean.cuda()  # every call leaves `mean` out: the default, a tensor
                return images - mean.view(3, 1, 1)

            normalize(torch.rand(3, 8, 8))
            """,
            line=4,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        """Whether some statement starts with a bare move: `x.to(`, `self.buf.cuda(`, `loss.detach().cpu(`,
        also after a `;` or after the `:` of a one-line suite (`if use_cuda: h.cuda()`)."""
        for match in self.triggers.finditer(text):
            line_start = text.rfind("\n", 0, match.start()) + 1
            separators = (";", ":") if _COMPOUND_HEADER.match(text, line_start) else (";",)
            starts = {line_start} | {text.rfind(mark, line_start, match.start()) + 1 for mark in separators} - {0}
            if any(_STATEMENT_PREFIX.fullmatch(text, start, match.start()) for start in starts):
                return True
        return False

    def applies_to_outline(self, outline: Outline) -> bool:
        return not MOVES.isdisjoint(outline.discarded_methods)

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        for line, scope in inference.statements:
            for small in line.body:
                call = small.value if isinstance(small, cst.Expr) else None
                if call is None or not inference.reachable(small, scope):
                    continue
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
                    continue
                if call.func.attr.value not in MOVES or _casts_only(ctx, call):
                    continue
                receiver = call.func.value
                if inference.kind(receiver, scope) is not Kind.TENSOR or id(line) in _probes(ctx):
                    continue
                if _made_here(ctx, receiver) or _never_read_again(inference, receiver, scope):
                    continue
                yield self._report(ctx, small, call, receiver, scope)

    @staticmethod
    def _report(ctx: FileContext, statement: cst.Expr, call: cst.Call, receiver: cst.BaseExpression, scope: Scope) -> Report:
        move = ctx.short_code(call)
        target = _assignable(receiver, scope)
        if target is None:
            return Report(
                node=call,
                message=f"`{move}` returns a moved copy of the tensor, and this statement discards it.",
                help="Assign the result to a variable and use it, or delete the statement.",
                statement=statement,
            )
        assignment = f"{target} = {move}"
        return Report(
            node=call,
            message=f"`{move}` returns a moved copy that is discarded; `{target}` itself does not move.",
            help=f"Assign the result: `{assignment}`.",
            fix=FixSpec(message=f"Assign the result to `{target}`", edits=(NodeEdit(statement, f"{target} = ", insert_before=True),)),
            statement=statement,
        )


def _probes(ctx: FileContext) -> FrozenSet[int]:
    """The statement lines written straight in a `try:` whose handlers catch: a move there is made to
    see whether it raises (`try: t.to(device=i)` … `except: ...`, a probe for usable GPUs), not for
    its result."""

    def compute() -> FrozenSet[int]:
        return frozenset(
            id(statement)
            for node in descendants(ctx.module)
            if isinstance(node, cst.Try) and node.handlers
            for statement in node.body.body
        )

    return ctx.memo("discarded-move-probes", compute)


def _made_here(ctx: FileContext, receiver: cst.BaseExpression) -> bool:
    """`torch.zeros(1).cuda()`: a tensor the statement itself makes, which nothing else holds; moving it
    is done for the side effect (a CUDA context), and no tensor of the code stays behind."""
    if not isinstance(receiver, cst.Call):
        return False
    module, _, name = (ctx.qualify(receiver.func) or "").rpartition(".")
    return module == "torch" and name in TORCH_FUNCTIONS and not name.endswith("_")


def _never_read_again(inference: Inference, receiver: cst.BaseExpression, scope: Scope) -> bool:
    """Whether the receiver is a local variable of a function (not a parameter: the caller holds that
    tensor too) that nothing reads after the move: the tensor that stays behind is never used, so
    nothing runs on the wrong device. A read earlier in a loop around the move comes after it in the
    next iteration, unless the iteration assigns the name afresh before it."""
    if not isinstance(receiver, cst.Name) or scope.function is None:
        return False
    reaching = inference.reaching_bindings(receiver, scope)
    if not reaching or any(binding in reaching for _, binding in scope.entry):
        return False
    name = receiver.value
    place: Dict[int, int] = {}  # node id → its place in source order
    parent: Dict[int, cst.CSTNode] = {}
    pending: List[cst.CSTNode] = [scope.function.body]
    while pending:
        node = pending.pop()
        place[id(node)] = len(place)
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.BaseComp)):
            if any(isinstance(part, cst.Name) and part.value == name for part in descendants(node)):
                return False  # read by a closure or a comprehension, whenever that runs
            continue
        for child in reversed(node.children):
            parent[id(child)] = node
            pending.append(child)
    bound = {id(target) for target in _bound_names(scope.function.body)}
    for node in descendants(scope.function.body):
        if not (isinstance(node, cst.Name) and node.value == name and node is not receiver) or id(node) in bound:
            continue
        bindings = inference.reaching_bindings(node, scope)
        if bindings is None or bindings.isdisjoint(reaching):
            continue
        if place.get(id(node), -1) > place[id(receiver)] or _read_next_iteration(node, receiver, name, parent):
            return False
    return True


def _read_next_iteration(read: cst.Name, move: cst.Name, name: str, parent: Mapping[int, cst.CSTNode]) -> bool:
    """Whether a loop around both the move and an earlier read reaches the read again with the moved
    name's value: no assignment of the name stands before the read in its iteration (in its block or
    a block around it, inside the loop)."""
    around_move = set()
    node: Optional[cst.CSTNode] = move
    while node is not None:
        around_move.add(id(node))
        node = parent.get(id(node))
    node, assigned = read, False
    while node is not None:
        above = parent.get(id(node))
        if isinstance(above, (cst.IndentedBlock, cst.Module)):
            for statement in above.body:
                if statement is node:
                    break
                if _assigns(statement, name):
                    assigned = True
        if isinstance(above, (cst.For, cst.While)) and id(above) in around_move and above.body is node and not assigned:
            return True
        node = above
    return False


def _bound_names(body: cst.CSTNode) -> Iterator[cst.Name]:
    """The names that statements bind without reading them: assignment and loop targets, `as` names, `del`."""
    for node in descendants(body):
        if isinstance(node, (cst.AssignTarget, cst.AnnAssign, cst.For, cst.NamedExpr, cst.CompFor, cst.Del)):
            target = node.target
        elif isinstance(node, cst.AsName):
            target = node.name
        else:
            continue
        yield from (part for part in assigned_parts(target) if isinstance(part, cst.Name))


def _assigns(statement: cst.CSTNode, name: str) -> bool:
    """`name = ...` as a statement of its own."""
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets)
        for small in statement.body
    )


def _casts_only(ctx: FileContext, call: cst.Call) -> bool:
    """`x.to(torch.float16)`, `x.to(y.dtype)`, `x.to(dtype=...)`: a `.to()` that names only a dtype changes
    no device, so discarding it loses no move."""
    if call.func.attr.value != "to" or not call.args:  # type: ignore[attr-defined]
        return False
    for arg in call.args:
        if arg.star:
            return False
        if arg.keyword is not None:
            if arg.keyword.value not in ("dtype", "non_blocking", "copy", "memory_format"):
                return False
            continue
        value = arg.value
        module, _, name = (ctx.qualify(value) or "").rpartition(".")
        if not ((isinstance(value, cst.Attribute) and value.attr.value == "dtype") or (module == "torch" and name in DTYPES)):
            return False
    return True


def _assignable(receiver: cst.BaseExpression, scope: Scope) -> str | None:
    """The receiver's text when assigning the moved copy back to it is safe."""
    if isinstance(receiver, cst.Name):
        # Assigning a global inside a function would make it local (UnboundLocalError).
        local = scope.parent is None or receiver.value in scope.bindings
        return receiver.value if local else None
    if isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name):
        is_self = scope.self_name is not None and receiver.value.value == scope.self_name
        attribute = receiver.attr.value
        # A property the class never assigns may have no setter: assigning to it raises.
        assigned = scope.owner is not None and attribute in scope.owner.attributes
        if is_self and assigned and not Inference.self_attribute_is_parameter(attribute, scope):
            return dotted(receiver)
    return None
