"""What kind of value an expression holds: a Tensor, a container of tensors, an nn.Module, a DataLoader, or unknown.

The inference is deliberately conservative: rules that must never cry wolf (DPL101) act only on a
definite TENSOR. A local name's kind is read where it is used: the join of the bindings that reach
that point along the function's control flow (reaching definitions; branches joined where they meet,
loops iterated to a fixed point, `try`/`with`/`match` handled, nothing reaching the code after
`return`, `raise`, `break`, `continue` or `sys.exit()`). A name of an enclosing scope joins all of its
bindings, since the function may run after any of them.

Evidence used: the `torch`, `torch.nn.functional` and `Tensor` API whose stubs return tensors (the
table `tensor_api.py`, generated from torch's stubs), `nn.Parameter` and `Variable`, module
constructors from `torch.nn`/`torchvision` and classes of the file that subclass `nn.Module`,
`self.<attr>` bound in the class's methods or returned by its `@property` (registered buffers and
parameters are tensors), annotations, arithmetic, comparisons and tensor methods on tensors, methods
only tensors have on any receiver (`TENSOR_ONLY_METHODS`), the values of a `return_tensors="pt"`
call, loops over a DataLoader, a tensor, a container of tensors or a module's
parameters, unpacking and indexing of those, lists/tuples/dicts built only from tensors (and given
nothing else later), what the file's own functions and methods return (every reachable `return` a
tensor), the project's functions and module-level names shown to be tensors (`ProjectFacts.is_tensor`),
and for an unannotated parameter of a function (or of a class's `__init__`) the arguments of every
call of it: those of this file read here, those of other files as the project's facts record them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.ddp import prepared_arguments
from dplint.analysis.execution import DATA_LOADERS
from dplint.analysis import tensor_api
from dplint.analysis.torch_api import ATTRIBUTE_WRAPPERS, TENSOR_TYPES, call_returns_tensor
from dplint.analysis.facts import ProjectCall, Wrap
from dplint.analysis.names import Body, assigned_parts, block_body, child_blocks, child_nodes, descendants, dotted, iter_calls, run_visitor


class Kind(enum.Enum):
    TENSOR = "tensor"
    TENSOR_LIST = "tensor list"  # a list or tuple whose every element is a tensor
    TENSOR_DICT = "tensor dict"  # a dict whose every value is a tensor
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


# Tensor methods whose name alone shows a tensor, whatever the receiver was inferred to be: torch's
# tensor-returning methods that no common non-tensor type defines with other semantics. Left out on
# purpose: `to`/`cuda`/`cpu`/`float`/`half`/`double`/`requires_grad_` (nn.Module, in place), `clone`/
# `contiguous`/`pin_memory` (PyG's `Data`, in place), `long`/`int` (DGL graphs), `view`/`reshape`/
# `transpose`/`squeeze`/`flatten`/`repeat` and the reductions (numpy), `div`/`mul`/`eq`/`clip`/`round`
# (pandas), `permute`/`expand` (tensordict). `detach` is kept: PyG's `Data.detach()` exists, but a move
# chained on it is not written in practice, while `loss.detach().cpu()` is everywhere.
TENSOR_ONLY_METHODS = frozenset(
    """detach unsqueeze unsqueeze_ masked_fill masked_fill_ type_as view_as expand_as reshape_as index_select
    new_zeros new_ones new_full new_empty new_tensor""".split()
)
MODULE_METHODS = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "requires_grad_"})



def is_module_class_name(qualified: str) -> bool:
    """`torch.nn.Linear`, `torchvision.models.resnet18`: constructors that build an nn.Module."""
    head, _, last = qualified.rpartition(".")
    if qualified in ATTRIBUTE_WRAPPERS or qualified.startswith("torchvision.models."):
        return True
    return head in ("torch.nn", "torch.nn.modules") and last[:1].isupper() and "Parameter" not in last


# A loop target's or an unpacked value's kind: one kind for every element, or a tuple of shapes.
Shape = Union[Kind, Tuple["Shape", ...]]

ELEMENTWISE_COMPARISONS = (cst.LessThan, cst.GreaterThan, cst.LessThanEqual, cst.GreaterThanEqual, cst.Equal, cst.NotEqual)

# Container methods that add one element (the argument at that index) or all elements of the argument.
ELEMENT_ADDERS = {"append": 0, "add": 0, "insert": 1, "setdefault": 1}
CONTAINER_ADDERS = frozenset({"extend", "update"})
# Calls that end the program: the code after them is unreachable.
EXITS = frozenset({"sys.exit", "os._exit"})
# Decorators that keep what the function returns (a property's getter: when the attribute is read).
TRANSPARENT_DECORATORS = frozenset({"property", "staticmethod", "classmethod", "no_grad", "inference_mode", "enable_grad", "lru_cache", "cache"})
# Decorators that call the function with the arguments it was given.
ARGUMENT_KEEPING_DECORATORS = frozenset({"no_grad", "inference_mode", "enable_grad", "lru_cache", "cache"})


@dataclass(eq=False)
class Binding:
    value: Optional[cst.BaseExpression] = None  # name = value
    kind: Optional[Kind] = None  # a fixed kind (annotation, import, def)
    augmented: bool = False  # name op= value: only a tensor operand changes what the name holds
    loop_iter: Optional[cst.BaseExpression] = None  # for ... in loop_iter
    loop_path: Tuple[int, ...] = ()  # the position in the loop target, or in the unpacked value
    unpacked: Optional[cst.BaseExpression] = None  # ..., name, ... = unpacked
    adds_element: bool = False  # container[key] = value, container.append(value): one more element
    adds_elements: bool = False  # container.extend(value), container.update(value)
    imported: Optional[str] = None  # from module import name: the qualified name
    parameter: Optional[Tuple[cst.FunctionDef, cst.Param]] = None  # inferred from call sites

    @property
    def keeps_previous(self) -> bool:
        """Whether the name may still hold what it held before (the binding changes it in place)."""
        return self.augmented or self.adds_element or self.adds_elements


# What a scope's own names may hold at a program point: the bindings that reach it.
Env = Dict[str, FrozenSet[Binding]]
Definitions = List[Tuple[str, Binding]]


@dataclass(eq=False)
class ClassModel:
    node: cst.ClassDef
    is_module: bool
    attributes: Dict[str, List[Tuple[Binding, "Scope"]]] = field(default_factory=dict)
    parameters: Set[str] = field(default_factory=set)  # attributes that hold an nn.Parameter
    methods: Dict[str, Tuple[cst.FunctionDef, "Scope"]] = field(default_factory=dict)


@dataclass(eq=False)
class Scope:
    parent: Optional["Scope"]
    function: Optional[cst.FunctionDef] = None
    owner: Optional[ClassModel] = None  # the class a method belongs to
    self_name: Optional[str] = None
    bindings: Dict[str, List[Binding]] = field(default_factory=dict)  # every binding, in source order
    body: Body = ()
    entry: Definitions = field(default_factory=list)  # the parameters
    returns: List[cst.Return] = field(default_factory=list)
    generator: bool = False
    # Filled by the flow analysis, on first need: the ids of the reachable statements, the bindings
    # that reach each name read in them (by the Name's id), and what reaches the end of the body (None
    # when the end is unreachable).
    reached: Optional[Set[int]] = None
    name_reaching: Optional[Dict[int, FrozenSet[Binding]]] = None
    exit: Optional[Env] = None

    def bind(self, name: str, binding: Binding) -> None:
        self.bindings.setdefault(name, []).append(binding)


class Inference:
    """Scopes, bindings and class attributes of one file, and the kind of any expression in it.

    Two passes: the first walks the tree once, recording every binding and which statement makes it;
    the second, run per scope on first need, flows the bindings along the scope's control flow.
    """

    @classmethod
    def of(cls, ctx: FileContext) -> "Inference":
        """The file's inference, built once and shared by every rule that needs it."""
        return ctx.memo("inference", lambda: cls(ctx))

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.module_scope = Scope(None, body=ctx.module.body)
        self.classes: Dict[str, ClassModel] = {}
        self.functions: Dict[str, List[Tuple[cst.FunctionDef, Scope]]] = {}
        self.statements: List[Tuple[cst.SimpleStatementLine, Scope]] = []
        self._scope_of_function: Dict[cst.FunctionDef, Scope] = {}
        self._calls: Optional[_CallCollector] = None
        self._class_scopes: Dict[cst.ClassDef, Scope] = {}
        self._statement_scopes: Optional[Dict[int, Scope]] = None
        self._in_progress: Set[Tuple[int, str]] = set()
        self._definitions: Dict[int, Definitions] = {}  # statement → the bindings it makes
        self._reads: Dict[int, List[cst.Name]] = {}  # statement → the names it reads where it stands
        self._sink: Definitions = []
        self._comprehension_names: Dict[str, Shape] = {}  # while the element of a comprehension is inferred
        self._walk(ctx.module.body, self.module_scope, None)

    # ----- building -------------------------------------------------------------------------------

    def _defines(self, node: cst.CSTNode) -> None:
        """The bindings made from now on are made by `node`."""
        self._sink = self._definitions.setdefault(id(node), [])

    def _bind(self, scope: Scope, name: str, binding: Binding, *, listed: bool = True) -> None:
        """Bind a name; `listed=False` for in-place changes that only the flow analysis sees."""
        if listed:
            scope.bind(name, binding)
        self._sink.append((name, binding))

    def _walk(self, body: Body, scope: Scope, class_model: Optional[ClassModel]) -> None:
        if body and isinstance(body[0], cst.BaseSmallStatement):  # a one-line suite: `if c: x = f(); y = g()`
            body = [cst.SimpleStatementLine(body=tuple(body))]
        for statement in body:
            if isinstance(statement, cst.SimpleStatementLine):
                self.statements.append((statement, scope))
                for small in statement.body:
                    self._defines(small)
                    self._bind_small(small, scope)
            elif isinstance(statement, cst.FunctionDef):
                self._defines(statement)
                self._function(statement, scope, class_model)
            elif isinstance(statement, cst.ClassDef):
                self._defines(statement)
                self._class(statement, scope)
            elif isinstance(statement, cst.BaseCompoundStatement):
                self._defines(statement)
                self._bind_compound(statement, scope)
                for block in child_blocks(statement):
                    self._walk(block, scope, class_model)

    def _function(self, node: cst.FunctionDef, scope: Scope, class_model: Optional[ClassModel]) -> None:
        self._bind(scope, node.name.value, Binding(kind=Kind.OTHER))
        # Methods see the enclosing function or module, never the class body.
        parent = scope if class_model is None else (scope.parent or self.module_scope)
        inner = Scope(parent, function=node, owner=class_model, body=block_body(node.body))
        self._sink = inner.entry
        params = list(node.params.posonly_params) + list(node.params.params)
        if class_model is not None and params and not _is_static(node):
            inner.self_name = params[0].name.value
            self._bind(inner, inner.self_name, Binding(kind=Kind.MODULE if class_model.is_module else Kind.OTHER))
            params = params[1:]
        for param in params + list(node.params.kwonly_params):
            kind = self._annotation_kind(param.annotation)
            self._bind(inner, param.name.value, Binding(kind=kind) if kind else Binding(parameter=(node, param)))
        for star in (node.params.star_arg, node.params.star_kwarg):
            if isinstance(star, cst.Param):
                self._bind(inner, star.name.value, Binding(kind=Kind.OTHER))
        self._scope_of_function[node] = inner
        if class_model is None:
            self.functions.setdefault(node.name.value, []).append((node, inner))
        else:
            class_model.methods[node.name.value] = (node, inner)
        self._walk(block_body(node.body), inner, None)

    def _class(self, node: cst.ClassDef, scope: Scope) -> None:
        self._bind(scope, node.name.value, Binding(kind=Kind.OTHER))
        is_module = any(self._is_module_base(base.value) for base in node.bases)
        model = ClassModel(node, is_module)
        self.classes[node.name.value] = model
        self._class_scopes[node] = scope
        self._walk(block_body(node.body), Scope(scope, body=block_body(node.body)), model)

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
            self._note_yield(small.value, scope)
        elif isinstance(small, cst.AnnAssign):
            kind = self._annotation_kind(small.annotation)
            if isinstance(small.target, cst.Name):
                self._bind(scope, small.target.value, Binding(kind=kind) if kind else Binding(value=small.value))
            elif small.value is not None:
                self._bind_target(small.target, small.value, scope)
        elif isinstance(small, cst.AugAssign):
            if isinstance(small.target, cst.Name):
                self._bind(scope, small.target.value, Binding(value=small.value, augmented=True))
            else:
                self._bind_attribute(small.target, Binding(value=small.value, augmented=True), scope)
        elif isinstance(small, cst.Import):
            for alias in small.names:
                local = alias.asname.name if alias.asname is not None else alias.name
                name = dotted(local) if isinstance(local, (cst.Name, cst.Attribute)) else None
                if name:
                    self._bind(scope, name.split(".")[0], Binding(kind=Kind.OTHER))
        elif isinstance(small, cst.ImportFrom):
            names = small.names if isinstance(small.names, Sequence) else ()
            for alias in names:
                local = alias.asname.name if alias.asname is not None else alias.name
                if isinstance(local, cst.Name):
                    self._bind(scope, local.value, Binding(imported=self.ctx.imports.imported(local.value)))
        elif isinstance(small, (cst.Global, cst.Nonlocal)):
            for item in small.names:
                self._bind(scope, item.name.value, Binding(kind=Kind.OTHER))
        elif isinstance(small, cst.Expr):
            self._bind_registration(small.value, scope)
            self._bind_container_call(small.value, scope)
            self._note_yield(small.value, scope)
        elif isinstance(small, cst.Return):
            scope.returns.append(small)

    @staticmethod
    def _note_yield(value: Optional[cst.BaseExpression], scope: Scope) -> None:
        if isinstance(value, cst.Yield):
            scope.generator = True

    def _bind_container_call(self, value: cst.BaseExpression, scope: Scope) -> None:
        """`items.append(x)`, `items.extend(xs)`: the local container `items` gains elements."""
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
            return
        receiver, method = value.func.value, value.func.attr.value
        if not (isinstance(receiver, cst.Name) and receiver.value in scope.bindings):
            return
        positional = [arg.value for arg in value.args if arg.keyword is None and not arg.star]
        if method in ELEMENT_ADDERS:
            index = ELEMENT_ADDERS[method]
            element = positional[index] if index < len(positional) else None
            binding = Binding(value=element, adds_element=True)
        elif method in CONTAINER_ADDERS:
            binding = Binding(value=positional[0] if len(positional) == 1 else None, adds_elements=True)
        else:
            return
        self._bind(scope, receiver.value, binding, listed=False)

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

    def _bind_target(self, target: cst.BaseExpression, value: Optional[cst.BaseExpression], scope: Scope, path: Tuple[int, ...] = ()) -> None:
        """Bind `target = value`; `path` is the target's position inside `value` when that is unpacked."""
        if isinstance(target, cst.Name):
            self._bind(scope, target.value, Binding(unpacked=value, loop_path=path) if path else Binding(value=value))
        elif isinstance(target, (cst.Tuple, cst.List)):
            values = value.elements if isinstance(value, (cst.Tuple, cst.List)) and not path else None
            if values is not None and (len(values) != len(target.elements) or any(isinstance(v, cst.StarredElement) for v in values)):
                values = None
            for index, element in enumerate(target.elements):
                if isinstance(element, cst.StarredElement):
                    self._bind_unknown(element.value, scope)
                elif values is not None:
                    self._bind_target(element.value, values[index].value, scope)
                elif value is None:
                    self._bind_unknown(element.value, scope)
                else:
                    self._bind_target(element.value, value, scope, path + (index,))
        elif isinstance(target, cst.Attribute):
            self._bind_attribute(target, Binding(unpacked=value, loop_path=path) if path else Binding(value=value), scope)
        elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and target.value.value in scope.bindings:
            binding = Binding(unpacked=value, loop_path=path) if path else Binding(value=value)
            binding.adds_element = True
            self._bind(scope, target.value.value, binding, listed=False)

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
            self._bind(scope, target.value, Binding(kind=Kind.OTHER))
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
        elif isinstance(statement, cst.Try) or isinstance(statement, getattr(cst, "TryStar", ())):
            for handler in statement.handlers:
                if handler.name is not None:
                    self._defines(handler)
                    self._bind_unknown(handler.name.name, scope)

    def _bind_loop(self, target: cst.BaseExpression, iterable: cst.BaseExpression, scope: Scope, path: Tuple[int, ...]) -> None:
        if isinstance(target, cst.Name):
            self._bind(scope, target.value, Binding(loop_iter=iterable, loop_path=path))
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

    # ----- control flow ---------------------------------------------------------------------------

    def scope_of(self, small: cst.BaseSmallStatement) -> Optional[Scope]:
        """The scope a small statement runs in."""
        if self._statement_scopes is None:
            self._statement_scopes = {id(each): scope for line, scope in self.statements for each in line.body}
        return self._statement_scopes.get(id(small))

    def reaching_bindings(self, name: cst.Name, scope: Scope) -> Optional[FrozenSet[Binding]]:
        """The bindings of `name` that reach this read of it, when it is the scope's own name (None: a
        name of an enclosing scope or of no scope, or a read the flow never reaches)."""
        bindings, owner = self._lookup(name.value, scope)
        if bindings is None or owner is not scope:
            return None
        return self._reaching(name, scope)

    def reachable(self, node: cst.CSTNode, scope: Scope) -> bool:
        """Whether a statement of `scope` (a small statement or a compound one) can run at all."""
        return id(node) in self._flowed(scope)

    def _flowed(self, scope: Scope) -> Set[int]:
        if scope.reached is None:
            flow = _Flow(self, scope)
            entry = flow.apply(scope.entry, {})
            scope.exit = flow.block(scope.body, entry)
            scope.reached, scope.name_reaching = flow.reached, flow.read
        return scope.reached

    def _reaching(self, name: cst.Name, scope: Scope) -> Optional[FrozenSet[Binding]]:
        """The bindings of the scope's own `name` that reach this read of it (None: not a read seen by the flow)."""
        self._flowed(scope)
        return scope.name_reaching.get(id(name))  # type: ignore[union-attr]

    def reads(self, statement: cst.CSTNode) -> List[cst.Name]:
        """The names a statement reads where it stands; kept, as a loop's body is flowed more than once."""
        reads = self._reads.get(id(statement))
        if reads is None:
            reads = self._reads[id(statement)] = [read for part in _evaluated_parts(statement) for read in _name_reads(part)]
        return reads

    def exits_program(self, small: cst.BaseSmallStatement, scope: Scope) -> bool:
        """`sys.exit(...)`, `exit()`: nothing after it runs."""
        call = small.value if isinstance(small, cst.Expr) else None
        if not isinstance(call, cst.Call):
            return False
        if isinstance(call.func, cst.Name) and call.func.value in ("exit", "quit"):
            return self._lookup(call.func.value, scope)[0] is None
        return self.ctx.qualify(call.func) in EXITS

    # ----- querying -------------------------------------------------------------------------------

    def kind(self, expr: cst.BaseExpression, scope: Scope) -> Kind:
        """What `expr` holds where it is written (it must lie in a statement of `scope`)."""
        return self._kind(expr, scope) or Kind.OTHER

    def _kind(self, expr: cst.BaseExpression, scope: Scope) -> Optional[Kind]:
        if isinstance(expr, cst.Name):
            return self._name_kind(expr, scope)
        if isinstance(expr, cst.Attribute):
            return self._attribute_kind(expr, scope)
        if isinstance(expr, cst.Call):
            return self._call_kind(expr, scope)
        if isinstance(expr, cst.Subscript):
            return self._subscript_kind(expr, scope)
        if isinstance(expr, cst.BinaryOperation):
            sides = (self._kind(expr.left, scope), self._kind(expr.right, scope))
            if Kind.TENSOR in sides and all(side in (None, Kind.TENSOR, Kind.OTHER) for side in sides):
                return Kind.TENSOR
            return None if sides == (None, None) else Kind.OTHER
        if isinstance(expr, cst.Comparison):
            return self._comparison_kind(expr, scope)
        if isinstance(expr, cst.UnaryOperation):
            if isinstance(expr.operator, cst.Not):
                return Kind.OTHER
            return _tensor_if(self._kind(expr.expression, scope))
        if isinstance(expr, cst.IfExp):
            return join(self._kind(expr.body, scope), self._kind(expr.orelse, scope))
        if isinstance(expr, (cst.Tuple, cst.List)):
            if any(isinstance(element, cst.StarredElement) for element in expr.elements):
                return Kind.OTHER
            return _all_tensors([self._kind(element.value, scope) for element in expr.elements], Kind.TENSOR_LIST)
        if isinstance(expr, cst.Dict):
            if not all(isinstance(element, cst.DictElement) for element in expr.elements):
                return Kind.OTHER
            return _all_tensors([self._kind(element.value, scope) for element in expr.elements], Kind.TENSOR_DICT)
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp)):
            return _all_tensors([self._comprehension_kind(expr, expr.elt, scope)], Kind.TENSOR_LIST)
        if isinstance(expr, cst.DictComp):
            return _all_tensors([self._comprehension_kind(expr, expr.value, scope)], Kind.TENSOR_DICT)
        return Kind.OTHER

    def _comparison_kind(self, expr: cst.Comparison, scope: Scope) -> Optional[Kind]:
        """`mask = scores > threshold` on a tensor is an elementwise tensor; `is`, `in` and a chain
        (`a < x < b` means `(a < x) and (x < b)`) give a bool, and `tensor == None` gives False."""
        if len(expr.comparisons) != 1:
            return Kind.OTHER
        target = expr.comparisons[0]
        if not isinstance(target.operator, ELEMENTWISE_COMPARISONS):
            return Kind.OTHER
        if any(isinstance(side, cst.Name) and side.value == "None" for side in (expr.left, target.comparator)):
            return Kind.OTHER
        sides = (self._kind(expr.left, scope), self._kind(target.comparator, scope))
        if Kind.TENSOR in sides and all(side in (None, Kind.TENSOR, Kind.OTHER) for side in sides):
            return Kind.TENSOR
        return None if sides == (None, None) else Kind.OTHER

    def _subscript_kind(self, expr: cst.Subscript, scope: Scope) -> Optional[Kind]:
        base = self._kind(expr.value, scope)
        if base is Kind.TENSOR_LIST and any(isinstance(element.slice, cst.Slice) for element in expr.slice):
            return Kind.TENSOR_LIST
        if base is Kind.TENSOR_DICT and any(isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Integer) for e in expr.slice):
            return Kind.OTHER  # `encoding[0]` of a BatchEncoding is the first text's `Encoding`
        if base in (Kind.TENSOR_LIST, Kind.TENSOR_DICT):
            return Kind.TENSOR
        return _tensor_if(base)

    def _comprehension_kind(self, comprehension: cst.BaseComp, element: cst.BaseExpression, scope: Scope) -> Optional[Kind]:
        """The kind of a comprehension's element, its loop variables bound to what they iterate over."""
        saved = self._comprehension_names
        names = dict(saved)
        try:
            clause: Optional[cst.CompFor] = comprehension.for_in
            while clause is not None:
                shape = self._element_shape(clause.iter, scope)
                self._comprehension_names = names
                _bind_shape(clause.target, shape, names)
                clause = clause.inner_for_in
            return self._kind(element, scope)
        finally:
            self._comprehension_names = saved

    def _lookup(self, name: str, scope: Scope) -> Tuple[Optional[List[Binding]], Scope]:
        current: Optional[Scope] = scope
        while current is not None:
            if name in current.bindings:
                return current.bindings[name], current
            current = current.parent
        return None, scope

    def _name_kind(self, node: cst.Name, scope: Scope) -> Optional[Kind]:
        name = node.value
        if name in self._comprehension_names:
            return _at_path(self._comprehension_names[name], ())
        bindings, owner = self._lookup(name, scope)
        if bindings is None:
            return Kind.OTHER  # builtins, star imports, names from elsewhere
        # A name of an enclosing scope is read when the function runs, after any of its bindings.
        reaching = self._reaching(node, owner) if owner is scope else None
        if reaching is not None and not reaching:
            return Kind.OTHER  # not bound on any path to this read
        key = (id(owner), name, reaching)
        if key in self._in_progress:
            return None
        self._in_progress.add(key)
        try:
            return self._join_bindings(bindings if reaching is None else reaching, owner)
        finally:
            self._in_progress.discard(key)

    def _join_bindings(self, bindings: Iterable[Binding], scope: Scope) -> Optional[Kind]:
        """What a name holds after any of these bindings; in-place changes only spoil what they change."""
        result: Optional[Kind] = None
        changes: List[Binding] = []
        for binding in bindings:
            if binding.adds_element or binding.adds_elements:
                changes.append(binding)
                continue
            result = join(result, self._binding_kind(binding, scope))
            if result is Kind.OTHER:
                return result
        if result in (Kind.TENSOR_LIST, Kind.TENSOR_DICT):
            for change in changes:
                added = self._binding_kind(change, scope)
                expected = Kind.TENSOR if change.adds_element else result
                if added not in (None, expected):
                    return Kind.OTHER
        return result

    def _binding_kind(self, binding: Binding, scope: Scope) -> Optional[Kind]:
        saved, self._comprehension_names = self._comprehension_names, {}
        try:
            return self._bound_kind(binding, scope)
        finally:
            self._comprehension_names = saved

    def _bound_kind(self, binding: Binding, scope: Scope) -> Optional[Kind]:
        if binding.kind is not None:
            return binding.kind
        if binding.augmented:
            return Kind.TENSOR if self._kind(binding.value, scope) is Kind.TENSOR else None
        if binding.loop_iter is not None:
            return _at_path(self._element_shape(binding.loop_iter, scope), binding.loop_path)
        if binding.unpacked is not None:
            handed = self._handed_back(binding.unpacked)
            if handed is not None and len(binding.loop_path) == 1:
                return self._prepared_kind(handed, binding.loop_path[0], scope)
            return _at_path(self._element_shape(binding.unpacked, scope, unpacking=True), binding.loop_path)
        if binding.parameter is not None:
            return self._parameter_kind(*binding.parameter)
        if binding.imported is not None:
            return Kind.TENSOR if self.ctx.project.is_tensor(binding.imported) else Kind.OTHER
        if binding.value is None:
            return Kind.OTHER
        return self._kind(binding.value, scope)

    def _element_shape(self, iterable: cst.BaseExpression, scope: Scope, unpacking: bool = False) -> Shape:
        """What iterating over `iterable` (or unpacking it) yields."""
        if not unpacking and isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name) and iterable.args:
            builtin = iterable.func.value
            if self._lookup(builtin, scope)[0] is None and not any(arg.star for arg in iterable.args):
                if builtin == "enumerate":
                    return (Kind.OTHER, self._element_shape(iterable.args[0].value, scope))
                if builtin == "zip" and not any(arg.keyword for arg in iterable.args):
                    return tuple(self._element_shape(arg.value, scope) for arg in iterable.args)
        if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute) and not iterable.args:
            method, receiver = iterable.func.attr.value, self._kind(iterable.func.value, scope)
            if receiver is Kind.TENSOR_DICT and method in ("values", "items"):
                return Kind.TENSOR if method == "values" else (Kind.OTHER, Kind.TENSOR)
            if receiver is Kind.MODULE and method in ("parameters", "buffers"):
                return Kind.TENSOR
            if receiver is Kind.MODULE and method in ("named_parameters", "named_buffers"):
                return (Kind.OTHER, Kind.TENSOR)
        if unpacking and isinstance(iterable, (cst.Tuple, cst.List)):
            if any(isinstance(element, cst.StarredElement) for element in iterable.elements):
                return Kind.OTHER
            return tuple(self._kind(element.value, scope) or Kind.OTHER for element in iterable.elements)
        kind = self._kind(iterable, scope)
        return Kind.TENSOR if kind in (Kind.LOADER, Kind.TENSOR, Kind.TENSOR_LIST) else Kind.OTHER

    def _attribute_kind(self, expr: cst.Attribute, scope: Scope) -> Optional[Kind]:
        base = expr.value
        if isinstance(base, cst.Name) and scope.self_name is not None and base.value == scope.self_name:
            return self._self_attribute_kind(expr.attr.value, scope)
        if expr.attr.value in tensor_api.TENSOR_ATTRIBUTES:
            return _tensor_if(self._kind(base, scope))
        qualified = self.ctx.qualify(expr)  # `config.priors`: a tensor assigned in another module of the project
        return Kind.TENSOR if qualified is not None and self.ctx.project.is_tensor(qualified) else Kind.OTHER

    def _self_attribute_kind(self, attr: str, scope: Scope) -> Optional[Kind]:
        model = scope.owner
        bindings = model.attributes.get(attr) if model is not None else None
        if not bindings:
            own = model.methods.get(attr) if model is not None else None
            if own is not None and _is_property(own[0]):
                return self._returns_kind(*own)  # `@property def mask(self): return torch.ones(3)`
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

    def self_reads(self, class_name: str, seen: FrozenSet[str] = frozenset()) -> FrozenSet[str]:
        """The attributes that the methods of this file's class `class_name` read from `self`, its
        bases' of this file included (a store alone is no read; `self.steps += 1` is one)."""
        model = self.classes.get(class_name)
        if model is None or class_name in seen:
            return frozenset()
        read: Set[str] = set()
        for function, scope in model.methods.values():
            stored = set()
            for node in descendants(function):
                if isinstance(node, cst.Assign):
                    stored.update(id(target.target) for target in node.targets)
                elif isinstance(node, cst.AnnAssign):
                    stored.add(id(node.target))
                elif (
                    isinstance(node, cst.Attribute)
                    and isinstance(node.value, cst.Name)
                    and node.value.value == scope.self_name
                    and id(node) not in stored
                ):
                    read.add(node.attr.value)
        for base in model.node.bases:
            name = dotted(base.value)
            if name is not None:
                read |= self.self_reads(name, seen | {class_name})
        return frozenset(read)

    def local_names(self, function: cst.FunctionDef) -> FrozenSet[str]:
        """The names `function` binds itself (parameters, assignments, imports; a `global` declaration
        counts too): every other name it reads is its enclosing scope's."""
        scope = self._scope_of_function.get(function)
        return frozenset(scope.bindings) if scope is not None else frozenset()

    def replicated_classes(self) -> Dict[str, Tuple[Wrap, Optional[str]]]:
        """Classes of this file whose `forward` runs on DataParallel replicas: the wrapped ones, and the
        classes they build as submodules (`self.rnn = nn.Sequential(BidirectionalLSTM(...))`), transitively.
        Each with a wrap and the wrapped class it is built inside (None for the wrapped class itself)."""
        found: Dict[str, Tuple[Wrap, Optional[str]]] = {}
        for class_name, _, _, wraps in self.wrapped_forwards():
            found.setdefault(class_name, (wraps[0], None))
        pending = list(found)
        while pending:
            owner = pending.pop()
            wrap, via = found[owner]
            for call in iter_calls(self.classes[owner].node):
                name = dotted(call.func)
                model = self.classes.get(name or "")
                if name is not None and model is not None and model.is_module and name not in found:
                    found[name] = (wrap, via or owner)
                    pending.append(name)
        return found

    @staticmethod
    def self_attribute_is_parameter(attr: str, scope: Scope) -> bool:
        return scope.owner is not None and attr in scope.owner.parameters

    def _call_kind(self, call: cst.Call, scope: Scope) -> Optional[Kind]:
        func = call.func
        if _returns_pt_tensors(call):
            return Kind.TENSOR_DICT
        handed = self._handed_back(call)
        if handed is not None:
            return self._prepared_kind(handed, 0, scope) if len(handed) == 1 else Kind.OTHER
        qualified = self.ctx.qualify(func)
        if qualified is not None:
            module, _, last = qualified.rpartition(".")
            if call_returns_tensor(qualified):
                return Kind.TENSOR
            if module == "torch" and last in tensor_api.TORCH_FUNCTIONS_SEQUENCE:
                return Kind.TENSOR_LIST
            if module == "torch.nn.functional" and last in tensor_api.FUNCTIONAL_FUNCTIONS_SEQUENCE:
                return Kind.TENSOR_LIST
            if qualified in DATA_LOADERS:
                return Kind.OTHER if any(_keyword(arg) == "collate_fn" for arg in call.args) else Kind.LOADER
            if is_module_class_name(qualified):
                return Kind.MODULE
            return Kind.TENSOR if self.ctx.project.is_tensor(qualified + "()") else Kind.OTHER
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if isinstance(func.value, cst.Name) and func.value.value == scope.self_name and scope.owner is not None:
                own = scope.owner.methods.get(method)
                if own is not None:  # `self._init_hidden()`: what the class's own method returns
                    return self._returns_kind(*own)
            receiver = self._kind(func.value, scope)
            if receiver is Kind.TENSOR and method in tensor_api.TENSOR_METHODS:
                return Kind.TENSOR
            if method in TENSOR_ONLY_METHODS and receiver is not Kind.MODULE:
                return Kind.TENSOR
            if receiver is Kind.TENSOR and method in tensor_api.TENSOR_METHODS_SEQUENCE:
                return Kind.TENSOR_LIST
            if receiver is Kind.MODULE and method in MODULE_METHODS:
                return Kind.MODULE
            return None if receiver is None else Kind.OTHER
        if isinstance(func, cst.Name):
            bindings, owner = self._lookup(func.value, scope)
            if bindings is None and func.value in ("list", "tuple") and len(call.args) == 1 and not call.args[0].star:
                return Kind.TENSOR_LIST if self._element_shape(call.args[0].value, scope) is Kind.TENSOR else Kind.OTHER
            model = self.classes.get(func.value)
            if model is not None and owner is self.module_scope:
                return Kind.MODULE if model.is_module else Kind.OTHER
            # The one function of that name defined where the call finds it, never rebound there.
            functions = [(f, s) for f, s in self.functions.get(func.value, ()) if s.parent is owner]
            if bindings is not None and len(bindings) == 1 and len(functions) == 1:
                return self._returns_kind(*functions[0])
        return Kind.OTHER

    def _handed_back(self, value: cst.BaseExpression) -> Optional[Tuple[cst.BaseExpression, ...]]:
        """The objects `accelerator.prepare(...)` is given, which it hands back in order."""
        return prepared_arguments(self.ctx, value) if isinstance(value, cst.Call) else None

    def _prepared_kind(self, handed: Sequence[cst.BaseExpression], index: int, scope: Scope) -> Optional[Kind]:
        """What Accelerate's `prepare` hands back for the object at `index`: a module stays one (its DDP
        wrapper is one too); an optimizer, loader or scheduler comes back as Accelerate's own wrapper."""
        if index >= len(handed):
            return Kind.OTHER
        kind = self._kind(handed[index], scope)
        return kind if kind in (None, Kind.MODULE) else Kind.OTHER

    def _returns_kind(self, function: cst.FunctionDef, scope: Scope) -> Optional[Kind]:
        """What a function of this file returns: a tensor when every `return` that can run returns one."""
        returns = function.returns
        if returns is not None:
            return Kind.TENSOR if self.ctx.qualify(returns.annotation) in TENSOR_TYPES else Kind.OTHER
        if function.asynchronous is not None or scope.generator or not _keeps_result(function):
            return Kind.OTHER
        self._flowed(scope)
        if scope.exit is not None:
            return Kind.OTHER  # falls off its end: returns None
        key = (id(scope), "return")
        if key in self._in_progress:
            return None
        self._in_progress.add(key)
        try:
            result: Optional[Kind] = None
            reached = False
            for statement in scope.returns:
                if not self.reachable(statement, scope):
                    continue
                if statement.value is None:
                    return Kind.OTHER
                reached = True
                result = join(result, self._kind(statement.value, scope))
                if result is Kind.OTHER:
                    break
            return result if reached else Kind.OTHER
        finally:
            self._in_progress.discard(key)

    def _parameter_kind(self, function: cst.FunctionDef, param: cst.Param) -> Optional[Kind]:
        """An unannotated parameter holds what every call of its function (or, for `__init__`, of its
        class) passes to it, or its default where a call leaves it out: the calls in this file, read
        here, and for a function or class at the top of the module every call in the project's other
        files, as the facts record it (`ProjectFacts.calls_from_other_files`). Unknown without a call,
        and where the function may be called some other way: its name used other than to call it (a
        reference, a subclass, an import of another of that name), a decorator that may change its
        arguments, a `*args`/`**kwargs` splat, a caller in a file not read for calls."""
        callee = self._callee(function)
        if callee is None:
            return Kind.OTHER
        name, top_level, shift = callee
        sites = self._calls_by_name().get(name, [])
        if self._call_collector().uses.get(name, 0) != 1 + len(sites):  # its definition's name, then the calls
            return Kind.OTHER
        elsewhere: Tuple[ProjectCall, ...] = ()
        if top_level:
            found = self.ctx.project.calls_from_other_files(self.ctx.filename, name)
            if found is None:
                return Kind.OTHER
            elsewhere = found
        if not sites and not elsewhere:
            return Kind.OTHER
        positional = list(function.params.posonly_params) + list(function.params.params)
        index = next((i - shift for i, p in enumerate(positional) if p is param), None)
        keyword = None if param in function.params.posonly_params else param.name.value
        result: Optional[Kind] = None
        for call, caller_scope in sites:
            if any(arg.star for arg in call.args):
                return Kind.OTHER
            argument = _argument_for(call, keyword, index)
            if argument is None:
                result = join(result, self._default_kind(function, param))
            else:
                result = join(result, self._kind(argument, caller_scope))
            if result is Kind.OTHER:
                return result
        for other in elsewhere:
            if other.passed is None:
                return Kind.OTHER
            count, keywords = other.passed
            slot = index if index is not None and index < count else keyword if keyword in keywords else None
            if slot is None:
                result = join(result, self._default_kind(function, param))
            else:
                deps = dict(other.tensors).get(slot)
                result = join(result, Kind.TENSOR if deps is not None and self.ctx.project.tensors_known(deps) else Kind.OTHER)
            if result is Kind.OTHER:
                return result
        return result

    def _default_kind(self, function: cst.FunctionDef, param: cst.Param) -> Optional[Kind]:
        """What a parameter holds where a call leaves it out: its default, read where the `def` stands."""
        if param.default is None:
            return Kind.OTHER  # a required parameter left out: the call raises, or the match was wrong
        return self._kind(param.default, self._scope_of_function[function].parent or self.module_scope)

    def _callee(self, function: cst.FunctionDef) -> Optional[Tuple[str, bool, int]]:
        """The name a function is called by, whether it stands at the top of the module (so other
        files may call it), and how many of its parameters a call does not pass (`self`). A function
        of the module or nested in another function is called by its name; `__init__` by its class's.
        None for any other method, and where a call may not reach the parameters as written: a
        decorator that may change them, a class whose `__init__` is also reached some other way (a
        metaclass, `__new__`, a class method that builds one, `type(self)(...)`)."""
        scope = self._scope_of_function.get(function)
        if scope is None or not _keeps_arguments(function):
            return None
        if scope.owner is None:
            return function.name.value, scope.parent is self.module_scope, 0
        model = scope.owner
        if function.name.value != "__init__" or model.node.decorators or model.node.keywords or not self._built_by_name_only(model):
            return None
        class_scope = self._class_scopes.get(model.node)
        if class_scope is self.module_scope:
            return model.node.name.value, True, 1
        if class_scope is not None and class_scope.function is not None:
            return model.node.name.value, False, 1  # a class of a function: called in this file alone
        return None

    @staticmethod
    def _built_by_name_only(model: ClassModel) -> bool:
        """Whether the class's objects are built only by calling its name: no `__new__`, no class
        method (`cls(...)`), no `type(self)(...)` or `self.__class__(...)` in its body."""
        for statement in block_body(model.node.body):
            if isinstance(statement, cst.FunctionDef):
                if statement.name.value == "__new__" or any(dotted(d.decorator) == "classmethod" for d in statement.decorators):
                    return False
        for node in descendants(model.node):
            if isinstance(node, cst.Attribute) and node.attr.value == "__class__":
                return False
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "type" and len(node.args) == 1:
                return False
        return True

    def _calls_by_name(self) -> Dict[str, List[Tuple[cst.Call, Scope]]]:
        return self._call_collector().sites

    def _call_collector(self) -> "_CallCollector":
        if self._calls is None:
            collector = _CallCollector(set(self.functions) | set(self.classes), self._scope_of_function, self.module_scope)
            run_visitor(self.ctx.module, collector)
            self._calls = collector
        return self._calls


