from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import libcst as cst

from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.analysis.facts import FUNCTIONAL_DATA_PARALLEL, ProjectFacts, Wrap
from dplint.analysis.inference import Binding, Inference, Kind, Scope
from dplint.analysis.names import Body, block_body, dotted, signed_integer_value
from dplint.finding import FileReference
from dplint.rule import Invalid, Report, Rule, Valid, WrappedForwardRule

MOVERS = frozenset({"permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis", "t"})
# Methods and torch functions that keep every dimension where it is.
LAYOUT_KEEPING = frozenset(
    """to cuda cpu float half double bfloat16 long int bool contiguous detach clone relu relu_ sigmoid
    sigmoid_ tanh tanh_ exp log abs neg pow sqrt clamp clamp_ clip masked_fill masked_fill_ add add_ sub
    sub_ mul mul_ div div_ type_as softmax log_softmax cumsum requires_grad_ dropout gelu silu
    layer_norm normalize""".split()
)
RESHAPES = frozenset({"view", "reshape", "view_as", "reshape_as", "expand", "expand_as", "repeat", "unflatten"})
REDUCTIONS = frozenset({"sum", "mean", "prod", "std", "var", "norm", "amax", "amin", "argmax", "argmin", "logsumexp", "all", "any"})
RNN_MODULES = frozenset({"torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN"})
EINOPS_REARRANGE = frozenset({"einops.rearrange"})


@dataclass(frozen=True)
class Layout:
    """Where the batch dimension of `forward`'s input sits in a value (negative: from the end)."""

    batch_dim: int
    mover: Optional[cst.CSTNode] = None  # the permute-like call that moved it away from dim 0
    mover_statement: Optional[cst.CSTNode] = None


Value = Union[Layout, Tuple["Value", ...], None]  # a tracked tensor, a tuple of values, or untracked


@dataclass(frozen=True)
class Scatter:
    """A functional `data_parallel` call in `forward` that scatters a tensor along `dim` while its batch
    sits elsewhere (`layout`): directly, or through a project function that forwards to it (`helper`:
    the file and the line of that function's own call)."""

    call: cst.Call
    inputs: cst.BaseExpression
    layout: Layout
    dim: int
    statement: Optional[cst.CSTNode]
    helper: Optional[Tuple[str, str, int]] = None  # (filename, shown path, line)


def _ints(args: Sequence[cst.Arg]) -> Optional[List[int]]:
    if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)):
        values = [signed_integer_value(element.value) for element in args[0].value.elements]
    else:
        values = [None if arg.star else signed_integer_value(arg.value) for arg in args]
    return None if any(v is None for v in values) else values  # type: ignore[return-value]


def _merge(a: Value, b: Value) -> Value:
    return a if a == b else None


