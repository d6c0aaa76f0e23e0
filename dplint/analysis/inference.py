"""What kind of value an expression holds: a Tensor, an nn.Module, a DataLoader, or unknown.

The inference is deliberately conservative. A name's kind is the join of every value bound to it in
its scope (flow-insensitive): bound once to a tensor and once to anything else, it is unknown. Rules
that must never cry wolf (DPL101) act only on a definite TENSOR.

Evidence used: tensor factories and `torch.nn.functional`, `nn.Parameter`, module constructors from
`torch.nn`/`torchvision` and classes of the file that subclass `nn.Module`, `self.<attr>` bound in
the class's methods (registered buffers and parameters are tensors), annotations, arithmetic and
tensor methods on tensors, loops over a DataLoader or a tensor, and for an unannotated parameter of a
function of the same file the arguments at its call sites.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from dplint.context import FileContext
from dplint.analysis.facts import ProjectFacts, Wrap
from dplint.analysis.names import Body, block_body, child_blocks, dotted
from dplint.rule import Rule


class WrappedForwardRule(Rule):
    """A rule about the `forward` of modules DataParallel runs: a file that defines none of the
    classes the project wraps is never parsed for it."""

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        return project.wraps_any(module_classes) and super().applies_to(text, module_classes, project)


class Kind(enum.Enum):
    TENSOR = "tensor"
    MODULE = "module"
    LOADER = "loader"  # a torch DataLoader with the default collate: iterating it yields tensors
    OTHER = "other"


def join(a: Optional[Kind], b: Optional[Kind]) -> Optional[Kind]:
    """None is "no evidence yet"; two different kinds make the value unknown."""
    if a is None:
        return b
    if b is None or a is b:
        return a
    return Kind.OTHER


TENSOR_FACTORIES = frozenset(
    """tensor as_tensor asarray from_numpy zeros ones empty full rand randn randint randperm arange linspace
    logspace eye zeros_like ones_like empty_like full_like rand_like randn_like randint_like cat concat
    concatenate stack hstack vstack dstack matmul mm bmm einsum exp log sqrt abs sigmoid tanh softmax
    log_softmax relu clamp clip sum mean argmax argmin flatten reshape transpose permute squeeze unsqueeze
    masked_fill gather index_select tril triu outer cumsum sign cdist multinomial bernoulli normal clone
    where tile repeat_interleave flip roll diag bucketize searchsorted Tensor FloatTensor DoubleTensor
    HalfTensor BFloat16Tensor LongTensor IntTensor ShortTensor ByteTensor CharTensor BoolTensor""".split()
)
TENSOR_RETURNING_FUNCTIONAL = frozenset(
    """relu relu6 gelu silu mish elu selu celu leaky_relu softplus softsign hardtanh hardswish sigmoid tanh
    softmax log_softmax softmin gumbel_softmax dropout dropout1d dropout2d dropout3d linear bilinear conv1d
    conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d avg_pool1d avg_pool2d avg_pool3d
    adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d interpolate upsample pad normalize one_hot
    embedding layer_norm group_norm batch_norm instance_norm cross_entropy nll_loss mse_loss l1_loss
    smooth_l1_loss huber_loss binary_cross_entropy binary_cross_entropy_with_logits kl_div cosine_similarity
    pairwise_distance scaled_dot_product_attention grid_sample affine_grid pixel_shuffle unfold fold""".split()
)
TENSOR_METHODS = frozenset(
    """to cuda cpu detach clone contiguous float half double bfloat16 long int short bool byte char type_as
    view view_as reshape reshape_as permute transpose t squeeze unsqueeze flatten unflatten expand expand_as
    repeat sum mean std var abs exp log sqrt pow neg sigmoid tanh relu softmax log_softmax argmax argmin norm
    matmul mm bmm masked_fill clamp clip add sub mul div floor_divide remainder round floor ceil sign eq ne gt
    lt ge le logical_not logical_and logical_or any all pin_memory requires_grad_ index_select gather narrow
    new_zeros new_ones new_empty new_full new_tensor flip roll cumsum prod square reciprocal""".split()
)
TENSOR_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "grad", "real", "imag"})
MODULE_METHODS = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "requires_grad_"})
DATA_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
WRAPPERS = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    }
)
TENSOR_TYPES = frozenset({"torch.Tensor", "torch.nn.Parameter", "torch.nn.parameter.Parameter"})


def is_module_class_name(qualified: str) -> bool:
    """`torch.nn.Linear`, `torchvision.models.resnet18`: constructors that build an nn.Module."""
    head, _, last = qualified.rpartition(".")
    if qualified in WRAPPERS or qualified.startswith("torchvision.models."):
        return True
    return head in ("torch.nn", "torch.nn.modules") and last[:1].isupper() and "Parameter" not in last


# A loop target's kind: one kind for every element, or a tuple of shapes (from `enumerate`/`zip`).
Shape = Union[Kind, Tuple["Shape", ...]]


@dataclass(eq=False)
class Binding:
    value: Optional[cst.BaseExpression] = None  # name = value
    kind: Optional[Kind] = None  # a fixed kind (annotation, import, def)
    augmented: bool = False  # name op= value: only a tensor operand changes what the name holds
    loop_iter: Optional[cst.BaseExpression] = None  # for ... in loop_iter
    loop_path: Tuple[int, ...] = ()
    parameter: Optional[Tuple[cst.FunctionDef, cst.Param]] = None  # inferred from call sites


@dataclass(eq=False)
class ClassModel:
    node: cst.ClassDef
    is_module: bool
    attributes: Dict[str, List[Tuple[Binding, "Scope"]]] = field(default_factory=dict)
    parameters: Set[str] = field(default_factory=set)  # attributes that hold an nn.Parameter


@dataclass(eq=False)
class Scope:
    parent: Optional["Scope"]
    function: Optional[cst.FunctionDef] = None
    owner: Optional[ClassModel] = None  # the class a method belongs to
    self_name: Optional[str] = None
    bindings: Dict[str, List[Binding]] = field(default_factory=dict)

    def bind(self, name: str, binding: Binding) -> None:
        self.bindings.setdefault(name, []).append(binding)


class Inference:
    """Scopes, bindings and class attributes of one file, and the kind of any expression in it."""

    @classmethod
    def of(cls, ctx: FileContext) -> "Inference":
        """The file's inference, built once and shared by every rule that needs it."""
        return ctx.memo("inference", lambda: cls(ctx))

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.module_scope = Scope(None)
        self.classes: Dict[str, ClassModel] = {}
        self.functions: Dict[str, List[Tuple[cst.FunctionDef, Scope]]] = {}
        self.statements: List[Tuple[cst.SimpleStatementLine, Scope]] = []
        self._scope_of_function: Dict[cst.FunctionDef, Scope] = {}
        self._call_sites: Optional[Dict[str, List[Tuple[cst.Call, Scope]]]] = None
        self._in_progress: Set[Tuple[int, str]] = set()
        self._walk(ctx.module.body, self.module_scope, None)

    # ----- building -------------------------------------------------------------------------------

    def _walk(self, body: Body, scope: Scope, class_model: Optional[ClassModel]) -> None:
        for statement in body:
            if isinstance(statement, cst.SimpleStatementLine):
                self.statements.append((statement, scope))
                for small in statement.body:
                    self._bind_small(small, scope)
            elif isinstance(statement, cst.FunctionDef):
                self._function(statement, scope, class_model)
            elif isinstance(statement, cst.ClassDef):
                self._class(statement, scope)
            elif isinstance(statement, cst.BaseCompoundStatement):
                self._bind_compound(statement, scope)
                for block in child_blocks(statement):
                    self._walk(block, scope, class_model)

    def _function(self, node: cst.FunctionDef, scope: Scope, class_model: Optional[ClassModel]) -> None:
        scope.bind(node.name.value, Binding(kind=Kind.OTHER))
        # Methods see the enclosing function or module, never the class body.
        parent = scope if class_model is None else (scope.parent or self.module_scope)
        inner = Scope(parent, function=node, owner=class_model)
        params = list(node.params.posonly_params) + list(node.params.params)
        if class_model is not None and params and not _is_static(node):
            inner.self_name = params[0].name.value
            inner.bind(inner.self_name, Binding(kind=Kind.MODULE if class_model.is_module else Kind.OTHER))
            params = params[1:]
        for param in params + list(node.params.kwonly_params):
            kind = self._annotation_kind(param.annotation)
            inner.bind(param.name.value, Binding(kind=kind) if kind else Binding(parameter=(node, param)))
        for star in (node.params.star_arg, node.params.star_kwarg):
            if isinstance(star, cst.Param):
                inner.bind(star.name.value, Binding(kind=Kind.OTHER))
        self._scope_of_function[node] = inner
        if class_model is None:
            self.functions.setdefault(node.name.value, []).append((node, inner))
        self._walk(block_body(node.body), inner, None)

    def _class(self, node: cst.ClassDef, scope: Scope) -> None:
        scope.bind(node.name.value, Binding(kind=Kind.OTHER))
        is_module = any(self._is_module_base(base.value) for base in node.bases)
        model = ClassModel(node, is_module)
        self.classes[node.name.value] = model
        self._walk(block_body(node.body), Scope(scope), model)

    def _is_module_base(self, base: cst.BaseExpression) -> bool:
        qualified = self.ctx.qualify(base)
        if qualified is not None:
            return is_module_class_name(qualified)
        local = self.classes.get(dotted(base) or "")
        return local is not None and local.is_module

    def _bind_small(self, small: cst.BaseSmallStatement, scope: Scope) -> None:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                self._bind_target(target.target, small.value, scope)
        elif isinstance(small, cst.AnnAssign):
            kind = self._annotation_kind(small.annotation)
            if isinstance(small.target, cst.Name):
                scope.bind(small.target.value, Binding(kind=kind) if kind else Binding(value=small.value))
            elif small.value is not None:
                self._bind_target(small.target, small.value, scope)
        elif isinstance(small, cst.AugAssign):
            if isinstance(small.target, cst.Name):
                scope.bind(small.target.value, Binding(value=small.value, augmented=True))
            else:
                self._bind_attribute(small.target, Binding(value=small.value, augmented=True), scope)
        elif isinstance(small, (cst.Import, cst.ImportFrom)):
            names = small.names if isinstance(small.names, Sequence) else ()
            for alias in names:
                local = alias.asname.name if alias.asname is not None else alias.name
                name = dotted(local) if isinstance(local, (cst.Name, cst.Attribute)) else None
                if name:
                    scope.bind(name.split(".")[0], Binding(kind=Kind.OTHER))
        elif isinstance(small, (cst.Global, cst.Nonlocal)):
            for item in small.names:
                scope.bind(item.name.value, Binding(kind=Kind.OTHER))
        elif isinstance(small, cst.Expr):
            self._bind_registration(small.value, scope)

    def _bind_registration(self, value: cst.BaseExpression, scope: Scope) -> None:
        """`self.register_buffer("name", tensor)` / `self.register_parameter("name", param)`."""
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and scope.owner is not None):
            return
        method = value.func.attr.value
        if method not in ("register_buffer", "register_parameter"):
            return
        if not (isinstance(value.func.value, cst.Name) and value.func.value.value == scope.self_name and value.args):
            return
        first = value.args[0].value
        if isinstance(first, cst.SimpleString) and first.evaluated_value:
            name = str(first.evaluated_value)
            scope.owner.attributes.setdefault(name, []).append((Binding(kind=Kind.TENSOR), scope))
            if method == "register_parameter":
                scope.owner.parameters.add(name)

    def _bind_target(self, target: cst.BaseExpression, value: Optional[cst.BaseExpression], scope: Scope) -> None:
        if isinstance(target, cst.Name):
            scope.bind(target.value, Binding(value=value))
        elif isinstance(target, (cst.Tuple, cst.List)):
            values = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
            for index, element in enumerate(target.elements):
                pair = None
                if values is not None and len(values) == len(target.elements) and not isinstance(element, cst.StarredElement):
                    pair = values[index].value
                if isinstance(element, cst.StarredElement) or pair is None:
                    self._bind_unknown(element.value, scope)
                else:
                    self._bind_target(element.value, pair, scope)
        elif isinstance(target, cst.Attribute):
            self._bind_attribute(target, Binding(value=value), scope)

    def _bind_attribute(self, target: cst.BaseExpression, binding: Binding, scope: Scope) -> None:
        if not (isinstance(target, cst.Attribute) and scope.owner is not None):
            return
        if isinstance(target.value, cst.Name) and target.value.value == scope.self_name:
            name = target.attr.value
            scope.owner.attributes.setdefault(name, []).append((binding, scope))
            if binding.value is not None and self._is_parameter_constructor(binding.value):
                scope.owner.parameters.add(name)

    def _is_parameter_constructor(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, cst.Call) and self.ctx.qualify(value.func) in (
            "torch.nn.Parameter",
            "torch.nn.parameter.Parameter",
        )

    def _bind_unknown(self, target: cst.BaseExpression, scope: Scope) -> None:
        if isinstance(target, cst.Name):
            scope.bind(target.value, Binding(kind=Kind.OTHER))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind_unknown(element.value, scope)
        elif isinstance(target, cst.Attribute):
            self._bind_attribute(target, Binding(kind=Kind.OTHER), scope)

    def _bind_compound(self, statement: cst.BaseCompoundStatement, scope: Scope) -> None:
        if isinstance(statement, cst.For):
            self._bind_loop(statement.target, statement.iter, scope, ())
        elif isinstance(statement, cst.With):
            for item in statement.items:
                if item.asname is not None:
                    self._bind_unknown(item.asname.name, scope)
        elif isinstance(statement, cst.Try):
            for handler in statement.handlers:
                if handler.name is not None:
                    self._bind_unknown(handler.name.name, scope)

    def _bind_loop(self, target: cst.BaseExpression, iterable: cst.BaseExpression, scope: Scope, path: Tuple[int, ...]) -> None:
        if isinstance(target, cst.Name):
            scope.bind(target.value, Binding(loop_iter=iterable, loop_path=path))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for index, element in enumerate(target.elements):
                if isinstance(element, cst.StarredElement):
                    self._bind_unknown(element.value, scope)
                else:
                    self._bind_loop(element.value, iterable, scope, path + (index,))
        else:
            self._bind_unknown(target, scope)

    def _annotation_kind(self, annotation: Optional[cst.Annotation]) -> Optional[Kind]:
        if annotation is None:
            return None
        expression = annotation.annotation
        if isinstance(expression, cst.SimpleString) and isinstance(expression.evaluated_value, str):
            try:  # a forward reference: `t: "torch.Tensor"`
                expression = cst.parse_expression(expression.evaluated_value)
            except cst.ParserSyntaxError:
                return Kind.OTHER
        qualified = self.ctx.qualify(expression)
        if qualified in TENSOR_TYPES:
            return Kind.TENSOR
        if qualified is not None and is_module_class_name(qualified):
            return Kind.MODULE
        return Kind.OTHER

    # ----- querying -------------------------------------------------------------------------------

    def kind(self, expr: cst.BaseExpression, scope: Scope) -> Kind:
        return self._kind(expr, scope) or Kind.OTHER

    def _kind(self, expr: cst.BaseExpression, scope: Scope) -> Optional[Kind]:
        if isinstance(expr, cst.Name):
            return self._name_kind(expr.value, scope)
        if isinstance(expr, cst.Attribute):
            return self._attribute_kind(expr, scope)
        if isinstance(expr, cst.Call):
            return self._call_kind(expr, scope)
        if isinstance(expr, cst.Subscript):
            return _tensor_if(self._kind(expr.value, scope))
        if isinstance(expr, cst.BinaryOperation):
            sides = (self._kind(expr.left, scope), self._kind(expr.right, scope))
            if Kind.TENSOR in sides and Kind.MODULE not in sides:
                return Kind.TENSOR
            return None if sides == (None, None) else Kind.OTHER
        if isinstance(expr, cst.UnaryOperation):
            return _tensor_if(self._kind(expr.expression, scope))
        if isinstance(expr, cst.IfExp):
            return join(self._kind(expr.body, scope), self._kind(expr.orelse, scope))
        return Kind.OTHER

    def _lookup(self, name: str, scope: Scope) -> Tuple[Optional[List[Binding]], Scope]:
        current: Optional[Scope] = scope
        while current is not None:
            if name in current.bindings:
                return current.bindings[name], current
            current = current.parent
        return None, scope

    def _name_kind(self, name: str, scope: Scope) -> Optional[Kind]:
        bindings, owner = self._lookup(name, scope)
        if bindings is None:
            return Kind.OTHER  # builtins, star imports, names from elsewhere
        key = (id(owner), name)
        if key in self._in_progress:
            return None
        self._in_progress.add(key)
        try:
            result: Optional[Kind] = None
            for binding in bindings:
                result = join(result, self._binding_kind(binding, owner))
                if result is Kind.OTHER:
                    break
            return result
        finally:
            self._in_progress.discard(key)

    def _binding_kind(self, binding: Binding, scope: Scope) -> Optional[Kind]:
        if binding.kind is not None:
            return binding.kind
        if binding.augmented:
            return Kind.TENSOR if self._kind(binding.value, scope) is Kind.TENSOR else None
        if binding.loop_iter is not None:
            return _at_path(self._element_shape(binding.loop_iter, scope), binding.loop_path)
        if binding.parameter is not None:
            return self._parameter_kind(*binding.parameter)
        if binding.value is None:
            return Kind.OTHER
        return self._kind(binding.value, scope)

    def _element_shape(self, iterable: cst.BaseExpression, scope: Scope) -> Shape:
        if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name) and iterable.args:
            builtin = iterable.func.value
            if self._lookup(builtin, scope)[0] is None and not any(arg.star for arg in iterable.args):
                if builtin == "enumerate":
                    return (Kind.OTHER, self._element_shape(iterable.args[0].value, scope))
                if builtin == "zip" and not any(arg.keyword for arg in iterable.args):
                    return tuple(self._element_shape(arg.value, scope) for arg in iterable.args)
        kind = self._kind(iterable, scope)
        return Kind.TENSOR if kind in (Kind.LOADER, Kind.TENSOR) else Kind.OTHER

    def _attribute_kind(self, expr: cst.Attribute, scope: Scope) -> Optional[Kind]:
        base = expr.value
        if isinstance(base, cst.Name) and scope.self_name is not None and base.value == scope.self_name:
            return self._self_attribute_kind(expr.attr.value, scope)
        return _tensor_if(self._kind(base, scope)) if expr.attr.value in TENSOR_ATTRIBUTES else Kind.OTHER

    def _self_attribute_kind(self, attr: str, scope: Scope) -> Optional[Kind]:
        model = scope.owner
        bindings = model.attributes.get(attr) if model is not None else None
        if not bindings:
            return Kind.OTHER  # inherited or set from outside: unknown
        key = (id(model), "self." + attr)
        if key in self._in_progress:
            return None
        self._in_progress.add(key)
        try:
            result: Optional[Kind] = None
            for binding, bound_in in bindings:
                result = join(result, self._binding_kind(binding, bound_in))
            return result
        finally:
            self._in_progress.discard(key)

    def wrapped_forwards(self) -> Iterator[Tuple[str, cst.FunctionDef, Scope, List[Wrap]]]:
        """Each `forward` of this file that runs under `nn.DataParallel`, with its scope and the wraps."""
        for class_name, model in self.classes.items():
            wraps = [
                wrap
                for wrap in self.ctx.project.wrapped.get(class_name, ())
                if wrap.class_name != class_name or wrap.can_mean(self.ctx.module_name, self.ctx.filename)
            ]
            if not wraps:
                continue
            for statement in block_body(model.node.body):
                if isinstance(statement, cst.FunctionDef) and statement.name.value == "forward":
                    yield class_name, statement, self._scope_of_function[statement], wraps

    @staticmethod
    def self_attribute_is_parameter(attr: str, scope: Scope) -> bool:
        return scope.owner is not None and attr in scope.owner.parameters

    def _call_kind(self, call: cst.Call, scope: Scope) -> Optional[Kind]:
        func = call.func
        qualified = self.ctx.qualify(func)
        if qualified is not None:
            module, _, last = qualified.rpartition(".")
            if module == "torch" and last in TENSOR_FACTORIES:
                return Kind.TENSOR
            if module == "torch.nn.functional" and last in TENSOR_RETURNING_FUNCTIONAL:
                return Kind.TENSOR
            if qualified in TENSOR_TYPES:
                return Kind.TENSOR
            if qualified in DATA_LOADERS:
                return Kind.OTHER if any(_keyword(arg) == "collate_fn" for arg in call.args) else Kind.LOADER
            if is_module_class_name(qualified):
                return Kind.MODULE
            return Kind.OTHER
        if isinstance(func, cst.Attribute):
            receiver = self._kind(func.value, scope)
            method = func.attr.value
            if receiver is Kind.TENSOR and method in TENSOR_METHODS:
                return Kind.TENSOR
            if receiver is Kind.MODULE and method in MODULE_METHODS:
                return Kind.MODULE
            return None if receiver is None else Kind.OTHER
        if isinstance(func, cst.Name):
            model = self.classes.get(func.value)
            if model is not None and self._lookup(func.value, scope)[1] is self.module_scope:
                return Kind.MODULE if model.is_module else Kind.OTHER
            for function, _ in self.functions.get(func.value, ()):
                returns = function.returns
                if returns is not None and self.ctx.qualify(returns.annotation) in TENSOR_TYPES:
                    return Kind.TENSOR
        return Kind.OTHER

    def _parameter_kind(self, function: cst.FunctionDef, param: cst.Param) -> Optional[Kind]:
        """An unannotated parameter holds what the calls in this file pass to it."""
        sites = self._calls_by_name().get(function.name.value, [])
        if not sites or function not in {f for f, _ in self.functions.get(function.name.value, ())}:
            return Kind.OTHER
        positional = list(function.params.posonly_params) + list(function.params.params)
        index = next((i for i, p in enumerate(positional) if p is param), None)
        result: Optional[Kind] = None
        for call, caller_scope in sites:
            if any(arg.star for arg in call.args):
                return Kind.OTHER
            argument = _argument_for(call, param.name.value, index)
            if argument is None:
                if param.default is None:
                    return Kind.OTHER
                argument = param.default
            result = join(result, self._kind(argument, caller_scope))
            if result is Kind.OTHER:
                break
        return result

    def _calls_by_name(self) -> Dict[str, List[Tuple[cst.Call, Scope]]]:
        if self._call_sites is None:
            collector = _CallCollector(set(self.functions), self._scope_of_function, self.module_scope)
            self.ctx.module.visit(collector)
            self._call_sites = collector.sites
        return self._call_sites