class _Flow:
    """Reaching definitions along one scope's statements: which statements are reachable, and which
    bindings reach each name they read.

    Branches are joined where they meet, loops are iterated until nothing new reaches their head, every
    statement of a `try` body may jump to its handlers, and nothing reaches the code after `return`,
    `raise`, `continue`, `break` or a call that ends the program.

    A block changes its own copy of what reaches in place, statement after statement: a copy per
    statement made a long module quadratic (40,000 lines binding 20,000 names: 27 s and 5 GB). Any
    other holder of an env (a branch, a loop head, the statements a `try` records) has one nobody changes.
    """

    def __init__(self, inference: Inference, scope: Scope) -> None:
        self.inference = inference
        self.scope = scope
        self.reached: Set[int] = set()
        self.read: Dict[int, FrozenSet[Binding]] = {}  # id of a Name read in a reached statement → what reaches it
        self.loops: List[Tuple[List[Env], List[Env]]] = []  # per open loop: what breaks, what continues
        self.tries: List[_Raised] = []  # per open `try`/`with`: what its statements leave

    def apply(self, definitions: Definitions, env: Env, in_place: bool = False) -> Env:
        if not definitions:
            return env
        if not in_place:
            env = dict(env)
        for name, binding in definitions:
            previous = env.get(name, frozenset()) if binding.keeps_previous else frozenset()
            env[name] = previous | {binding}
        return env

    def defined_by(self, node: cst.CSTNode, env: Env, in_place: bool = False) -> Env:
        return self.apply(self.inference._definitions.get(id(node), []), env, in_place)

    def record(self, statement: cst.CSTNode, env: Env) -> None:
        """The statement is reachable, with `env` (a loop's last pass, its fixed point, is what stays)."""
        self.reached.add(id(statement))
        for read in self.inference.reads(statement):
            self.read[id(read)] = env.get(read.value, frozenset())

    def block(self, body: Body, env: Optional[Env]) -> Optional[Env]:
        owned = False  # whether `env` is this block's own copy, which nothing else holds
        for statement in body:
            for step in statement.body if isinstance(statement, cst.SimpleStatementLine) else (statement,):
                if env is None:
                    return None
                # A statement returns the env it was given, or one it made that nothing else holds.
                after = self.statement(step, env, owned)
                owned = owned or after is not env
                env = after
        return env

    def statement(self, statement: cst.CSTNode, env: Env, owned: bool = False) -> Optional[Env]:
        """What reaches the end of the statement. A small statement, `def` or `class` changes `env` in
        place when `owned`; compound statements never change the `env` they are given."""
        self.record(statement, env)
        if isinstance(statement, cst.BaseSmallStatement):
            return self.small(statement, env, owned)
        if isinstance(statement, cst.If):
            taken = self.block(block_body(statement.body), env)
            orelse = statement.orelse
            if isinstance(orelse, cst.If):
                return _join(taken, self.statement(orelse, env))
            return _join(taken, self.block(block_body(orelse.body), env) if orelse is not None else env)
        if isinstance(statement, (cst.For, cst.While)):
            return self.loop(statement, env)
        if isinstance(statement, cst.Try) or isinstance(statement, getattr(cst, "TryStar", ())):
            return self.try_(statement, env)
        if isinstance(statement, cst.With):
            self.tries.append(_Raised(env))
            left = self.block(block_body(statement.body), self.defined_by(statement, env))
            raised = self.tries.pop().env
            # A context manager may swallow the exception that ended the body.
            return left if left is not None else raised
        if isinstance(statement, cst.Match):
            return _join(env, *(self.block(block_body(case.body), env) for case in statement.cases))
        if owned:  # def, class: bindings made between two of a `try`'s records, which must not see them
            for raised in self.tries:
                raised.changed_behind(env)
        return self.defined_by(statement, env, owned)

    def small(self, small: cst.BaseSmallStatement, env: Env, owned: bool) -> Optional[Env]:
        if isinstance(small, (cst.Return, cst.Raise)):
            return None
        if isinstance(small, (cst.Break, cst.Continue)):
            if self.loops:
                self.loops[-1][0 if isinstance(small, cst.Break) else 1].append(env)
            return None
        if self.inference.exits_program(small, self.scope):
            return None
        definitions = self.inference._definitions.get(id(small), [])
        before = env
        env = self.apply(definitions, env, owned)
        for raised in self.tries:
            raised.add(before, env, definitions)
        return env

    def loop(self, statement: Union[cst.For, cst.While], env: Env) -> Optional[Env]:
        head = env
        for _ in range(50):
            self.loops.append(([], []))
            body_entry = self.defined_by(statement, head) if isinstance(statement, cst.For) else head
            left = self.block(block_body(statement.body), body_entry)
            breaks, continues = self.loops.pop()
            widened = _join(env, left, *continues)
            if widened == head:
                break
            head = widened or env
        if isinstance(statement, cst.While):
            self.record(statement, head)  # the test runs before every iteration
        endless = isinstance(statement, cst.While) and _always_true(statement.test)
        finished = None if endless else head
        if statement.orelse is not None and finished is not None:
            finished = self.block(block_body(statement.orelse.body), finished)
        return _join(finished, *breaks)

    def try_(self, statement: cst.Try, env: Env) -> Optional[Env]:
        self.tries.append(_Raised(env))
        left = self.block(block_body(statement.body), env)
        raised = self.tries.pop().env
        self.tries.append(_Raised(None))  # what a handler or `else` leaves can still reach `finally`
        handled = [self.block(block_body(handler.body), self.defined_by(handler, raised)) for handler in statement.handlers]  # type: ignore[arg-type]
        if statement.orelse is not None:
            left = self.block(block_body(statement.orelse.body), left)
        after_handlers = self.tries.pop().env
        normal = _join(left, *handled)
        if statement.finalbody is None:
            return normal
        after = self.block(block_body(statement.finalbody.body), _join(normal, raised, after_handlers))
        return after if normal is not None else None