class ForwardLayouts:
    """Follows the batch dimension through one `forward`, statement by statement."""

    # How deep `forward` → helper method → helper method is followed.
    MAX_HELPER_DEPTH = 3

    def __init__(
        self,
        ctx: FileContext,
        inference: Inference,
        class_name: str,
        function: cst.FunctionDef,
        env: Optional[Dict[str, Value]] = None,
        depth: int = 0,
    ) -> None:
        self.ctx = ctx
        self.inference = inference
        self.class_name = class_name
        self.model = inference.classes.get(class_name)
        self.function = function
        self.initial_env = env
        self.depth = depth
        self.statement: Optional[cst.CSTNode] = None
        self.returned: List[Tuple[Layout, cst.Return]] = []
        self.returned_values: List[Value] = []
        self.scatters: List[Scatter] = []

    def run(self) -> List[Tuple[Layout, cst.Return]]:
        params = self.function.params
        env: Dict[str, Value] = (
            dict(self.initial_env)
            if self.initial_env is not None
            else {param.name.value: Layout(0) for param in list(params.params)[1:] + list(params.kwonly_params)}
        )
        self._block(block_body(self.function.body), env)
        return self.returned

    # ----- statements -----------------------------------------------------------------------------

    def _block(self, body: Body, env: Dict[str, Value]) -> Dict[str, Value]:
        for statement in body:
            env = self._statement(statement, env)
        return env

    def _statement(self, statement: cst.CSTNode, env: Dict[str, Value]) -> Dict[str, Value]:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                self.statement = small
                self._small(small, env)
            return env
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            env[statement.name.value] = None
            return env
        if isinstance(statement, cst.If):
            then = self._block(block_body(statement.body), dict(env))
            orelse = statement.orelse
            if isinstance(orelse, cst.If):
                other = self._statement(orelse, dict(env))
            elif isinstance(orelse, cst.Else):
                other = self._block(block_body(orelse.body), dict(env))
            else:
                other = env
            return _merge_envs(then, other)
        if isinstance(statement, (cst.For, cst.While)):
            if isinstance(statement, cst.For):
                self._bind(statement.target, None, env)
            after = self._block(block_body(statement.body), dict(env))
            return _merge_envs(env, after)
        if isinstance(statement, cst.With):
            for item in statement.items:
                if item.asname is not None:
                    self._bind(item.asname.name, None, env)
            return self._block(block_body(statement.body), env)
        if isinstance(statement, cst.Try):
            after = self._block(block_body(statement.body), dict(env))
            for handler in statement.handlers:
                after = _merge_envs(after, self._block(block_body(handler.body), dict(env)))
            return after
        return {name: None for name in env}  # match statements and the like: stop tracking

    def _small(self, small: cst.BaseSmallStatement, env: Dict[str, Value]) -> None:
        if isinstance(small, cst.Assign):
            value = self._eval(small.value, env)
            for target in small.targets:
                self._bind(target.target, value, env)
        elif isinstance(small, cst.AnnAssign) and small.value is not None:
            self._bind(small.target, self._eval(small.value, env), env)
        elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
            env[small.target.value] = _combine(env.get(small.target.value), self._eval(small.value, env))
        elif isinstance(small, cst.Return):
            value = self._eval(small.value, env) if small.value is not None else None
            self.returned_values.append(value)
            for layout in _layouts(value):
                self.returned.append((layout, small))

    def _bind(self, target: cst.BaseExpression, value: Value, env: Dict[str, Value]) -> None:
        if isinstance(target, cst.Name):
            env[target.value] = value
        elif isinstance(target, (cst.Tuple, cst.List)):
            elements = target.elements
            for index, element in enumerate(elements):
                if isinstance(value, tuple) and len(value) == len(elements):
                    part: Value = value[index]
                else:
                    # `out, state = self.lstm(x)`: the output keeps the layout, the rest is untracked.
                    part = value if isinstance(value, Layout) and index == 0 else None
                self._bind(element.value, None if isinstance(element, cst.StarredElement) else part, env)

    # ----- expressions ----------------------------------------------------------------------------

    def _eval(self, expr: cst.BaseExpression, env: Dict[str, Value]) -> Value:
        if isinstance(expr, cst.Name):
            return env.get(expr.value)
        if isinstance(expr, cst.Call):
            return self._call(expr, env)
        if isinstance(expr, cst.Attribute):
            base = self._eval(expr.value, env)
            if isinstance(base, Layout):
                if expr.attr.value == "T":
                    return self._moved(base, -1 - base.batch_dim if base.batch_dim >= 0 else None, expr)
                if expr.attr.value == "data":
                    return base
            return None
        if isinstance(expr, cst.Subscript):
            return self._subscript(expr, env)
        if isinstance(expr, cst.BinaryOperation):
            return _combine(self._eval(expr.left, env), self._eval(expr.right, env))
        if isinstance(expr, cst.UnaryOperation):
            return self._eval(expr.expression, env)
        if isinstance(expr, cst.IfExp):
            return _merge(self._eval(expr.body, env), self._eval(expr.orelse, env))
        if isinstance(expr, (cst.Tuple, cst.List)):
            return tuple(self._eval(element.value, env) for element in expr.elements)
        if isinstance(expr, cst.Dict):
            return tuple(self._eval(element.value, env) for element in expr.elements)
        return None

    def _call(self, call: cst.Call, env: Dict[str, Value]) -> Value:
        func = call.func
        qualified = self.ctx.qualify(func)
        if qualified is not None:
            return self._function_call(qualified, call, env)
        if isinstance(func, cst.Name) and func.value not in env:  # a function of this file (`parallel(self.rnn, x)`)
            return self._function_call(func.value, call, env)
        if not isinstance(func, cst.Attribute):
            return None
        if self._is_self(func.value):
            return self._submodule_call(func.attr.value, call, env)
        receiver = self._eval(func.value, env)
        if isinstance(receiver, Layout):
            return self._method(receiver, func.attr.value, call.args, call)
        return None

    def _function_call(self, qualified: str, call: cst.Call, env: Dict[str, Value]) -> Value:
        module, _, name = qualified.rpartition(".")
        if qualified in FUNCTIONAL_DATA_PARALLEL:
            given = _arguments(call, (0, "module"), (1, "inputs"), (4, "dim"))
            return self._data_parallel(call, given[0], given[1], _dim(given[2]), None, env)
        found = self.ctx.project.parallel_helper(qualified, self.ctx.filename)
        if found is not None:
            filename, helper = found
            given = _arguments(call, helper.module, helper.inputs)
            where = (filename, helper.path, helper.line)
            return self._data_parallel(call, given[0], given[1], helper.dim, where, env)
        if not call.args:
            return None
        first = self._eval(call.args[0].value, env)
        if qualified in EINOPS_REARRANGE:
            pattern = call.args[1].value if len(call.args) > 1 else None
            if isinstance(first, Layout) and isinstance(pattern, cst.SimpleString):
                return self._rearrange(first, str(pattern.evaluated_value), call)
            return None
        if module == "torch" and isinstance(first, Layout):
            return self._method(first, name, call.args[1:], call)
        if module == "torch.nn.functional" and isinstance(first, Layout):
            return None if "loss" in name or name in ("cross_entropy", "kl_div") else first
        return None

    def _data_parallel(
        self,
        call: cst.Call,
        module: Optional[cst.BaseExpression],
        inputs: Optional[cst.BaseExpression],
        dim: Optional[int],
        helper: Optional[Tuple[str, str, int]],
        env: Dict[str, Value],
    ) -> Value:
        """`data_parallel(self.rnn, x, device_ids)`: each GPU runs the module on a slice of `x` along
        `dim`, and the outputs are joined along `dim` again. A batch elsewhere is a `Scatter`; a batch
        at `dim` comes back where the module puts it."""
        if module is None or inputs is None or dim is None:
            return None
        value = self._eval(inputs, env)
        for layout in _layouts(value):
            if layout.mover is not None and layout.batch_dim != dim:
                self.scatters.append(Scatter(call, inputs, layout, dim, self.statement, helper))
                return None
        if isinstance(value, Layout) and value.batch_dim == dim == 0 and isinstance(module, cst.Attribute) and self._is_self(module.value):
            return self._module_output(module.attr.value, value)
        return None

    def _submodule_call(self, attribute: str, call: cst.Call, env: Dict[str, Value]) -> Value:
        """`self.rnn(x)`: a submodule keeps its input's layout (an RNN returns it inside a tuple);
        `self._decode(x)`: a helper method of the class returns what its body returns."""
        helper = self._helper_method(attribute)
        if helper is not None:
            return self._helper_call(helper, call, env)
        if not call.args:
            return None
        return self._module_output(attribute, self._eval(call.args[0].value, env))

    def _module_output(self, attribute: str, first: Value) -> Value:
        """What the submodule `self.<attribute>` returns for an input laid out as `first`."""
        bindings = self._attribute_bindings(attribute)
        if not bindings or self._helper_method(attribute) is not None:
            return None
        if not all(binding.value is not None and self._builds_module(binding.value, scope) for binding, scope in bindings):
            return None
        if not isinstance(first, Layout):
            return None
        if all(isinstance(b.value, cst.Call) and self.ctx.qualify(b.value.func) in RNN_MODULES for b, _ in bindings):
            return (first, None)
        return first

    def _helper_method(self, name: str) -> Optional[cst.FunctionDef]:
        if self.model is None or name == "forward":
            return None
        for statement in block_body(self.model.node.body):
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
                return statement
        return None

    def _helper_call(self, helper: cst.FunctionDef, call: cst.Call, env: Dict[str, Value]) -> Value:
        if self.depth >= self.MAX_HELPER_DEPTH or helper.asynchronous is not None or any(arg.star for arg in call.args):
            return None
        params = helper.params
        if not params.params or isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None:
            return None  # `*args`/`**kwargs` helpers: arguments not matched to parameters
        helper_env: Dict[str, Value] = {}
        positional = [arg for arg in call.args if arg.keyword is None]
        named = {arg.keyword.value: arg for arg in call.args if arg.keyword is not None}
        for index, param in enumerate([*list(params.params)[1:], *params.kwonly_params]):
            arg = named.get(param.name.value)
            if arg is None and index < len(positional) and param in params.params:
                arg = positional[index]
            helper_env[param.name.value] = self._eval(arg.value, env) if arg is not None else None
        inner = ForwardLayouts(self.ctx, self.inference, self.class_name, helper, helper_env, self.depth + 1)
        inner.run()
        self.scatters.extend(inner.scatters)
        values = inner.returned_values
        if not values:
            return None
        # A helper that moves the batch on one of its paths (`if self.flat: ... return x.permute(2, 0, 1)`)
        # returns it moved on that path, as a `forward` with that `return` would.
        moved = [value for value in values if isinstance(value, Layout) and value.mover is not None]
        if moved and all(value.batch_dim == moved[0].batch_dim for value in moved):
            return moved[0]
        result = values[0]
        for value in values[1:]:
            result = _merge(result, value)
        return result

    def _attribute_bindings(self, attribute: str) -> List[Tuple[Binding, Scope]]:
        """Where `self.<attribute>` is bound: in the class or in its base classes of the same file."""
        pending, seen, found = [self.model], set(), []
        while pending:
            model = pending.pop()
            if model is None or id(model) in seen:
                continue
            seen.add(id(model))
            found.extend(model.attributes.get(attribute, []))
            pending.extend(self.inference.classes.get(dotted(base.value) or "") for base in model.node.bases)
        return found

    def _builds_module(self, value: cst.BaseExpression, scope: Scope) -> bool:
        if self.inference.kind(value, scope) is Kind.MODULE:
            return True
        # An instance of a class the file cannot see (`Encoder(...)` imported from elsewhere).
        name = dotted(value.func) if isinstance(value, cst.Call) else None
        return name is not None and self.ctx.qualify(value.func) is None and name.rpartition(".")[2][:1].isupper()  # type: ignore[union-attr]

    def _is_self(self, node: cst.BaseExpression) -> bool:
        params = self.function.params.params
        return bool(params) and isinstance(node, cst.Name) and node.value == params[0].name.value

    def _moved(self, layout: Layout, batch_dim: Optional[int], node: cst.CSTNode) -> Value:
        """The layout after a permute-like call put the batch dimension at `batch_dim`."""
        if batch_dim is None:
            return None
        if batch_dim == 0:
            return Layout(0)
        if layout.mover is not None:
            return Layout(batch_dim, layout.mover, layout.mover_statement)
        return Layout(batch_dim, node, self.statement)

    def _method(self, layout: Layout, method: str, args: Sequence[cst.Arg], node: cst.CSTNode) -> Value:
        b = layout.batch_dim
        if method in LAYOUT_KEEPING:
            return layout
        if method in MOVERS:
            return self._moved(layout, _moved_dim(method, b, args), node)
        keyword = {arg.keyword.value: arg.value for arg in args if arg.keyword is not None}
        positional = [arg.value for arg in args if arg.keyword is None and not arg.star]
        if method in ("squeeze", "unsqueeze"):
            if not positional and "dim" not in keyword:
                return layout if method == "squeeze" else None
            k = signed_integer_value(keyword.get("dim") or positional[0])
            if k is None or k < 0 or b < 0:
                return None
            if method == "unsqueeze":
                return _shifted(layout, b + 1 if k <= b else b)
            return None if k == b else _shifted(layout, b - 1 if k < b else b)
        if method == "flatten":
            start = signed_integer_value(keyword.get("start_dim") or positional[0]) if (positional or "start_dim" in keyword) else 0
            return layout if start is not None and 0 <= b < start else None
        if method in RESHAPES:
            return layout if b == 0 and layout.mover is None else None
        if method in REDUCTIONS:
            dim_node = keyword.get("dim") or (positional[0] if positional else None)
            k = signed_integer_value(dim_node) if dim_node is not None else None
            keepdim = isinstance(keyword.get("keepdim"), cst.Name) and keyword["keepdim"].value == "True"  # type: ignore[union-attr]
            if k is None or k < 0 or b < 0 or k == b:
                return None
            return layout if keepdim or k > b else _shifted(layout, b - 1)
        return None

    def _subscript(self, expr: cst.Subscript, env: Dict[str, Value]) -> Value:
        base = self._eval(expr.value, env)
        if isinstance(base, tuple):
            item = expr.slice[0].slice
            index = signed_integer_value(item.value) if isinstance(item, cst.Index) and len(expr.slice) == 1 else None
            return base[index] if index is not None and -len(base) <= index < len(base) else None
        if not isinstance(base, Layout) or base.batch_dim < 0:
            return None
        b = base.batch_dim
        consumed = removed = added = 0  # input dims read so far, input dims indexed away, new axes
        for element in expr.slice:
            item = element.slice
            if isinstance(item, cst.Index) and isinstance(item.value, cst.Name) and item.value.value == "None":
                added += 1
                continue
            if isinstance(item, cst.Slice):
                if consumed == b:
                    return _shifted(base, b - removed + added)
            elif signed_integer_value(item.value) is None or consumed == b:
                return None  # an ellipsis or a tensor index, or the batch itself indexed away
            else:
                removed += 1
            consumed += 1
        return _shifted(base, b - removed + added)

    def _rearrange(self, layout: Layout, pattern: str, node: cst.CSTNode) -> Value:
        left, arrow, right = pattern.partition("->")
        lhs, rhs = _axes(left), _axes(right)
        b = layout.batch_dim
        if not arrow or lhs is None or rhs is None or b < 0 or b >= len(lhs) or "..." in lhs[:b]:
            return None
        name = lhs[b]
        if not isinstance(name, str) or name == "...":
            return None
        for index, token in enumerate(rhs):
            if token == "...":
                return None
            if token == name or (isinstance(token, tuple) and token[:1] == (name,)):
                return self._moved(layout, index, node)
            if isinstance(token, tuple) and name in token:
                return None
        return None