def _is_static(node: cst.FunctionDef) -> bool:
    return any(dotted(decorator.decorator) == "staticmethod" for decorator in node.decorators)


def _keyword(arg: cst.Arg) -> Optional[str]:
    return arg.keyword.value if arg.keyword is not None else None


def _tensor_if(kind: Optional[Kind]) -> Optional[Kind]:
    """Indexing, negating or `.T` of a tensor is a tensor; of anything else, unknown."""
    return kind if kind in (None, Kind.TENSOR) else Kind.OTHER


def _argument_for(call: cst.Call, name: str, index: Optional[int]) -> Optional[cst.BaseExpression]:
    positional = [arg for arg in call.args if arg.keyword is None]
    if index is not None and index < len(positional):
        return positional[index].value
    for arg in call.args:
        if _keyword(arg) == name:
            return arg.value
    return None


def _at_path(shape: Shape, path: Tuple[int, ...]) -> Kind:
    for index in path:
        if isinstance(shape, Kind):
            return shape
        if index >= len(shape):
            return Kind.OTHER
        shape = shape[index]
    return shape if isinstance(shape, Kind) else Kind.OTHER


class _CallCollector(cst.CSTVisitor):
    """Calls of the file's own functions by plain name, each with the scope it is made in."""

    def __init__(self, names: Set[str], scopes: Dict[cst.FunctionDef, Scope], module_scope: Scope) -> None:
        self.names = names
        self.scopes = scopes
        self.stack = [module_scope]
        self.sites: Dict[str, List[Tuple[cst.Call, Scope]]] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.append(self.scopes.get(node, self.stack[-1]))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value in self.names:
            self.sites.setdefault(node.func.value, []).append((node, self.stack[-1]))