class _Raised:
    """The join of what reaches the start of a `try` or `with` body and the end of each small statement
    in it: what an exception leaving the body carries.

    Grown statement by statement: when the env a statement started from is already in the join (the
    `covered` one, not changed since), only the names the statement binds are added, not every name.
    """

    def __init__(self, start: Optional[Env]) -> None:
        self.env: Optional[Env] = None if start is None else dict(start)
        self.covered: Optional[Env] = start

    def add(self, before: Env, after: Env, definitions: Definitions) -> None:
        joined = self.env
        if joined is None:
            self.env = dict(after)
        elif self.covered is before:
            for name, _ in definitions:
                joined[name] = joined.get(name, frozenset()) | after[name]
        else:
            for name, bindings in after.items():
                joined[name] = joined.get(name, frozenset()) | bindings
        self.covered = after

    def changed_behind(self, env: Env) -> None:
        """`env` was changed in place without being added."""
        if self.covered is env:
            self.covered = None


def _join(*envs: Optional[Env]) -> Optional[Env]:
    """What reaches a point where these paths meet (None: no path reaches it)."""
    present = [env for env in envs if env is not None]
    if not present:
        return None
    merged = dict(present[0])
    for env in present[1:]:
        for name, bindings in env.items():
            merged[name] = merged.get(name, frozenset()) | bindings
    return merged