# A call of `data_parallel`, or an import that names it otherwise (`data_parallel as run`).
_DATA_PARALLEL_CALL = re.compile(r"\bdata_parallel(?:[ \t]*\(|[ \t]+as\b)")


def _may_scatter(text: str, project: ProjectFacts) -> bool:
    """Whether the text has a `forward` and calls `data_parallel`, or a project function that forwards to it."""
    if "def forward" not in text:
        return False
    if "data_parallel" in text and _DATA_PARALLEL_CALL.search(text) is not None:
        return True
    return any(f"{name}(" in text for name in project.parallel_helper_names)


def _arguments(call: cst.Call, *parameters: Tuple[int, str]) -> List[Optional[cst.BaseExpression]]:
    """The argument each parameter (position, name) receives; None where the call leaves it out or a
    `*args`/`**kwargs` may hide it."""
    if any(arg.star for arg in call.args):
        return [None] * len(parameters)
    positional = [arg.value for arg in call.args if arg.keyword is None]
    named = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    return [positional[index] if index < len(positional) else named.get(name) for index, name in parameters]


def _dim(node: Optional[cst.BaseExpression]) -> Optional[int]:
    """A literal dim (0 when left out), else None."""
    return 0 if node is None else signed_integer_value(node)


def _shifted(layout: Layout, batch_dim: int) -> Layout:
    return Layout(batch_dim, layout.mover, layout.mover_statement) if batch_dim != 0 else Layout(0)