# torch.nn.functional losses whose default reduction ("mean") returns a 0-dim tensor.
FUNCTIONAL_LOSSES = frozenset({"cross_entropy", "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits"})
REDUCTIONS = frozenset({"mean", "sum"})


class ScalarLosses:
    """Why an expression in `forward` is a 0-dim tensor, if it is one."""

    def __init__(self, ctx: FileContext, scope: Scope, model: Optional[ClassModel] = None) -> None:
        self.ctx = ctx
        self.model = model
        self.scope = scope

    def reason(self, expr: cst.BaseExpression, depth: int = 0) -> Optional[str]:
        if depth > 6:
            return None
        if isinstance(expr, cst.Name):
            bindings = self.scope.bindings.get(expr.value, [])
            reasons = [self.reason(b.value, depth + 1) if b.value is not None and not b.augmented else None for b in bindings]
            return reasons[0] if reasons and all(reasons) else None
        if isinstance(expr, cst.BinaryOperation):
            left, right = self.reason(expr.left, depth + 1), self.reason(expr.right, depth + 1)
            if left and right:
                return left
            other = expr.right if left else expr.left
            return (left or right) if isinstance(other, (cst.Integer, cst.Float)) else None
        if isinstance(expr, cst.UnaryOperation):
            return self.reason(expr.expression, depth + 1)
        if isinstance(expr, cst.Call):
            return self._call(expr)
        return None

    def _call(self, call: cst.Call) -> Optional[str]:
        reduction = _reduction(call)
        qualified = self.ctx.qualify(call.func)
        if qualified is not None:
            module, _, name = qualified.rpartition(".")
            if module == "torch.nn.functional" and (name.endswith("_loss") or name in FUNCTIONAL_LOSSES):
                return f"`F.{name}` with reduction={reduction!r}" if reduction in REDUCTIONS else None
            if module == "torch" and name in REDUCTIONS and _reduces_everything(call, first_is_input=True):
                return f"`torch.{name}` without `dim`"
            return None
        func = call.func
        if isinstance(func, cst.Name):  # `criterion(outputs, labels)` with `criterion = nn.CrossEntropyLoss()`
            return self._criterion(self.scope.bindings.get(func.value, []))
        if not isinstance(func, cst.Attribute):
            return None
        if func.attr.value in REDUCTIONS and _reduces_everything(call, first_is_input=False):
            return f"`.{func.attr.value}()` without `dim`"
        if isinstance(func.value, cst.Name) and func.value.value == self.scope.self_name and self.model is not None:
            return self._criterion([binding for binding, _ in self.model.attributes.get(func.attr.value, [])])
        return None

    def _criterion(self, bindings: List[Binding]) -> Optional[str]:
        """A call of a criterion built as `nn.SomeLoss()` with a reducing `reduction`."""
        values = [binding.value for binding in bindings]
        if not values or not all(isinstance(v, cst.Call) for v in values):
            return None
        names = [self.ctx.qualify(v.func) or "" for v in values]  # type: ignore[union-attr]
        if not all(n.startswith("torch.nn.") and n.endswith("Loss") for n in names):
            return None
        if not all(_reduction(v) in REDUCTIONS for v in values):  # type: ignore[arg-type]
            return None
        return f"`{names[0].rpartition('.')[2]}` with reduction={_reduction(values[0])!r}"  # type: ignore[arg-type]


def _reduction(call: cst.Call) -> Optional[str]:
    """The call's `reduction=` as a string ("mean" when absent); None when it is not a literal."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "reduction":
            value = arg.value.evaluated_value if isinstance(arg.value, cst.SimpleString) else None
            return value if isinstance(value, str) else None
    return "mean"


def _reduces_everything(call: cst.Call, first_is_input: bool) -> bool:
    """`x.sum()`, `torch.mean(x)`: no `dim`, positional or keyword."""
    positional = [arg for arg in call.args if arg.keyword is None]
    allowed = 1 if first_is_input else 0
    return len(positional) <= allowed and not any(arg.star for arg in call.args) and not any(
        arg.keyword is not None and arg.keyword.value in ("dim", "axis") for arg in call.args
    )