def _always_true(test: cst.BaseExpression) -> bool:
    return (isinstance(test, cst.Name) and test.value == "True") or (isinstance(test, cst.Integer) and test.evaluated_value != 0)


def _evaluated_parts(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The expressions a statement evaluates where it stands (not the blocks inside it)."""
    if isinstance(node, cst.BaseSmallStatement):
        yield node
    elif isinstance(node, (cst.If, cst.While)):
        yield node.test
    elif isinstance(node, cst.For):
        yield node.iter
    elif isinstance(node, cst.With):
        yield from (item.item for item in node.items)
    elif isinstance(node, cst.Match):
        yield node.subject
    elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        yield from (decorator.decorator for decorator in node.decorators)


_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _name_reads(node: cst.CSTNode) -> List[cst.Name]:
    """The names an expression reads, leaving out lambdas' and comprehensions' own variables."""
    reads: List[cst.Name] = []
    pending: List[Tuple[cst.CSTNode, FrozenSet[str]]] = [(node, frozenset())]
    while pending:
        current, hidden = pending.pop()
        if isinstance(current, cst.Name):
            if current.value not in hidden:
                reads.append(current)
            continue
        if isinstance(current, cst.Lambda):
            continue
        if isinstance(current, _COMPREHENSIONS):
            names: Set[str] = set()
            clause: Optional[cst.CompFor] = current.for_in
            while clause is not None:
                names.update(_target_names(clause.target))
                clause = clause.inner_for_in
            hidden = hidden | names
        pending.extend((child, hidden) for child in child_nodes(current))
    return reads


def _target_names(target: cst.BaseExpression) -> Iterator[str]:
    return (part.value for part in assigned_parts(target) if isinstance(part, cst.Name))


def _bind_shape(target: cst.BaseExpression, shape: Shape, names: Dict[str, Shape]) -> None:
    """Bind a comprehension's loop target to the shape of what it iterates over."""
    if isinstance(target, cst.Name):
        names[target.value] = _at_path(shape, ())
    elif isinstance(target, (cst.Tuple, cst.List)):
        for index, element in enumerate(target.elements):
            if isinstance(element, cst.StarredElement):
                _bind_shape(element.value, Kind.OTHER, names)
            else:
                _bind_shape(element.value, _sub_shape(shape, index), names)
    else:
        for name in _target_names(target):
            names[name] = Kind.OTHER


def _sub_shape(shape: Shape, index: int) -> Shape:
    if isinstance(shape, Kind):
        return shape
    return shape[index] if index < len(shape) else Kind.OTHER


def _all_tensors(kinds: List[Optional[Kind]], container: Kind) -> Optional[Kind]:
    """`container` when every element is a tensor (None while some are still being inferred)."""
    if not kinds or any(kind not in (None, Kind.TENSOR) for kind in kinds):
        return Kind.OTHER
    return container if all(kind is Kind.TENSOR for kind in kinds) else None


def _keeps_result(function: cst.FunctionDef) -> bool:
    """Whether the function's decorators (if any) return what it returns."""
    return _decorated_only_by(function, TRANSPARENT_DECORATORS)


def _decorated_only_by(function: cst.FunctionDef, names: FrozenSet[str]) -> bool:
    """Whether every decorator of the function (`@torch.no_grad()`, `@wraps(f)`: by its last name) is one of `names`."""
    return all(
        (dotted(decorator.decorator if not isinstance(decorator.decorator, cst.Call) else decorator.decorator.func) or "")
        .rpartition(".")[2]
        in names
        for decorator in function.decorators
    )


def _is_property(node: cst.FunctionDef) -> bool:
    """A getter: `@property` alone (a `cached_property` or a setter is read differently)."""
    return len(node.decorators) == 1 and dotted(node.decorators[0].decorator) == "property"


def _is_static(node: cst.FunctionDef) -> bool:
    return any(dotted(decorator.decorator) == "staticmethod" for decorator in node.decorators)


def _keyword(arg: cst.Arg) -> Optional[str]:
    return arg.keyword.value if arg.keyword is not None else None


def _returns_pt_tensors(call: cst.Call) -> bool:
    """`tokenizer(texts, return_tensors="pt")`: Hugging Face's tokenizers and processors return a
    `BatchEncoding` whose values are tensors (its own `.to()` moves it in place, so it is no tensor)."""
    return any(
        _keyword(arg) == "return_tensors" and isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == "pt"
        for arg in call.args
    )


def _tensor_if(kind: Optional[Kind]) -> Optional[Kind]:
    """Indexing, negating or `.T` of a tensor is a tensor; of anything else, unknown."""
    return kind if kind in (None, Kind.TENSOR) else Kind.OTHER


def _argument_for(call: cst.Call, name: Optional[str], index: Optional[int]) -> Optional[cst.BaseExpression]:
    """The argument a call passes at position `index` or by the keyword `name` (None: by position only)."""
    positional = [arg for arg in call.args if arg.keyword is None]
    if index is not None and index < len(positional):
        return positional[index].value
    for arg in call.args:
        if name is not None and _keyword(arg) == name:
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
    """Calls of the file's own functions and classes by plain name, each with the scope it is made in,
    and how many times each of those names is used: every `Name` but an attribute's (`x.train`), a
    keyword's (`f(train=...)`), a method's own (`def train(self)`), one in an annotation, a class
    handed to `super`, `isinstance` or `issubclass` (none of which calls or rebinds it)."""

    def __init__(self, names: Set[str], scopes: Dict[cst.FunctionDef, Scope], module_scope: Scope) -> None:
        self.names = names
        self.scopes = scopes
        self.stack = [module_scope]
        self.sites: Dict[str, List[Tuple[cst.Call, Scope]]] = {}
        self.uses: Dict[str, int] = {}
        self.skipped: Set[int] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.append(self.scopes.get(node, self.stack[-1]))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for statement in block_body(node.body):
            if isinstance(statement, cst.FunctionDef):
                self.skipped.add(id(statement.name))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.skipped.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.skipped.add(id(node.keyword))

    def visit_Annotation(self, node: cst.Annotation) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names and id(node) not in self.skipped:
            self.uses[node.value] = self.uses.get(node.value, 0) + 1

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Name) and func.value in self.names:
            self.sites.setdefault(func.value, []).append((node, self.stack[-1]))
        elif isinstance(func, cst.Name) and func.value in ("super", "isinstance", "issubclass") and len(node.args) == 2:
            checked = node.args[0 if func.value == "super" else 1].value
            for element in [e.value for e in checked.elements] if isinstance(checked, cst.Tuple) else [checked]:
                self.skipped.add(id(element))


def _keeps_arguments(function: cst.FunctionDef) -> bool:
    """Whether the function's decorators (if any) pass the call's arguments on as they are."""
    return _decorated_only_by(function, ARGUMENT_KEEPING_DECORATORS)


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