def _moved_dim(method: str, b: int, args: Sequence[cst.Arg]) -> Optional[int]:
    """Where a permute-like call puts dimension `b`, or None when the literals don't tell."""
    dims = _ints(args)
    if dims is None:
        return None
    if method == "permute":
        ndim = len(dims)
        normal = [d + ndim if d < 0 else d for d in dims]
        target = b + ndim if b < 0 else b
        return normal.index(target) if target in normal else None
    if method == "t":
        return {0: 1, 1: 0}.get(b) if not dims else None
    if len(dims) != 2:
        return None
    first, second = dims
    if not (min(first, second, b) >= 0 or max(first, second, b) < 0):
        # Mixing dims counted from the start and from the end needs the rank, which is unknown.
        return second if method in ("movedim", "moveaxis") and b == first else None
    if method in ("movedim", "moveaxis"):
        if b == first:
            return second
        order = [d for d in range(min(first, second, b), max(first, second, b) + 1) if d != first]
        order.insert(second - min(first, second, b), first)
        return order.index(b) + min(first, second, b)
    return second if b == first else first if b == second else b


def _axes(side: str) -> Optional[List[Union[str, Tuple[str, ...]]]]:
    tokens = re.findall(r"\(|\)|\.\.\.|\w+", side)
    axes: List[Union[str, Tuple[str, ...]]] = []
    group: Optional[List[str]] = None
    for token in tokens:
        if token == "(":
            if group is not None:
                return None
            group = []
        elif token == ")":
            if group is None:
                return None
            axes.append(tuple(group))
            group = None
        elif group is not None:
            group.append(token)
        else:
            axes.append(token)
    return axes if group is None else None


