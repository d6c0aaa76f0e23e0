"""Which modules may hold buffers: a DDP forward syncs them (a collective), one without buffers runs none.

A module holds buffers when something in it registers one: torch's batch and instance norms, a spectral
norm, `register_buffer`, a module loaded or built by another library. What a project class is made of
is read from its calls (`ExecutionModel.may_hold_buffers`); this module holds what torch's own names
say, and what a class's or function's source shows that its calls do not (`BufferEvidence`).
"""

from __future__ import annotations

import ast
from typing import Callable, Dict, Optional, Sequence, Set, Tuple

# torch names (last part) that make or are modules with buffers: running statistics, a spectral
# norm's power-iteration vectors; and the call that registers one.
BUFFER_NAMES = frozenset(
    {
        "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LazyBatchNorm1d", "LazyBatchNorm2d",
        "LazyBatchNorm3d", "_BatchNorm", "_NormBase", "spectral_norm", "convert_sync_batchnorm", "register_buffer",
    }
)  # fmt: skip
# Instance norms keep running statistics only when made with `track_running_stats=True` (the fifth argument).
INSTANCE_NORMS = frozenset({"InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LazyInstanceNorm1d", "LazyInstanceNorm2d", "LazyInstanceNorm3d"})
BUFFER_MAKING_NAMES = BUFFER_NAMES | INSTANCE_NORMS
# torch's calls make no buffers besides those BUFFER_NAMES names and those made elsewhere (below): layers,
# functions, init.
_TORCH = "torch."
# torch calls that hand back a module made elsewhere (loaded, quantized, parametrized): it may hold some.
_TORCH_MADE_ELSEWHERE = ("torch.load", "torch.hub.", "torch.jit.", "torch.package.", "torch.ao.", "torch.quantization.",
                         "torch.nn.quantized", "torch.nn.intrinsic", "torch.nn.utils.parametrize", "torch.fx.")  # fmt: skip
# Other modules whose functions make no module: the standard library's pure helpers, numpy, einops.
_WITHOUT_MODULES = frozenset(
    {
        "math", "numpy", "itertools", "functools", "collections", "logging", "warnings", "typing", "os", "re", "json",
        "random", "einops", "dataclasses", "abc", "operator", "string", "time", "sys", "inspect", "enum", "numbers",
        "builtins",
    }
)  # fmt: skip
# Methods that build a module from what they are called on (`AutoModel.from_pretrained(path)`).
CONSTRUCTING_METHODS = frozenset({"from_pretrained", "from_config", "from_name", "build", "build_model", "create_model", "load", "load_model", "instantiate"})
# torch's containers: what they are given becomes the module's parts.
_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})


def outside_call_may_make_buffers(qualified: str, builtins: frozenset) -> bool:
    """Whether a call of a name that is no project function or class may make a module with buffers."""
    last = qualified.rpartition(".")[2]
    if last in BUFFER_NAMES:
        return True
    if "." not in qualified:
        return qualified not in builtins
    if qualified == "copy.deepcopy":
        return True  # a copy of whatever module it is given
    if qualified.startswith(_TORCH_MADE_ELSEWHERE):
        return True
    if qualified.startswith(_TORCH):
        return False
    return qualified.split(".")[0] not in _WITHOUT_MODULES


def base_may_hold_buffers(qualified: str) -> bool:
    """Whether a base class from outside the project may bring buffers (`nn.Module` brings none)."""
    if qualified == "object":
        return False
    last = qualified.rpartition(".")[2]
    return not (qualified.startswith("torch.nn.") and last not in BUFFER_MAKING_NAMES)


