"""Which modules may hold buffers: a DDP forward syncs them (a collective), one without buffers runs none.

A module holds buffers when something in it registers one: torch's batch and instance norms, a spectral
norm, `register_buffer`, a module loaded or built by another library. What a project class is made of
is read from its calls (`ExecutionModel.may_hold_buffers`); this module holds what torch's own names
say, and what a class's or function's source shows that its calls do not (`hides_buffers`).
"""

from __future__ import annotations

import ast
from typing import Callable, Optional

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
# torch modules whose calls make no buffers besides those BUFFER_NAMES names: layers, functions, init.
_TORCH_WITHOUT_BUFFERS = ("torch.nn.", "torch.")
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
# Bases a module class takes from torch that add no buffers themselves.
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
    if qualified.startswith(_TORCH_WITHOUT_BUFFERS):
        return False
    return qualified.split(".")[0] not in _WITHOUT_MODULES


def base_may_hold_buffers(qualified: str) -> bool:
    """Whether a base class from outside the project may bring buffers (`nn.Module` brings none)."""
    if qualified == "object":
        return False
    last = qualified.rpartition(".")[2]
    return not (qualified.startswith("torch.nn.") and last not in BUFFER_NAMES | INSTANCE_NORMS)


def hides_buffers(node: ast.AST, qualify: Callable[[ast.AST], Optional[str]]) -> bool:
    """Whether a class or function may give a module buffers in a way its calls do not show: it names a
    torch module that holds buffers (`norm_layer=nn.BatchNorm2d`) or registers one; it calls what it
    computes (`NORMS[kind](dim)`, `getattr(nn, name)(dim)`) other than a part of `self`; a base it names
    is not known; or it keeps a module it was given (`self.encoder = encoder`, then `self.encoder(x)`)."""
    without_statistics = {id(call.func) for call in ast.walk(node) if isinstance(call, ast.Call) and _instance_norm_without_statistics(call)}
    # `forward` makes no parts: what it calls by a computed name (`ACT2FN[name](x)`) makes tensors.
    forwards = {id(inner) for method in ast.walk(node) if isinstance(method, ast.FunctionDef) and method.name == "forward" for inner in ast.walk(method)}
    for inner in ast.walk(node):
        name = inner.id if isinstance(inner, ast.Name) else inner.attr if isinstance(inner, ast.Attribute) else None
        if name in BUFFER_NAMES or (name in INSTANCE_NORMS and id(inner) not in without_statistics):
            return True
        if isinstance(inner, ast.Call) and not isinstance(inner.func, (ast.Name, ast.Attribute)) and not _of_self(inner.func) and id(inner) not in forwards:
            return True
        if isinstance(inner, ast.ClassDef) and any(qualify(base) is None for base in inner.bases):
            return True
    return isinstance(node, ast.ClassDef) and _keeps_given_module(node)


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


def _keeps_given_module(node: ast.ClassDef) -> bool:
    """Whether a class keeps something passed to its methods in `self` and uses it as a module: calls it or
    its methods, iterates it, or hands it to a container or `add_module`. A config kept and read
    (`self.h = h`, then `self.h.channels`) is none."""
    given = set()
    for method in node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = method.args
        parameters = {a.arg for a in (*arguments.posonlyargs, *arguments.args[1:], *arguments.kwonlyargs, arguments.vararg, arguments.kwarg) if a is not None}
        for statement in ast.walk(method):
            if not isinstance(statement, (ast.Assign, ast.AnnAssign)) or statement.value is None:
                continue
            read = {name.id for name in ast.walk(statement.value) if isinstance(name, ast.Name)} & parameters
            if not read:
                continue
            if isinstance(statement.value, ast.Call):
                if _last(statement.value.func) in _CONTAINERS and any(_bare(argument, parameters) for argument in statement.value.args):
                    return True  # `self.blocks = nn.ModuleList(blocks)`: what it was given, inside a container
                continue  # a part built from given sizes (`nn.Linear(dim, 2)`): its own call says what it makes
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            given.update(t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self")
        for call in ast.walk(method):
            if isinstance(call, ast.Call) and _last(call.func) in ("add_module", "register_module", "setattr"):
                if any(isinstance(name, ast.Name) and name.id in parameters for argument in call.args for name in ast.walk(argument)):
                    return True
    if not given:
        return False
    for inner in ast.walk(node):
        used = None
        if isinstance(inner, ast.Call):
            used = inner.func.value if isinstance(inner.func, ast.Attribute) and _kept(inner.func.value, given) else inner.func
        elif isinstance(inner, (ast.For, ast.comprehension)):
            used = inner.iter
        elif isinstance(inner, ast.Starred):
            used = inner.value
        if used is not None and _kept(used, given):
            return True
    return False


def _kept(node: ast.AST, given: set) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in given and isinstance(node.value, ast.Name) and node.value.id == "self"


def _bare(argument: ast.AST, parameters: set) -> bool:
    """`blocks` or `*blocks`: a parameter passed as it is."""
    if isinstance(argument, ast.Starred):
        argument = argument.value
    return isinstance(argument, ast.Name) and argument.id in parameters


def _last(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