def _combine(a: Value, b: Value) -> Value:
    """`x + bias`: an untracked operand takes the other's layout; two different layouts are unknown."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, Layout) and isinstance(b, Layout) and a.batch_dim == b.batch_dim:
        return a if a.mover is not None else b
    return None


def _merge_envs(a: Dict[str, Value], b: Dict[str, Value]) -> Dict[str, Value]:
    return {name: _merge(a.get(name), b.get(name)) for name in set(a) | set(b)}


def _layouts(value: Value) -> Iterator[Layout]:
    if isinstance(value, Layout):
        yield value
    elif isinstance(value, tuple):
        for part in value:
            yield from _layouts(part)


def _example(batch_dim: int, gather_dim: int) -> str:
    if gather_dim != 0 or batch_dim == 0:
        return f"the replicas' outputs are concatenated along dim {gather_dim}, not along the batch"
    if batch_dim < 0:
        return "a [T, C, B] output comes back as [2T, C, B/2]"
    shape = ["T", "N", "M"][: batch_dim] + ["B", "C"]
    gathered = ["2" + shape[0]] + shape[1:batch_dim] + ["B/2", "C"]
    return f"a [{', '.join(shape)}] output comes back as [{', '.join(gathered)}]"


class BatchDimMovedInForward(WrappedForwardRule):
    """
    ## What it does
    Checks `forward` of `nn.Module` subclasses that are wrapped in `nn.DataParallel` (or run through
    `torch.nn.parallel.data_parallel(module, inputs)`) somewhere in the project for a `permute`,
    `transpose`, `swapaxes`, `movedim`, `.t()`, `.T` or `einops.rearrange` that moves the batch
    dimension away from dim 0 when the moved value reaches `return` (directly, through local
    variables, through the class's own helper methods called from `forward`, or through submodules
    such as an LSTM, which keep the layout) and nothing moves it back (a second permute, or indexing
    such as `x[-1]` that drops the leading dimension).

    Also checks the functional `torch.nn.parallel.data_parallel(module, inputs, device_ids, dim=0)`
    called inside `forward` (by any import name, or through a function of the project that hands its
    module and input on to it, as `utils.data_parallel(self.rnn, conv, self.ngpu)` does) for an input
    whose batch dimension was moved off the dim it scatters along: a time-first `[T, B, C]` sequence
    scattered along dim 0.

    ## Why is this bad?
    DataParallel splits the input batch along `dim` (0 by default), runs one replica per GPU, and
    concatenates the replicas' outputs along the same `dim`. A `forward` that returns `[T, B, C]` (a
    CRNN or a sequence model feeding CTC loss) is concatenated along T instead of B: on 2 GPUs a
    `[T, B, C]` output comes back as `[2T, B/2, C]`. No error is raised; the loss pairs the wrong
    time steps with the wrong samples and training silently degrades. On one GPU everything works.

    `data_parallel` splits its input the same way: a `[T, B, C]` sequence scattered along dim 0 gives
    each GPU a slice of the time steps of every sample, so each replica's RNN starts afresh in the
    middle of the sequences and never sees the rest; the joined output has the right shape and the
    wrong values.

    ## Example
    ```python
    class CRNN(nn.Module):
        def forward(self, images):
            features = self.cnn(images).squeeze(2)  # [B, C, W]
            features = features.permute(2, 0, 1)  # [W, B, C]
            output, _ = self.rnn(features)
            return output  # [T, B, C]

    model = nn.DataParallel(CRNN())
    ```

    ## Use instead
    Keep the batch first inside `forward` and permute after the DataParallel call:
    ```python
    class CRNN(nn.Module):
        def forward(self, images):
            features = self.cnn(images).squeeze(2).permute(2, 0, 1)
            output, _ = self.rnn(features)
            return output.permute(1, 0, 2)  # [B, T, C]

    model = nn.DataParallel(CRNN())
    log_probs = model(images).permute(1, 0, 2)  # [T, B, C] for CTC
    ```
    For `data_parallel` inside `forward`, scatter along the batch: `data_parallel(self.rnn, seq,
    device_ids, dim=1)` for a `[T, B, C]` sequence (the outputs are joined along dim 1 too).

    ## Known problems
    Only literal dimensions are followed; a reshape, a call to a function outside the class, or a
    dimension held in a variable ends the tracking (silently). Helper methods are followed three
    calls deep. A wrapped class is matched to its definition through the
    wrapping file's imports; a name that cannot be resolved (a star import) matches every class of
    that name. Classes wrapped only through a factory (`DataParallel(build_model(cfg))`) are not
    known to be wrapped. For `data_parallel` inside `forward`, the batch of `forward`'s input is taken
    to be at dim 0 (where DataParallel would put it) unless a wrap of the class scatters along
    another dim; a `forward` whose input comes time-first and is transposed to batch-first before a
    batch-first `data_parallel` call would be reported wrongly. A project function counts as handing
    its arguments to `data_parallel` only when it passes two of its parameters, never reassigned, as
    the module and its input (with one dim on every path).
    """

    code = "DPL301"
    name = "batch-dim-moved-in-forward"
    summary = "`forward` of a DataParallel-wrapped module returns its batch dimension away from the gather dim."
    triggers = GuardedPattern(
        r"permute|transpose|swapaxes|swapdims|movedim|moveaxis|\.t\(\)|\.T\b|rearrange",
        ["permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis", ".t()", ".T", "rearrange"],
    )

    VALID = [
        Valid(
            """
            import torch.nn as nn

            class CRNN(nn.Module):  # never wrapped in DataParallel
                def forward(self, x):
                    return x.permute(2, 0, 1)
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Seq(nn.Module):
                def forward(self, x):
                    return x.permute(0, 2, 1)  # the batch stays at dim 0

            model = nn.DataParallel(Seq())
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Seq(nn.Module):
                def forward(self, x):
                    return x.transpose(0, 1)  # [T, B, C], gathered along dim 1

            model = nn.DataParallel(Seq(), dim=1)
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Encoder(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.LSTM(32, 64)

                def forward(self, x):
                    x = x.permute(1, 0, 2)
                    output, _ = self.rnn(x)
                    return output[-1]  # last time step: [B, H]

            model = nn.DataParallel(Encoder())
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Seq(nn.Module):
                def forward(self, x):
                    y = x.transpose(0, 1)
                    y = y * 2
                    return y.transpose(0, 1)

            net = nn.DataParallel(Seq().cuda())
            """
        ),
        Valid(
            """
            import torch.nn as nn
            from torch.nn.parallel import data_parallel

            class Encoder(nn.Module):
                def __init__(self, ngpu):
                    super().__init__()
                    self.ngpu = ngpu
                    self.rnn = nn.LSTM(64, 128)

                def forward(self, x):
                    seq = x.transpose(0, 1)  # [T, B, C]
                    output, _ = data_parallel(self.rnn, seq, range(self.ngpu), dim=1)  # split along the batch
                    return output
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class CRNN(nn.Module):
                def __init__(self, ngpu):
                    super().__init__()
                    self.ngpu = ngpu
                    self.cnn = nn.Conv2d(1, 64, 3)
                    self.rnn = nn.LSTM(64, 32)

                def forward(self, images):
                    conv = nn.parallel.data_parallel(self.cnn, images, range(self.ngpu))  # batch-first here
                    seq = conv.squeeze(2).permute(2, 0, 1)
                    output, _ = self.rnn(seq)
                    return output.transpose(0, 1)
            """
        ),
        Valid(
            """
            import torch.nn as nn
            from torch.nn.parallel import data_parallel

            class Seq(nn.Module):
                def forward(self, x):
                    seq = x.transpose(0, 1)
                    return data_parallel(self.body, seq, [0, 1])  # its input's batch is at dim 1 already

            model = nn.DataParallel(Seq(), dim=1)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn

            class CRNN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.LSTM(256, 128, bidirectional=True)

                def forward(self, x):
                    conv = x.squeeze(2)
                    conv = conv.permute(2, 0, 1)
                    output, _ = self.rnn(conv)
                    return output

            model = nn.DataParallel(CRNN())
            """,
            line=10,
        ),
        Invalid(
            """
            import torch
            from torch.nn import DataParallel as DP
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    return torch.transpose(x, 0, 1)

            model = Net().cuda()
            model = DP(model)
            """,
            line=7,
        ),
        Invalid(
            """
            import torch.nn as nn
            from einops import rearrange

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = nn.Linear(64, 10)

                def forward(self, x):
                    y = rearrange(x, "b t c -> t b c")
                    return self.head(y)

            model = nn.DataParallel(Net())
            """,
            line=10,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    scores = x.t()
                    return scores, x

            model = nn.DataParallel(Net(), device_ids=[0, 1])
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.nn as nn

            class CRNN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.cnn = nn.Conv2d(1, 64, 3)

                def forward(self, images):
                    conv = self.cnn(images).squeeze(2)
                    return self._decode(conv)

                def _decode(self, conv):
                    seq = conv.permute(2, 0, 1)  # [W, B, C]
                    return seq

            model = nn.DataParallel(CRNN())
            """,
            line=13,
        ),
        Invalid(
            """
            import torch.nn as nn
            from torch.nn.parallel import data_parallel

            class Seq(nn.Module):
                def forward(self, x):
                    return x.transpose(0, 1)

            out = data_parallel(Seq(), batch, device_ids=[0, 1])
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.nn as nn
            from torch.nn.parallel import data_parallel as scatter_run

            class Encoder(nn.Module):
                def __init__(self, ngpu):
                    super().__init__()
                    self.ngpu = ngpu
                    self.rnn = nn.LSTM(64, 128)

                def forward(self, x):
                    seq = x.transpose(0, 1)  # [T, B, C] for the LSTM
                    output, _ = scatter_run(self.rnn, seq, range(self.ngpu))
                    return output
            """,
            line=12,
        ),
        Invalid(
            """
            import torch.nn as nn

            def parallel(model, inputs, ngpu):
                if ngpu > 1:
                    return nn.parallel.data_parallel(model, inputs, range(ngpu))
                return model(inputs)

            class CRNN(nn.Module):
                def __init__(self, ngpu):
                    super().__init__()
                    self.ngpu = ngpu
                    self.cnn = nn.Conv2d(1, 64, 3)
                    self.rnn = nn.LSTM(64, 32, bidirectional=True)

                def forward(self, images):
                    conv = parallel(self.cnn, images, self.ngpu).squeeze(2)
                    conv = conv.permute(2, 0, 1)  # [W, B, C]
                    output, _ = parallel(self.rnn, conv, self.ngpu)
                    return output
            """,
            line=18,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        """A file that defines a class the project wraps, or a `forward` and a call of `data_parallel`
        (or of a project function that forwards to it)."""
        wrapped = project.wraps_any(module_classes)
        return (wrapped or _may_scatter(text, project)) and Rule.applies_to(self, text, module_classes, project)

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference: Inference = Inference.of(ctx)
        reported = set()
        wrapped = {class_name: (forward, wraps) for class_name, forward, _, wraps in inference.wrapped_forwards()}
        scatters = _may_scatter(ctx.source, ctx.project)
        for class_name, model in inference.classes.items():
            forward, all_wraps = wrapped.get(class_name, (None, []))
            if forward is None and scatters:
                forward = next((s for s in block_body(model.node.body) if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None)
            if forward is None:
                continue
            layouts = ForwardLayouts(ctx, inference, class_name, forward)
            returned = layouts.run()
            wraps = [wrap for wrap in all_wraps if wrap.dim is not None]
            for layout, statement in returned:
                wrong = [wrap for wrap in wraps if wrap.dim != layout.batch_dim]
                if layout.mover is None or not wrong or layout.mover in reported:
                    continue
                reported.add(layout.mover)
                yield self._report(ctx, class_name, layout, statement, wrong[0])
            # `forward`'s input has its batch at dim 0 when DataParallel scatters along dim 0, or when
            # nothing wraps the class; a wrap along another dim (or one not known) puts it elsewhere.
            if any(wrap.dim != 0 for wrap in all_wraps):
                continue
            for scatter in layouts.scatters:
                if id(scatter.call) not in reported:
                    reported.add(id(scatter.call))
                    yield self._scatter_report(ctx, scatter)

    @staticmethod
    def _scatter_report(ctx: FileContext, scatter: Scatter) -> Report:
        layout = scatter.layout
        mover = ctx.short_code(layout.mover, 24)  # type: ignore[arg-type]
        where = "the last dim" if layout.batch_dim < 0 else f"dim {layout.batch_dim}"
        function = dotted(scatter.call.func) or "data_parallel"
        moved_at = f"line {ctx.line(layout.mover)}"  # type: ignore[arg-type]
        references: Tuple[FileReference, ...] = ()
        if scatter.helper is not None:  # where the helper calls `data_parallel`, in place of the mover's line
            filename, path, line = scatter.helper
            reference = FileReference.to(filename, path, line)
            references = (reference,)
            scattered, moved = f"along dim {scatter.dim} ({reference.text})", f"`{mover}`"
        else:
            scattered, moved = f"along dim {scatter.dim}", f"`{mover}` ({moved_at})"
        return Report(
            node=scatter.call,
            message=f"`{function}` scatters `{ctx.short_code(scatter.inputs, 20)}` {scattered}, but {moved} put its batch at {where}.",
            help=(
                f"Each GPU gets a slice of dim {scatter.dim} (of the time steps, for a sequence), not of the batch "
                f"({moved_at} moved it): scatter along the batch (`dim={layout.batch_dim}`), or before moving it."
            ),
            statement=scatter.statement,
            references=references,
        )

    @staticmethod
    def _report(ctx: FileContext, class_name: str, layout: Layout, returned: cst.Return, wrap: Wrap) -> Report:
        mover = ctx.short_code(layout.mover, 24)
        where = "the last dim" if layout.batch_dim < 0 else f"dim {layout.batch_dim}"
        wrapped_at = FileReference.to(wrap.filename, wrap.path, wrap.line)
        return Report(
            node=layout.mover,
            message=(
                f"`{mover}` puts the batch at {where} of `{class_name}`'s output; DataParallel gathers dim {wrap.dim} "
                f"({wrapped_at.text})."
            ),
            help=(
                f"Return the batch at dim {wrap.dim} (permute back before the `return` on line {ctx.line(returned)}) "
                "and permute after calling the wrapped model."
            ),
            statement=layout.mover_statement,
            references=(wrapped_at,),
        )