class BufferEvidence:
    """What a module's classes and functions show, beyond their calls, that may give a module buffers:
    they name a torch module that holds buffers (`norm_layer=nn.BatchNorm2d`) or register one; call what
    they compute (`NORMS[kind](dim)`, `getattr(nn, name)(dim)`) other than a part of `self`, outside
    `forward`; name a base nobody knows; or keep a module they were given (`self.encoder = encoder`,
    then `self.encoder(x)`). Fed each node of one walk over the module, with the qualified name of the
    class or function holding it (`holder`), its scope's key, and the class of its `self`."""

    # The nodes `see` reads; names are read by `named`, where they are one of BUFFER_MAKING_NAMES.
    NODES = frozenset({ast.Call, ast.For, ast.AsyncFor, ast.comprehension, ast.Starred, ast.Assign, ast.AnnAssign})

    def __init__(self) -> None:
        self.marked: Set[str] = set()
        self.parameters: Dict[str, Set[str]] = {}  # a function's scope key → its parameters
        self.given: Dict[str, Set[str]] = {}  # a class → the attributes of `self` it sets from what it is given
        self.used: Dict[str, Set[str]] = {}  # a class → the attributes of `self` it uses as modules
        self.exempt: Set[int] = set()  # `nn.InstanceNorm2d` callees made without running statistics

    def enter(self, scope_key: str, parameters: Set[str]) -> None:
        self.parameters[scope_key] = parameters

    def mark(self, holder: str) -> None:
        self.marked.add(holder)

    def named(self, node: ast.AST, holder: str) -> None:
        """A name of BUFFER_MAKING_NAMES: an instance norm counts unless its call keeps no statistics."""
        if (node.id if isinstance(node, ast.Name) else node.attr) in BUFFER_NAMES or id(node) not in self.exempt:  # type: ignore[attr-defined]
            self.mark(holder)

    def see(self, node: ast.AST, holder: str, scope_key: str, owner: Callable[[], Optional[str]]) -> None:
        """`owner` gives the class of the scope's `self`, only where asked (it walks the scopes)."""
        if isinstance(node, ast.Call):
            self._call(node, holder, self.parameters.get(scope_key, set()), owner)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            self._use(node.iter, owner)
        elif isinstance(node, ast.Starred):
            self._use(node.value, owner)
        elif node.value is not None and _kept_targets(node):  # type: ignore[attr-defined]
            self._assign(node, holder, self.parameters.get(scope_key, set()), owner)

    def hiding(self, names: Sequence[str]) -> Tuple[str, ...]:
        """Of these classes and functions, those that may hide buffers (a finding inside counts for each
        scope it is in)."""
        marked = self.marked | {name for name, given in self.given.items() if given & self.used.get(name, set())}
        return tuple(name for name in names if any(found == name or found.startswith(name + ".") for found in marked))

    def _call(self, node: ast.Call, holder: str, parameters: Set[str], owner: Callable[[], Optional[str]]) -> None:
        func = node.func
        if _instance_norm_without_statistics(node):
            self.exempt.add(id(func))
        in_forward = holder.endswith(".forward") or ".forward." in holder
        if not isinstance(func, (ast.Name, ast.Attribute)) and not _of_self(func) and not in_forward:
            self.mark(holder)
        if _last(func) in ("add_module", "register_module", "setattr") and any(_reads(argument, parameters) for argument in node.args):
            self.mark(holder)  # a part it was given, added by name
        if isinstance(func, ast.Attribute) and _kept_name(func.value):
            self._use(func.value, owner)  # `self.encoder.forward_features(x)`
        else:
            self._use(func, owner)  # `self.encoder(x)`

    def _use(self, node: ast.AST, owner: Callable[[], Optional[str]]) -> None:
        if _kept_name(node):
            name = owner()
            if name is not None:
                self.used.setdefault(name, set()).add(node.attr)  # type: ignore[attr-defined]

    def _assign(self, node: ast.AST, holder: str, parameters: Set[str], owner: Callable[[], Optional[str]]) -> None:
        value = node.value  # type: ignore[attr-defined]
        name = owner()
        if name is None or not _reads(value, parameters):
            return
        if isinstance(value, ast.Call):
            if _last(value.func) in _CONTAINERS and any(_bare(argument, parameters) for argument in value.args):
                self.mark(holder)  # `self.blocks = nn.ModuleList(blocks)`: what it was given, inside a container
            return  # a part built from given sizes (`nn.Linear(dim, 2)`): its own call says what it makes
        self.given.setdefault(name, set()).update(t.attr for t in _kept_targets(node))  # type: ignore[attr-defined]


def _kept_targets(node: ast.AST) -> list:
    """The `self.<name>` targets of an assignment."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[attr-defined]
    return [target for target in targets if _kept_name(target)]


def _kept_name(node: ast.AST) -> bool:
    """`self.<name>`."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _reads(node: ast.AST, names: Set[str]) -> bool:
    return bool(names) and any(isinstance(inner, ast.Name) and inner.id in names for inner in ast.walk(node))


def _instance_norm_without_statistics(call: ast.Call) -> bool:
    """`nn.InstanceNorm2d(dim, affine=True)`: made without `track_running_stats`, it keeps no buffers."""
    if _last(call.func) not in INSTANCE_NORMS or len(call.args) >= 5 or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    for keyword in call.keywords:
        if keyword.arg is None or (keyword.arg == "track_running_stats" and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is False)):
            return False
    return True


def _of_self(node: ast.AST) -> bool:
    """Whether an expression reaches into `self` (`self.blocks[i]`, `self.heads[name]`): a part it has."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _bare(argument: ast.AST, parameters: set) -> bool:
    """`blocks` or `*blocks`: a parameter passed as it is."""
    if isinstance(argument, ast.Starred):
        argument = argument.value
    return isinstance(argument, ast.Name) and argument.id in parameters


def _last(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
