"""Where each statement of a program runs: in one process or in a process group, and on which ranks.

The question every DDP rule asks ("does every rank save here?", "do only some ranks reach this
barrier?") is answered here, once, from what the program does rather than from how it names things.

Pass 1 summarises each file that may take part in a distributed program (`summarize`, Python's `ast`):
its functions, the calls each makes under which branch conditions, where a process group starts, and
what each assignment, `return` and argument holds, as small symbolic expressions. The project's
`ExecutionModel` then

- evaluates those expressions (`Values`): which names hold a rank (global or per node), the world
  size, a test on them (`is_master = rank == 0`), following assignments, parameters and `return`s
  across files;
- finds each program's entry (a script, or a function nothing in the project calls that starts a
  group) and how it is launched: once (`python train.py`, and `mp.spawn` starts the workers) or on
  every rank (`torchrun`);
- learns the mode test from the program itself: the conditions under which it starts its process
  group hold on every rank of a group, so the other branch of the same condition runs in one process;
- propagates along the resolved calls the worlds in which each function may run.

A world is one process (`ONE`), or a process of a group: global rank 0 (`ZERO`), local rank 0 of
another node (`LEAD`), or any other rank (`REST`). A condition, and where a statement runs, is a
truth value per world (`Truth`): T always, F never, U either way but alike on every rank, Q unknown
and possibly different between ranks. Code that no entry reaches through resolved calls has no
answer (None): the rules stay silent there.
"""

from __future__ import annotations

import ast
import builtins
import re
import dataclasses
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from dplint.analysis.buffers import BUFFER_MAKING_NAMES, CONSTRUCTING_METHODS, BufferEvidence, base_may_hold_buffers, outside_call_may_make_buffers
from dplint.analysis.modules import absolute_module
from dplint.analysis.torch_api import DISTRIBUTED_DATA_PARALLEL, DISTRIBUTED_SAMPLERS, FULLY_SHARD, FULLY_SHARDED_DATA_PARALLEL, GROUP_RANK_GETTERS, INIT_PROCESS_GROUP

# ----- truth per world --------------------------------------------------------------------------------

WORLDS = ("ONE", "ZERO", "LEAD", "REST")
GROUP_WORLDS = slice(1, 4)


class Truth(str):
    """Four letters, one per world of `WORLDS`: T, F, U (either, alike on every rank) or Q (unknown)."""

    __slots__ = ()

    def __and__(self, other: "Truth") -> "Truth":  # type: ignore[override]
        return Truth("".join(_AND[a + b] for a, b in zip(self, other)))

    def __or__(self, other: "Truth") -> "Truth":  # type: ignore[override]
        """Either holds; for where code runs, reached along either of two paths."""
        return Truth("".join(_OR[a + b] for a, b in zip(self, other)))

    def __invert__(self) -> "Truth":
        return Truth(self.translate(_NOT))

    def either(self, other: "Truth") -> "Truth":
        """One value or the other (a name assigned in two places)."""
        return Truth("".join(_EITHER[a + b] for a, b in zip(self, other)))


def _table(rule: Callable[[str, str], str]) -> Dict[str, str]:
    return {a + b: rule(a, b) for a in "TFUQ" for b in "TFUQ"}


_AND = _table(lambda a, b: "F" if "F" in (a, b) else "T" if a == b == "T" else "Q" if "Q" in (a, b) else "U")
_OR = _table(lambda a, b: "T" if "T" in (a, b) else "F" if a == b == "F" else "Q" if "Q" in (a, b) else "U")
_EITHER = _table(lambda a, b: a if a == b else "Q" if "Q" in (a, b) else "U")
_NOT = str.maketrans("TF", "FT")

ALWAYS = Truth("TTTT")
NEVER = Truth("FFFF")
UNIFORM = Truth("UUUU")
ONE_PROCESS = Truth("TFFF")
WORKERS = Truth("FTTT")  # the processes `mp.spawn` starts
VARIES = Truth("UQQQ")  # one process has one answer; the ranks of a group may differ


@dataclass(frozen=True)
class Where:
    """Where a statement runs: the truth per world that it runs there."""

    truth: Truth

    @property
    def in_one_process(self) -> bool:
        return self.truth[0] != "F"

    @property
    def in_group(self) -> bool:
        return any(letter != "F" for letter in self.truth[GROUP_WORLDS])

    @property
    def on_every_rank(self) -> bool:
        """In a process group, every rank runs it (or, under conditions alike on every rank, may)."""
        return all(letter in "TU" for letter in self.truth[GROUP_WORLDS])

    @property
    def on_some_ranks_only(self) -> bool:
        """In a process group, it is known to run on some ranks and not on others."""
        ranks = self.truth[GROUP_WORLDS]
        return "F" in ranks and any(letter in "TU" for letter in ranks)

    @property
    def ranks(self) -> str:
        """'all', 'global rank 0', 'local rank 0', 'ranks other than 0', 'some' or 'none': the ranks of a group that run it."""
        ranks = self.truth[GROUP_WORLDS]
        if ranks == "FFF":
            return "none"
        if all(letter in "TU" for letter in ranks):
            return "all"
        if "Q" in ranks:
            return "some"
        return {"TFF": "global rank 0", "UFF": "global rank 0", "FTF": "local rank 0", "FUF": "local rank 0"}.get(
            ranks.replace("U", "T") if ranks.count("F") == 1 and ranks[2] == "F" else ranks,
            "local rank 0" if ranks[2] == "F" else "ranks other than 0" if ranks[0] == "F" else "some",
        )


# ----- symbolic expressions ---------------------------------------------------------------------------
#
# An expression is a tuple: ("c", value) a constant; ("v", key) a variable; ("call", callee, args,
# keywords); ("attr", receiver, name) an attribute of a value that is not a variable of its own;
# ("env", name) an environment variable; ("has", name) `name in os.environ`; ("cmp", operator, left,
# right); ("and", ...), ("or", ...), ("not", x); ("ifexp", test, body, orelse); ("bin", operator, left,
# right); ("fmt", parts...);
# ("tuple", items...); ("item", x, index) with an int, an expression, or None for what a loop over x
# takes; ("items", x) a comprehension over x; ("u",) anything else.
#
# Variable keys: "L:<function>:<name>" a local or parameter, "G:<module>:<name>" a module's global,
# "S:<class>:<attribute path>" an attribute of `self`, "A:<text>" an attribute path of any other
# object (`args.rank`: the same object is passed from function to function), "Q:<qualified name>" a
# name imported from another module.
#
# A callee: ("q", qualified name) resolved through the file's imports and definitions, or ("m",
# receiver expression, method name), or ("super", class, method name).

Expr = tuple
Guard = Tuple[Tuple[Expr, bool], ...]
UNKNOWN: Expr = ("u",)

_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Is: "is",
            ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}  # fmt: skip
_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Mod: "%", ast.FloorDiv: "//", ast.Div: "/"}
_ENVIRON_READS = frozenset({"os.environ.get", "os.getenv", "os.environ.__getitem__", "os.environ.setdefault"})
_TRANSPARENT = frozenset({"int", "str", "bool", "float"})
# Calls that start the given function as the processes of a group: spawn's process index, or the
# launcher's, is its first argument.
SPAWNERS = frozenset(
    {
        "torch.multiprocessing.spawn", "torch.multiprocessing.start_processes", "torch.multiprocessing.spawn.spawn",
        "torch.multiprocessing.spawn.start_processes", "detectron2.engine.launch", "detectron2.engine.launch.launch",
    }
)  # fmt: skip
_PROCESS_CLASSES = frozenset({"multiprocessing.Process", "torch.multiprocessing.Process", "multiprocessing.context.Process"})
# The frameworks' classes, by every name a program may build one with, and what it builds (an object of
# that class, as `Evaluation.value` knows it); `deepspeed.initialize` hands back its engine first.
ACCELERATOR_CLASS = "accelerate.Accelerator"
DEEPSPEED_ENGINE = "deepspeed.DeepSpeedEngine"
_FRAMEWORK_CLASSES: Mapping[str, str] = {
    **dict.fromkeys(("accelerate.Accelerator", "accelerate.accelerator.Accelerator"), ACCELERATOR_CLASS),
    **dict.fromkeys(
        ("lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.trainer.Trainer", "pytorch_lightning.Trainer"),
        "lightning.Trainer",
    ),
    **dict.fromkeys(("lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric"), "lightning.Fabric"),
    "deepspeed.initialize": DEEPSPEED_ENGINE,
}


def builders_of(object_class: str) -> FrozenSet[str]:
    """The qualified names a program builds an object of the framework's class with."""
    return frozenset(name for name, built in _FRAMEWORK_CLASSES.items() if built == object_class)


# Calls that start the process group (or a library's setup that does).
GROUP_STARTERS = INIT_PROCESS_GROUP | frozenset(
    {
        "mmcv.runner.init_dist", "mmcv.runner.dist_utils.init_dist", "mmengine.dist.init_dist",
        "deepspeed.init_distributed", "deepspeed.comm.init_distributed", "horovod.torch.init",
        "colossalai.launch", "colossalai.launch_from_torch", "colossalai.launch_from_slurm",
        "accelerate.PartialState", "accelerate.state.PartialState",
    }
    # The frameworks join the group their launcher set up when their object is built (Lightning's
    # Trainer and Fabric when they launch: every rank runs the script that built them).
    | {name for name in _FRAMEWORK_CLASSES if name != "deepspeed.initialize"}  # a wrap, below
)  # fmt: skip
# Wraps that need a process group: a program that makes one runs in a group, wherever it was started.
GROUP_WRAPPERS = (
    DISTRIBUTED_DATA_PARALLEL | FULLY_SHARDED_DATA_PARALLEL | FULLY_SHARD | {"apex.parallel.DistributedDataParallel", "deepspeed.initialize"}
)
_BUILTINS = frozenset(dir(builtins))
# Methods of a module that return the module itself.
_SAME_MODULE_METHODS = frozenset({"cuda", "cpu", "to", "half", "float", "double", "bfloat16", "train", "eval", "requires_grad_", "share_memory"})
_EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


def split(test: Expr, holds: bool) -> List[Tuple[Expr, bool]]:
    """A condition as literals that must all hold: `a and b` is two, `not (a or b)` too."""
    if test[0] == "not":
        return split(test[1], not holds)
    if (test[0] == "and" and holds) or (test[0] == "or" and not holds):
        return [literal for part in test[1:] for literal in split(part, holds)]
    return [(test, holds)]


class _Scope:
    """The names one function (or the module's top level) binds, for the keys of its variables."""

    def __init__(self, key: str, parent: Optional["_Scope"], owner: Optional[str]) -> None:
        self.key = key  # "<module>:<qualified name in the module>"
        self.parent = parent
        self.owner = owner  # the qualified class a method belongs to
        self.locals: Set[str] = set()
        self.globals: Set[str] = set()
        self.imported: Set[str] = set()  # names bound only by an import: they name what they import
        self.nested: Dict[str, str] = {}  # functions defined in this function → qualified
        self.loop_targets: Set[str] = set()  # names a `for` binds: an item each time, whose fields are its own


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _module_level_definitions(body: Sequence[ast.stmt]) -> Iterator[ast.AST]:
    """The functions and classes a module's statements define as its globals: at its top level, and
    inside its top-level `if`, `try`, `with` and loop blocks (`if TYPE_CHECKING:`, `try: ... except
    ImportError:`), which bind module names just the same."""
    for node in body:
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            yield from _module_level_definitions([*node.body, *getattr(node, "orelse", ()), *getattr(node, "finalbody", ())])
            for handler in getattr(node, "handlers", ()):
                yield from _module_level_definitions(handler.body)
        elif isinstance(node, ast.Match):
            for case in node.cases:
                yield from _module_level_definitions(case.body)


class Symbols:
    """Turns a file's expressions into symbolic ones, resolving names through its scopes and imports.

    One walk over the tree finds every function (the module's top level first, then each function and
    method, nested ones too, by qualified name), the names each binds, and the file's imports."""

    def __init__(self, tree: ast.Module, module: str, package: str) -> None:
        self.module = module
        self.aliases: Dict[str, str] = {}
        self.modules: Set[str] = set()  # the names `import` binds to a module
        self.star_modules: List[str] = []  # the modules of `from X import *`, whose names the module may call
        self.defined: Dict[str, str] = {}  # top-level function and class names → qualified
        self.module_scope = _Scope(f"{module}:<module>", None, None)
        # (qualified name, node, scope, class) of the module's top level and of every function
        self.functions: List[Tuple[str, ast.AST, _Scope, Optional[str]]] = [(module, tree, self.module_scope, None)]
        self.classes: List[Tuple[str, ast.ClassDef, _Scope]] = []  # (qualified name, node, the scope it is in)
        self.calls: Dict[int, List[ast.Call]] = {}  # id of a statement → the calls in its own expressions (not in lambdas)
        self.buffer_evidence = BufferEvidence()  # what may give a class buffers that its calls do not show
        for node in _module_level_definitions(tree.body):
            self.defined[node.name] = f"{module}.{node.name}"
        self._walk(tree, package)
        for name, node, scope in self.classes:
            if not all(self.qualified(base, scope) for base in node.bases):
                self.buffer_evidence.mark(name)  # a base nobody here knows may bring buffers
        for _, _, scope, _ in self.functions:
            scope.locals -= scope.globals
            scope.imported -= scope.locals | scope.globals

    def _walk(self, tree: ast.Module, package: str) -> None:
        # (node, the scope its names bind in, the qualified name of what holds it, the class it is directly
        # in, the statement it is part of)
        pending: List[Tuple[ast.AST, _Scope, str, Optional[str], Optional[ast.AST]]] = [
            (child, self.module_scope, self.module, None, None) for child in tree.body
        ]
        evidence = self.buffer_evidence
        while pending:
            node, scope, holder, in_class, statement = pending.pop()
            if isinstance(node, ast.stmt):
                statement = node
            elif isinstance(node, ast.Call):
                self.calls.setdefault(id(statement), []).append(node)
            kind = type(node)
            if kind is ast.Name or kind is ast.Attribute:
                if (node.id if kind is ast.Name else node.attr) in BUFFER_MAKING_NAMES:  # type: ignore[attr-defined]
                    evidence.named(node, holder)
            elif kind in BufferEvidence.NODES:
                evidence.see(node, holder, scope.key, lambda scope=scope: _self_class("self", scope))
            if isinstance(node, _FUNCTIONS):
                name = f"{holder}.{node.name}"
                if in_class is None:
                    scope.locals.add(node.name)
                    if scope is not self.module_scope:
                        scope.nested[node.name] = name
                inner = _Scope(f"{self.module}:{name[len(self.module) + 1:]}", scope, in_class)
                arguments = node.args
                for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg):
                    if argument is not None:
                        inner.locals.add(argument.arg)
                evidence.enter(inner.key, inner.locals - {"self"})
                self.functions.append((name, node, inner, in_class))
                pending.extend((child, scope, holder, None, node) for child in (*node.decorator_list, *arguments.defaults, *arguments.kw_defaults) if child)
                pending.extend((child, inner, name, None, None) for child in node.body)
            elif isinstance(node, ast.ClassDef):
                if in_class is None:
                    scope.locals.add(node.name)
                name = f"{holder}.{node.name}"
                self.classes.append((name, node, scope))
                pending.extend((child, scope, holder, None, node) for child in (*node.decorator_list, *node.bases))
                # A class body's own names are class attributes, which its methods never read by name.
                body_scope = _Scope(scope.key, scope, None)
                for child in node.body:
                    pending.append((child, scope, name, name, None) if isinstance(child, _FUNCTIONS) else (child, body_scope, name, None, None))
            elif isinstance(node, ast.Global):
                scope.globals.update(node.names)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                scope.loop_targets.update(name.id for name in ast.walk(node.target) if isinstance(name, ast.Name))
            elif isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Store):
                    scope.locals.add(node.id)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    self.aliases[bound] = alias.name if alias.asname else bound
                    self.modules.add(bound)
                    scope.imported.add(bound)
            elif isinstance(node, ast.ImportFrom):
                base = absolute_module(package, node.level, node.module or "")
                for alias in node.names:
                    if alias.name == "*":
                        self.star_modules.append(base)
                    else:
                        self.aliases[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name
                        scope.imported.add(alias.asname or alias.name)
            if not isinstance(node, (*_FUNCTIONS, ast.ClassDef, ast.Lambda, ast.Import, ast.ImportFrom, ast.Global)):
                pending.extend((child, scope, holder, in_class, statement) for child in ast.iter_child_nodes(node))

    # -- names --

    def variable(self, name: str, scope: _Scope) -> Expr:
        current: Optional[_Scope] = scope
        while current is not None:
            if name in current.locals and current is not self.module_scope:
                if name in current.nested:
                    return ("ref", current.nested[name])
                return ("v", f"L:{current.key}:{name}")
            if name in current.imported and name in self.aliases:
                return ("ref", self.aliases[name])
            if name in current.globals:
                break
            current = current.parent
        if name in self.defined:
            return ("ref", self.defined[name])
        if name in self.aliases and name not in self.module_scope.locals:  # not rebound at the top level
            return ("ref", self.aliases[name])
        if name in _BUILTINS and name not in self.module_scope.locals:
            return ("ref", name)
        return ("v", f"G:{self.module}:{name}")

    def qualified(self, node: ast.AST, scope: _Scope) -> Optional[str]:
        """The qualified name of a name or attribute chain whose head is imported or defined at the top."""
        parts: List[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        head = self.variable(node.id, scope)
        if head[0] != "ref":
            return None
        return ".".join([head[1], *reversed(parts)])

    # -- expressions --

    def expr(self, node: Optional[ast.AST], scope: _Scope) -> Expr:
        if node is None:
            return ("c", None)
        if isinstance(node, ast.Constant):
            value = node.value
            return ("c", value) if isinstance(value, (int, float, str, bool, type(None))) else UNKNOWN
        if isinstance(node, ast.Name):
            owner = _self_class(node.id, scope) if node.id == "self" else None
            if owner is not None:
                return ("self", owner)
            found = self.variable(node.id, scope)
            return ("v", "Q:" + found[1]) if found[0] == "ref" else found
        if isinstance(node, ast.Attribute):
            return self._attribute(node, scope)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return ("not", self.expr(node.operand, scope))
            if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float)):
                return ("c", -node.operand.value)
            return ("bin", "-", ("c", 0), self.expr(node.operand, scope)) if isinstance(node.op, ast.USub) else UNKNOWN
        if isinstance(node, ast.BoolOp):
            return ("and" if isinstance(node.op, ast.And) else "or", *(self.expr(value, scope) for value in node.values))
        if isinstance(node, ast.Compare):
            return self._compare(node, scope)
        if isinstance(node, ast.BinOp):
            operator = _BINARY.get(type(node.op))
            if operator is None:
                return UNKNOWN
            return ("bin", operator, self.expr(node.left, scope), self.expr(node.right, scope))
        if isinstance(node, ast.Call):
            return self.call(node, scope)
        if isinstance(node, ast.JoinedStr):
            return ("fmt", *(self.expr(value.value, scope) for value in node.values if isinstance(value, ast.FormattedValue)))
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return ("tuple", *(self.expr(element, scope) for element in node.elts))
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and len(node.generators) == 1:
            # `[i for i in range(first, last)]`: items of what it iterates (its own names are its own).
            return ("items", self.expr(node.generators[0].iter, scope))
        if isinstance(node, ast.Subscript):
            return self._subscript(node, scope)
        if isinstance(node, ast.IfExp):
            return ("ifexp", self.expr(node.test, scope), self.expr(node.body, scope), self.expr(node.orelse, scope))
        if isinstance(node, ast.NamedExpr):
            return self.expr(node.value, scope)
        return UNKNOWN

    def _attribute(self, node: ast.Attribute, scope: _Scope) -> Expr:
        parts: List[str] = []
        base: ast.AST = node
        while isinstance(base, ast.Attribute):
            parts.append(base.attr)
            base = base.value
        path = ".".join(reversed(parts))
        if isinstance(base, ast.Name):
            owner = _self_class(base.id, scope)
            if owner is not None:
                return ("v", f"S:{owner}:{path}")
            if base.id in self.modules:
                return ("v", f"Q:{self.aliases[base.id]}.{path}")
            if base.id not in scope.loop_targets:
                return ("v", f"A:{base.id}.{path}")
        return ("attr", self.expr(base, scope), path)

    def _compare(self, node: ast.Compare, scope: _Scope) -> Expr:
        parts: List[Expr] = []
        left = node.left
        for operator, right in zip(node.ops, node.comparators):
            name = _COMPARE[type(operator)]
            if name in ("in", "not in") and _is_environ(right):
                key = left.value if isinstance(left, ast.Constant) and isinstance(left.value, str) else None
                found: Expr = ("has", key)
                parts.append(found if name == "in" else ("not", found))
            else:
                parts.append(("cmp", name, self.expr(left, scope), self.expr(right, scope)))
            left = right
        return parts[0] if len(parts) == 1 else ("and", *parts)

    def _subscript(self, node: ast.Subscript, scope: _Scope) -> Expr:
        index = node.slice
        if _is_environ(node.value):
            return ("env", index.value if isinstance(index, ast.Constant) and isinstance(index.value, str) else None)
        if isinstance(index, ast.Constant) and isinstance(index.value, int):
            return ("item", self.expr(node.value, scope), index.value)
        if isinstance(index, ast.Constant) and isinstance(index.value, str) and isinstance(node.value, (ast.Name, ast.Attribute)) and not (
            isinstance(node.value, ast.Name) and node.value.id in scope.loop_targets
        ):
            # `cfg["local_rank"]`: a dictionary entry, named like an attribute.
            inner = self.expr(node.value, scope)
            if inner[0] == "v":
                return ("v", f"{inner[1]}.{index.value}" if inner[1].startswith(("A:", "S:", "Q:")) else f"A:{inner[1].rpartition(':')[2]}.{index.value}")
        if isinstance(index, ast.Slice):
            parts = (index.lower, index.upper, index.step)
            return ("item", self.expr(node.value, scope), ("tuple", *(self.expr(part, scope) for part in parts if part is not None)))
        return ("item", self.expr(node.value, scope), self.expr(index, scope))

    def callee(self, func: ast.AST, scope: _Scope) -> Optional[Expr]:
        qualified = self.qualified(func, scope)
        if qualified is not None:
            return ("q", qualified)
        head = func
        while isinstance(head, ast.Attribute):
            head = head.value
        if isinstance(head, ast.Name) and head.id in self.aliases and head.id in self.module_scope.locals and isinstance(func, ast.Attribute):
            # `trainer = trainer.Trainer(cfg)` at the top level: the name is the module, then the instance.
            imported = ".".join([self.aliases[head.id], *_attribute_path(func)[1:]])
            return ("either", ("q", imported), ("m", self.expr(func.value, scope), func.attr))
        if isinstance(func, ast.Attribute):
            receiver = func.value
            if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
                owner = _self_class("self", scope)
                return ("super", owner, func.attr) if owner is not None else None
            return ("m", self.expr(receiver, scope), func.attr)
        if isinstance(func, ast.Name):
            return ("m", self.expr(func, scope), "__call__")
        return None

    def call(self, node: ast.Call, scope: _Scope) -> Expr:
        callee = self.callee(node.func, scope)
        if callee is None:
            return UNKNOWN
        if callee[0] == "q":
            name = callee[1]
            if name in _ENVIRON_READS or name.endswith("os.environ.get"):
                first = node.args[0] if node.args else None
                key = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
                default = self.expr(node.args[1], scope) if len(node.args) > 1 else ("c", None)
                return ("or", ("env", key), default) if default != ("c", None) else ("env", key)
            if name in _TRANSPARENT and len(node.args) == 1:
                return self.expr(node.args[0], scope)
        return ("call", callee, *self.call_arguments(node, scope))

    def call_arguments(self, node: ast.Call, scope: _Scope) -> Tuple[Tuple[Expr, ...], Tuple[Tuple[str, Expr], ...]]:
        """What a call passes: its positional arguments, and its keywords (`**` for an unpacked dict, and
        `*` when a `*args` leaves the positions after it unknown)."""
        arguments = tuple(self.expr(argument, scope) for argument in node.args if not isinstance(argument, ast.Starred))
        keywords = tuple((keyword.arg or "**", self.expr(keyword.value, scope)) for keyword in node.keywords)
        if any(isinstance(argument, ast.Starred) for argument in node.args):
            keywords += (("*", UNKNOWN),)
        return arguments, keywords


def _attribute_path(node: ast.AST) -> List[str]:
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return list(reversed(parts))


def _self_class(name: str, scope: _Scope) -> Optional[str]:
    """The class whose instance `name` is, where it is the `self` of a method (or of one a closure is in)."""
    current: Optional[_Scope] = scope
    while current is not None:
        if name in current.locals:
            return current.owner if name == "self" else None
        current = current.parent
    return None


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"


# ----- a function's statements, each with the conditions it runs under --------------------------------


def _exits(body: Sequence[ast.stmt]) -> bool:
    """Whether a block always leaves the code after it: `return`, `raise`, `sys.exit()`, `continue`..."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        func = last.value.func
        name = func.id if isinstance(func, ast.Name) else f"{getattr(func.value, 'id', '')}.{func.attr}" if isinstance(func, ast.Attribute) else ""
        return name in _EXIT_CALLS
    if isinstance(last, ast.If):
        return _exits(last.body) and _exits(last.orelse)
    return False


def _after_if(statement: ast.If, test: Expr, symbols: Symbols, scope: _Scope) -> Guard:
    """The literals that hold after an `if` whose branches may leave: `if a: return` … `elif b: return`."""
    body_exits, else_exits = _exits(statement.body), _exits(statement.orelse)
    if body_exits and not else_exits:
        after = tuple(split(test, False))
        if len(statement.orelse) == 1 and isinstance(statement.orelse[0], ast.If):
            inner = statement.orelse[0]
            after += _after_if(inner, symbols.expr(inner.test, scope), symbols, scope)
        return after
    if else_exits and not body_exits:
        return tuple(split(test, True))
    if not statement.orelse and len(statement.body) == 1 and isinstance(statement.body[0], ast.If):
        # `if distributed: if rank != 0: return`: after it, not both hold.
        inner = statement.body[0]
        if _exits(inner.body) and not inner.orelse:
            return tuple(split(("and", test, symbols.expr(inner.test, scope)), False))
    return ()


def guarded_statements(body: Sequence[ast.stmt], symbols: Symbols, scope: _Scope, guard: Guard = ()) -> Iterator[Tuple[ast.stmt, Guard]]:
    """Every statement of a function's body (not of the functions and classes it defines), in order,
    with the literals that hold whenever it runs: the tests of the branches it is in, and of the early
    exits (`if not is_master: return`, `assert not distributed`) above it in its block."""
    for statement in body:
        yield statement, guard
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(statement, ast.If):
            test = symbols.expr(statement.test, scope)
            yield from guarded_statements(statement.body, symbols, scope, guard + tuple(split(test, True)))
            yield from guarded_statements(statement.orelse, symbols, scope, guard + tuple(split(test, False)))
            guard = guard + _after_if(statement, test, symbols, scope)
        elif isinstance(statement, ast.While):
            test = symbols.expr(statement.test, scope)
            yield from guarded_statements(statement.body, symbols, scope, guard + tuple(split(test, True)))
            yield from guarded_statements(statement.orelse, symbols, scope, guard)
        elif isinstance(statement, ast.Assert):
            guard = guard + tuple(split(symbols.expr(statement.test, scope), True))
        elif isinstance(statement, ast.Try) or type(statement).__name__ == "TryStar":
            for block in (statement.body, *(handler.body for handler in statement.handlers), statement.orelse, statement.finalbody):  # type: ignore[attr-defined]
                yield from guarded_statements(block, symbols, scope, guard)
        elif isinstance(statement, ast.Match):
            for case in statement.cases:
                yield from guarded_statements(case.body, symbols, scope, guard)
        else:
            for name in ("body", "orelse"):
                yield from guarded_statements(getattr(statement, name, ()), symbols, scope, guard)


# ----- pass 1: a file's summary ---------------------------------------------------------------------


@dataclass(frozen=True)
class CallSite:
    callee: Expr
    guard: Guard
    line: int
    arguments: Tuple[Expr, ...] = ()
    keywords: Tuple[Tuple[str, Expr], ...] = ()
    spawn: bool = False  # the callee is started as the processes of a group (its first argument: the index)
    processes: Optional[Expr] = None  # for a spawn, how many processes it starts (`nprocs`)
    # For a function passed to a project function that spawns it (`run(worker, n)`): that spawn, in its
    # own function's terms (its `args=` and `nprocs`).
    spawned_by: Optional["CallSite"] = None
    # Functions passed as arguments (position, callee): a project function may start one (`launch(main)`).
    functions: Tuple[Tuple[int, Expr], ...] = ()


@dataclass(frozen=True)
class FunctionSummary:
    name: str  # the qualified name: "pkg.train.main", "pkg.train.Trainer.fit"; "pkg.train" for the module's top level
    line: int
    end_line: int
    params: Tuple[str, ...] = ()
    defaults: Tuple[Tuple[str, Expr], ...] = ()
    owner: Optional[str] = None  # the class of a method
    calls: Tuple[CallSite, ...] = ()
    starts: Tuple[Tuple[Guard, int], ...] = ()  # where it starts a process group (a call, under a guard)
    wraps: Tuple[Tuple[Guard, int], ...] = ()  # where it wraps a model in DDP/FSDP
    assigns: Tuple[Tuple[str, Guard, Expr], ...] = ()  # variable key, the conditions it is assigned under, value
    returns: Tuple[Tuple[Guard, Expr], ...] = ()  # what it returns, under which conditions
    # Its parameters it starts as a group's processes: each spawn of one, with the parameter's position.
    parameter_spawns: Tuple[Tuple[int, CallSite], ...] = ()
    decorators: Tuple[str, ...] = ()
    main_guard: Optional[Guard] = None  # the module's top level: the guard of its `__main__` block


@dataclass(frozen=True)
class ExecutionSummary:
    module: str
    functions: Tuple[FunctionSummary, ...] = ()
    classes: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()  # qualified class → its bases, qualified
    aliases: Tuple[Tuple[str, str], ...] = ()  # names the module imports: how others reach re-exports
    star_imports: Tuple[str, ...] = ()  # the modules of its `from X import *`
    # It may run as a program: a `__main__` block, or calls at its top level (where no project file imports it).
    script: bool = False
    # Its classes and functions whose source may give a module buffers that their calls do not show.
    hides_buffers: Tuple[str, ...] = ()


def summarize(tree: ast.Module, module: str, package: str) -> ExecutionSummary:
    symbols = Symbols(tree, module, package)
    functions = [_summarize_body(node, name, node.body, symbols, scope, owner) for name, node, scope, owner in symbols.functions]  # type: ignore[attr-defined]
    classes = [
        (name, tuple(base for base in (symbols.qualified(b, scope) for b in node.bases) if base))
        for name, node, scope in symbols.classes
    ]
    hiding = symbols.buffer_evidence.hiding([name for name, _, _ in symbols.classes] + [name for name, _, _, owner in symbols.functions[1:] if owner is None])
    top = functions[0]
    script = top.main_guard is not None or any(
        isinstance(node, ast.Call)
        for statement in tree.body
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))
        for node in ast.walk(statement)
    )
    return ExecutionSummary(
        module, tuple(functions), tuple(classes), tuple(sorted(symbols.aliases.items())), star_imports=tuple(symbols.star_modules), script=script,
        hides_buffers=tuple(hiding),
    )


def _summarize_body(node: ast.AST, name: str, body: Sequence[ast.stmt], symbols: Symbols, scope: _Scope, owner: Optional[str]) -> FunctionSummary:
    calls: List[CallSite] = []
    starts: List[Tuple[Guard, int]] = []
    wraps: List[Tuple[Guard, int]] = []
    assigns: List[Tuple[str, Guard, Expr]] = []
    returns: List[Tuple[Guard, Expr]] = []
    parameter_spawns: List[Tuple[int, CallSite]] = []
    params: Tuple[str, ...] = ()
    defaults: List[Tuple[str, Expr]] = []
    decorators: Tuple[str, ...] = ()
    main_guard: Optional[Guard] = None
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        arguments = node.args
        positional = [*arguments.posonlyargs, *arguments.args]
        params = tuple(argument.arg for argument in positional)
        for argument, default in zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults):
            defaults.append((argument.arg, symbols.expr(default, scope.parent or scope)))
        decorators = tuple(
            symbols.qualified(decorator.func if isinstance(decorator, ast.Call) else decorator, scope.parent or scope)
            or _last_name(decorator.func if isinstance(decorator, ast.Call) else decorator)
            for decorator in node.decorator_list
        )
    for statement, guard in guarded_statements(body, symbols, scope):
        if isinstance(node, ast.Module) and isinstance(statement, ast.If) and _is_main_test(statement.test):
            main_guard = guard
        if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            value = symbols.expr(statement.value, scope)
            if isinstance(statement, ast.AugAssign):
                value = ("bin", _BINARY.get(type(statement.op), "?"), symbols.expr(statement.target, scope), value)
            for target in targets:
                assigns.extend((key, guard, bound) for key, bound in _bindings(target, value, symbols, scope))
        elif isinstance(statement, (ast.For, ast.AsyncFor)):
            assigns.extend((key, guard, bound) for key, bound in _loop_bindings(statement, symbols, scope))
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            for item in statement.items:
                if item.optional_vars is not None:
                    bindings = _bindings(item.optional_vars, symbols.expr(item.context_expr, scope), symbols, scope)
                    assigns.extend((key, guard, bound) for key, bound in bindings)
        elif isinstance(statement, ast.Return) and statement.value is not None:
            returns.append((guard, symbols.expr(statement.value, scope)))
        for inner in symbols.calls.get(id(statement), ()):
            callee = symbols.callee(inner.func, scope)
            if callee is None:
                continue
            line = inner.lineno
            qualified = callee[1] if callee[0] == "q" else ""
            arguments, keywords = symbols.call_arguments(inner, scope)
            if qualified in GROUP_STARTERS:
                starts.append((guard, line))
            if qualified in GROUP_WRAPPERS:
                wraps.append((guard, line))
            target = None
            if qualified in SPAWNERS and inner.args:
                target = inner.args[0]
            elif qualified in _PROCESS_CLASSES:
                target = next((keyword.value for keyword in inner.keywords if keyword.arg == "target"), None)
            if target is not None:
                spawned_callee = symbols.callee(target, scope)
                rest = tuple(symbols.expr(a, scope) for a in _spawn_arguments(inner, qualified))
                processes = _spawn_processes(inner, qualified)
                counted = symbols.expr(processes, scope) if processes is not None else None
                if isinstance(target, ast.Name) and target.id in params and target.id in scope.locals:
                    parameter_spawns.append((params.index(target.id), CallSite(UNKNOWN, guard, line, rest, (), spawn=True, processes=counted)))
                elif spawned_callee is not None:
                    calls.append(CallSite(spawned_callee, guard, line, rest, (), spawn=True, processes=counted))
                continue
            passed = tuple(
                (index, found)
                for index, argument in enumerate(inner.args)
                if isinstance(argument, (ast.Name, ast.Attribute)) and (found := symbols.callee(argument, scope)) is not None and found[0] == "q"
            )
            calls.append(CallSite(callee, guard, line, arguments, keywords, functions=passed))
    return FunctionSummary(
        name=name,
        line=getattr(node, "lineno", 1),
        end_line=getattr(node, "end_lineno", None) or 1 << 30,
        params=params,
        defaults=tuple(defaults),
        owner=owner,
        calls=tuple(calls),
        starts=tuple(starts),
        wraps=tuple(wraps),
        assigns=tuple(assigns),
        returns=tuple(returns),
        parameter_spawns=tuple(parameter_spawns),
        decorators=decorators,
        main_guard=main_guard,
    )


def _spawn_arguments(call: ast.Call, qualified: str) -> List[ast.AST]:
    """The arguments the spawned function gets after its process index: spawn's `args=(...)` tuple."""
    for keyword in call.keywords:
        if keyword.arg == "args" and isinstance(keyword.value, (ast.Tuple, ast.List)):
            return list(keyword.value.elts)
    if qualified.endswith("spawn") and len(call.args) > 1 and isinstance(call.args[1], (ast.Tuple, ast.List)):
        return list(call.args[1].elts)
    return []


def _spawn_processes(call: ast.Call, qualified: str) -> Optional[ast.AST]:
    """How many processes torch's `spawn(fn, args, nprocs)` or `start_processes` starts (none said for
    other launchers: detectron2's `launch` computes the global rank itself)."""
    if qualified not in SPAWNERS or not qualified.startswith("torch.multiprocessing."):
        return None
    for keyword in call.keywords:
        if keyword.arg == "nprocs":
            return keyword.value
    return call.args[2] if len(call.args) > 2 else None


# Library calls that give the items of what they are passed, as they are (a progress bar, an iterator).
_PASSING_ITERATORS = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "iter", "rich.progress.track"})
_PASSING_ITERATOR_NAMES = frozenset(name.rpartition(".")[2] for name in _PASSING_ITERATORS)


def _loop_bindings(loop: ast.AST, symbols: Symbols, scope: _Scope) -> List[Tuple[str, Expr]]:
    """What a `for` loop binds each time round: an item of what it iterates; `enumerate(x)` gives a count
    and an item of `x`, `zip(a, b)` an item of each."""
    target, iterated = loop.target, loop.iter  # type: ignore[attr-defined]
    while isinstance(iterated, ast.Call) and iterated.args and _last_name(iterated.func) in _PASSING_ITERATOR_NAMES and symbols.qualified(iterated.func, scope) in _PASSING_ITERATORS:
        iterated = iterated.args[0]  # `tqdm(loader)` gives the loader's items
    if isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Name) and isinstance(target, (ast.Tuple, ast.List)) and not iterated.keywords:
        if iterated.func.id == "enumerate" and len(target.elts) == 2 and len(iterated.args) == 1:
            count = _bindings(target.elts[0], UNKNOWN, symbols, scope)
            return count + _bindings(target.elts[1], ("item", symbols.expr(iterated.args[0], scope), None), symbols, scope)
        if iterated.func.id == "zip" and len(target.elts) == len(iterated.args):
            return [
                found
                for element, argument in zip(target.elts, iterated.args)
                for found in _bindings(element, ("item", symbols.expr(argument, scope), None), symbols, scope)
            ]
    return _bindings(target, ("item", symbols.expr(iterated, scope), None), symbols, scope)


def _bindings(target: ast.AST, value: Expr, symbols: Symbols, scope: _Scope) -> List[Tuple[str, Expr]]:
    if isinstance(target, (ast.Tuple, ast.List)):
        found = []
        for index, element in enumerate(target.elts):
            found.extend(_bindings(element, ("item", value, index), symbols, scope))
        return found
    if isinstance(target, (ast.Name, ast.Attribute)) or (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)):
        key = symbols.expr(target, scope)
        if key[0] == "v" and not key[1].startswith("Q:"):
            found = [(key[1], value)]
            if key[1].startswith("A:") and isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                # `learner.is_master = rank == 0`: an attribute of the object the variable holds, whose
                # class the project may know (its methods read it as `self.is_master`).
                holder = symbols.expr(target.value, scope)
                if holder[0] == "v":
                    found.append((f"T:{holder[1]}|{target.attr}", value))
            return found
    return []


def _is_main_test(test: ast.AST) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _alternatives(value: Expr) -> List[Tuple[Expr, Guard]]:
    """What a value may be, each under its condition: both sides of `a if test else b`."""
    if value[0] == "ifexp":
        return [*((found, ((value[1], True), *guard)) for found, guard in _alternatives(value[2])),
                *((found, ((value[1], False), *guard)) for found, guard in _alternatives(value[3]))]  # fmt: skip
    return [(value, ())]


def _reaches_self(expr: Expr) -> bool:
    """Whether a symbolic expression reaches into `self` (`self.blocks`, `self.heads[name]`)."""
    while expr[0] in ("attr", "item"):
        expr = expr[1]
    return expr[0] == "self" or (expr[0] == "v" and expr[1].startswith("S:"))


def _last_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


# ----- values ---------------------------------------------------------------------------------------
#
# A value: ("rank", "global" | "local" | "any") a number that differs between the ranks of a group;
# ("world",) the world size; ("bool", Truth) a test; ("const", value); ("tuple", values...);
# ("object", class) an object of a framework's class (an `Accelerator`, a DeepSpeed engine) or a torch
# optimizer, alike on every rank; ("object", DATA_LOADER, file, call) a torch `DataLoader` as the call
# (symbolic, evaluated in that file) built it, which `accelerator.prepare` has not replaced, and
# ("object", PREPARED_LOADER, file, call) what `accelerator.prepare` hands back for such a loader;
# ("uniform",) anything alike on every rank; ("varies",) anything that may differ between ranks;
# ("share",) an item of the rank's own share of the data (a batch of a `DistributedSampler`'s loader):
# it differs between the ranks, but a test on it is no rank test; ("maybe", Truth, value) what a
# function returns that is None except where the truth holds (`return None` unless rank 0).

Value = tuple
UNIFORM_VALUE: Value = ("uniform",)
VARIES_VALUE: Value = ("varies",)
SHARE_VALUE: Value = ("share",)
# What the name being assigned held before, as `accelerator.prepare` hands it back: `model = accelerator.prepare(model)`
SAME_VALUE: Value = ("same",)
DATA_LOADER = "torch.utils.data.DataLoader"
DATA_LOADERS = frozenset({DATA_LOADER, "torch.utils.data.dataloader.DataLoader"})
# The loader `accelerator.prepare` hands back: it shards the batches between the processes.
PREPARED_LOADER = "accelerate.data_loader.DataLoaderShard"
# Calls that hand back the loaders they are given sharded between the processes (Accelerate's).
_LOADER_PREPARERS = frozenset({"accelerate.data_loader.prepare_data_loader"})

# Environment variables the launchers set (torchrun, SLURM, Open MPI, Intel MPI).
_GLOBAL_RANK_VARIABLES = frozenset({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
_LOCAL_RANK_VARIABLES = frozenset({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"})
_WORLD_SIZE_VARIABLES = frozenset({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
ACCELERATOR: Value = ("object", ACCELERATOR_CLASS)
DEEPSPEED_OPTIMIZER = "deepspeed.DeepSpeedOptimizer"  # the optimizer `deepspeed.initialize` hands back second: its engine steps it
# What library calls return.
_LIBRARY_VALUES: Mapping[str, Value] = {
    "torch.distributed.get_rank": ("rank", "global"),
    "torch.distributed.distributed_c10d.get_rank": ("rank", "global"),
    "torch.distributed.get_global_rank": ("rank", "global"),
    "torch.distributed.get_node_local_rank": ("rank", "local"),
    "torch.distributed.get_world_size": ("world",),
    "torch.distributed.distributed_c10d.get_world_size": ("world",),
    "torch.distributed.is_initialized": ("bool", WORKERS),
    "torch.distributed.distributed_c10d.is_initialized": ("bool", WORKERS),
    "deepspeed.comm.get_rank": ("rank", "global"),
    "deepspeed.comm.get_local_rank": ("rank", "local"),
    "deepspeed.comm.get_world_size": ("world",),
    "horovod.torch.rank": ("rank", "global"),
    "horovod.torch.local_rank": ("rank", "local"),
    "horovod.torch.size": ("world",),
    "mmcv.runner.get_dist_info": ("tuple", ("rank", "global"), ("world",)),
    "mmcv.runner.dist_utils.get_dist_info": ("tuple", ("rank", "global"), ("world",)),
    "mmengine.dist.get_dist_info": ("tuple", ("rank", "global"), ("world",)),
    "mmengine.dist.get_rank": ("rank", "global"),
    "mmengine.dist.is_main_process": ("bool", Truth("UTFF")),
    "detectron2.utils.comm.get_rank": ("rank", "global"),
    "detectron2.utils.comm.get_local_rank": ("rank", "local"),
    "detectron2.utils.comm.get_world_size": ("world",),
    "detectron2.utils.comm.is_main_process": ("bool", Truth("UTFF")),
    # A name of the process's own: a random UUID, the process id.
    "uuid.uuid1": VARIES_VALUE,
    "uuid.uuid4": VARIES_VALUE,
    "os.getpid": VARIES_VALUE,
    **dict.fromkeys(DISTRIBUTED_SAMPLERS, SHARE_VALUE),
    **{name: ("object", built) for name, built in _FRAMEWORK_CLASSES.items() if name != "deepspeed.initialize"},
    # (engine, optimizer, training loader, scheduler)
    "deepspeed.initialize": (
        "tuple", ("object", _FRAMEWORK_CLASSES["deepspeed.initialize"]), ("object", DEEPSPEED_OPTIMIZER), UNIFORM_VALUE, UNIFORM_VALUE,
    ),
}


def _prepared(value: Value) -> Value:
    """What `accelerator.prepare` hands back for an object: a loader it shards is no longer the one built
    (it keeps the call that built it, whose arguments say how it batches)."""
    return ("object", PREPARED_LOADER, *value[2:]) if value[:2] == ("object", DATA_LOADER) else value


OPTIMIZER = "torch.optim.Optimizer"  # what any of torch's optimizers is, as an object's class


def _optimizer_class(qualified: str) -> bool:
    """`torch.optim.AdamW`, `torch.optim.adamw.AdamW`: a class of torch.optim outside its schedulers and
    weight averaging, which are its optimizers."""
    module, _, name = qualified.rpartition(".")
    in_optim = module == "torch.optim" or module.startswith("torch.optim.")
    return in_optim and name[:1].isupper() and not any(part in module for part in ("lr_scheduler", "swa_utils"))


# Attributes of the frameworks' objects (Accelerate's `Accelerator`, Lightning's `Trainer`, Fabric),
# known by their names since the objects' classes are not followed.
_FRAMEWORK_ATTRIBUTES: Mapping[str, Value] = {
    "is_main_process": ("bool", Truth("UTFF")),
    "is_local_main_process": ("bool", Truth("UTTF")),
    "is_global_zero": ("bool", Truth("UTFF")),
    "process_index": ("rank", "global"),
    "local_process_index": ("rank", "local"),
    "global_rank": ("rank", "global"),
    "num_processes": ("world",),
}
# The last resort for a name nothing in the project assigns (an argparse option, a config entry): a
# rank by its name. Whatever looks like a rank and is not known stays unknown, so rules stay silent.
_LOCAL_RANK_NAME = re.compile(r"^(?:local_?rank|local_?process_?index|localid)$", re.I)
_GLOBAL_RANK_NAME = re.compile(r"^(?:global|dist|ddp|world)_?rank$", re.I)
_RANK_NAME = re.compile(r"^(?:\w+_)?rank(?:_?id|_?idx)?$", re.I)
# A test of "is this the main process" (not a flag about rank 0, such as `eval_on_rank0`).
_RANK_PREDICATE_NAME = re.compile(
    r"^(?:is_)?(?:local_|global_)?(?:main|master)(?:_process|_rank|_node|_proc|_worker)?$|^is_(?:global|local)_zero$"
    r"|^is_rank_?(?:0|zero)$|^(?:on_)?rank_?(?:0|zero)$",
    re.I,
)
_WORLD_SIZE_NAME = re.compile(r"^(?:world_?size|num_?processes|n_?procs|num_?replicas)$", re.I)
_RANK_ZERO_DECORATOR = re.compile(r"rank_?zero|rank0|master_only|main_process_only|on_main_process", re.I)


def truth_of(value: Value) -> Truth:
    kind = value[0]
    if kind == "bool":
        return value[1]
    if kind == "const":
        return ALWAYS if value[1] else NEVER
    if kind == "rank":
        return ~_rank_equals(value[1], 0)
    if kind == "world":
        return ALWAYS
    if kind == "varies":
        return VARIES
    if kind == "maybe":
        return value[1] & truth_of(value[2])
    return UNIFORM


def varies(value: Value, shares: bool = True) -> bool:
    """Whether the value may differ between the ranks of a group; without `shares`, not counting items
    of each rank's own share of the data (which no test on the rank picks)."""
    kind = value[0]
    if kind in ("rank", "varies") or (shares and kind == "share"):
        return True
    if kind in ("bool", "maybe"):
        ranks = value[1][GROUP_WORLDS]
        return len(set(ranks)) > 1 or "Q" in ranks
    if kind == "tuple":
        return any(varies(item, shares) for item in value[1:])
    return False


def mixed(parts: Sequence[Value]) -> Value:
    """What is computed from the parts: it differs between the ranks where one of them does."""
    if any(varies(part, shares=False) for part in parts):
        return VARIES_VALUE
    return SHARE_VALUE if any(varies(part) for part in parts) else UNIFORM_VALUE


def join(a: Value, b: Value) -> Value:
    if a == b:
        return a
    for first, second in ((a, b), (b, a)):
        if first[0] == "varies" or (first[0] == "share" and not varies(second, shares=False)):
            return first
        if first[0] == "rank":
            return ("rank", first[1] if second[0] != "rank" else "any")
        if first[0] == "world" and second[0] in ("const", "uniform", "world"):
            return first
    if a[0] in ("bool", "const") and b[0] in ("bool", "const", "uniform"):
        return ("bool", truth_of(a).either(truth_of(b)))
    if b[0] == "bool" and a[0] == "uniform":
        return ("bool", UNIFORM.either(b[1]))
    if a[0] == b[0] == "tuple" and len(a) == len(b):
        return ("tuple", *(join(x, y) for x, y in zip(a[1:], b[1:])))
    return UNIFORM_VALUE


def _reads_rank(evaluation: "Evaluation", expr: Expr, filename: str) -> bool:
    for part in _parts(expr):
        value = evaluation.value(part, filename)
        if value[0] in ("rank", "world") or varies(value, shares=False):
            return True
    return False


def _parts(expr: Expr) -> Iterator[Expr]:
    """The expression and each expression inside it."""
    yield expr
    kind = expr[0]
    if kind == "call":
        if expr[1][0] == "m":
            yield from _parts(expr[1][1])
        for argument in (*expr[2], *(value for _, value in expr[3])):
            yield from _parts(argument)
    elif kind in ("and", "or", "not", "ifexp", "fmt", "tuple", "items"):
        for part in expr[1:]:
            yield from _parts(part)
    elif kind in ("cmp", "bin"):
        yield from _parts(expr[2])
        yield from _parts(expr[3])
    elif kind in ("item", "attr"):
        yield from _parts(expr[1])
        if kind == "item" and isinstance(expr[2], tuple):
            yield from _parts(expr[2])


def _rank_equals(kind: str, number: object) -> Truth:
    """`rank == number` per world, for a rank of that kind."""
    if number == 0:
        return Truth({"global": "UTFF", "local": "UTTF"}.get(kind, "UTQF"))
    if number == -1 or number is None:
        return Truth("UFFF")
    if isinstance(number, int) and number > 0:
        return Truth("UFQQ")
    return VARIES


def _compare(operator: str, left: Value, right: Value) -> Value:
    if left[0] == "const" and right[0] != "const" and operator in ("==", "!=", "is", "is not"):
        left, right = right, left
    if left[0] == "maybe" and right == ("const", None) and operator in ("==", "!=", "is", "is not"):
        return ("bool", left[1] if operator in ("!=", "is not") else ~left[1])
    if right[0] == "tuple" and operator in ("in", "not in"):
        found = NEVER
        for item in right[1:]:
            found = found | truth_of(_compare("==", left, item))
        return ("bool", found if operator == "in" else ~found)
    if left[0] == "const" and right[0] == "const":
        try:
            holds = {"==": left[1] == right[1], "!=": left[1] != right[1], "is": left[1] is right[1], "is not": left[1] is not right[1],
                     "<": left[1] < right[1], "<=": left[1] <= right[1], ">": left[1] > right[1], ">=": left[1] >= right[1]}.get(operator)  # type: ignore[operator]
        except TypeError:
            holds = None
        return ("const", holds) if holds is not None else UNIFORM_VALUE
    if right[0] == "const" and left[0] == "rank":
        number, kind = right[1], left[1]
        if operator in ("==", "is"):
            return ("bool", _rank_equals(kind, number))
        if operator in ("!=", "is not"):
            return ("bool", ~_rank_equals(kind, number))
        if isinstance(number, int) and operator in ("<", "<=", ">", ">="):
            below = number - 1 if operator == "<" else number if operator == "<=" else None
            above = number + 1 if operator == ">" else number if operator == ">=" else None
            if below is not None:  # rank <= below
                return ("bool", Truth("UFFF") if below < 0 else (_rank_equals(kind, 0) | _rank_equals(kind, -1)) if below == 0 else VARIES)
            if above is not None:  # rank >= above
                return ("bool", Truth("UTTT") if above <= 0 else ~(_rank_equals(kind, 0) | _rank_equals(kind, -1)) if above == 1 else VARIES)
        return ("bool", VARIES)
    if right[0] == "const" and left[0] == "world" and isinstance(right[1], int) and operator in _ORDER:
        return ("bool", _world_compared(operator, right[1]))
    if varies(left, shares=False) or varies(right, shares=False):
        return ("bool", VARIES)
    return ("bool", UNIFORM)


_ORDER = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}  # fmt: skip


def _world_compared(operator: str, number: int) -> Truth:
    """`world_size <op> number`: one process has a world of 1; a group, of 2 or more."""
    holds = _ORDER[operator]
    in_group = {holds(size, number) for size in range(2, max(number, 2) + 2)}
    return Truth(("T" if holds(1, number) else "F") + ("T" if in_group == {True} else "F" if in_group == {False} else "U") * 3)


def _arithmetic(operator: str, left: Value, right: Value) -> Value:
    ranks = [value for value in (left, right) if value[0] == "rank"]
    if ranks:
        if operator in ("%",) and left[0] == "rank":
            return ("rank", "local")
        if operator in ("//",) and left[0] == "rank":
            return VARIES_VALUE  # a node's index: several ranks share it
        return ("rank", "global" if len(ranks) == 2 or ranks[0][1] == "global" else "any")
    if varies(left) or varies(right):
        return mixed((left, right))
    if left[0] == right[0] == "const":
        try:
            return ("const", {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}[operator](left[1], right[1]))
        except (KeyError, TypeError):
            return UNIFORM_VALUE
    if "world" in (left[0], right[0]) and operator in ("*", "//", "/"):
        return ("world",)
    return UNIFORM_VALUE


# ----- the project's programs -------------------------------------------------------------------------

FunctionId = Tuple[str, str]  # (filename, qualified name)
_MAX_DEPTH = 6  # calls followed inside one value: `is_main_process()` → `get_rank()` → `dist.get_rank()`


@dataclass
class _File:
    filename: str
    summary: ExecutionSummary
    functions: Dict[str, FunctionSummary] = field(default_factory=dict)  # qualified name → summary
    classes: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    aliases: Dict[str, str] = field(default_factory=dict)


def _own_module_names(summaries: Mapping[str, ExecutionSummary]) -> Dict[str, ExecutionSummary]:
    """The summaries, each file's names its own: two scripts of one name in different folders
    (`a/train.py`, `b/train.py`) are both module `train`, and their `main`s' locals must not meet."""
    counts: Dict[str, int] = {}
    for summary in summaries.values():
        counts[summary.module] = counts.get(summary.module, 0) + 1
    own: Dict[str, ExecutionSummary] = {}
    seen: Dict[str, int] = {}
    for filename in sorted(summaries):
        summary = summaries[filename]
        if counts[summary.module] > 1:
            seen[summary.module] = seen.get(summary.module, 0) + 1
            # `@` joins no name a program can spell, and no dot: a lookup never splits it.
            summary = _renamed(summary, summary.module, f"{summary.module}@{seen[summary.module]}")
        own[filename] = summary
    return own


def _renamed(item: object, old: str, new: str) -> object:
    """`item` with the module `old`'s own names (qualified names, variable keys) under `new`; the
    names it imports (aliases, star imports) stay as they are."""
    if isinstance(item, str):
        for prefix in ("", "L:", "G:", "S:"):
            if item.startswith(prefix + old) and item[len(prefix) + len(old) : len(prefix) + len(old) + 1] in ("", ".", ":"):
                return prefix + new + item[len(prefix) + len(old) :]
        if item.startswith("T:"):  # `T:<holder key>|<attribute>`
            return "T:" + str(_renamed(item[2:], old, new))
        return item
    if isinstance(item, tuple):
        return tuple(_renamed(part, old, new) for part in item)
    if isinstance(item, ExecutionSummary):
        return dataclasses.replace(
            item,
            module=new,
            functions=_renamed(item.functions, old, new),  # type: ignore[arg-type]
            classes=_renamed(item.classes, old, new),  # type: ignore[arg-type]
            hides_buffers=_renamed(item.hides_buffers, old, new),  # type: ignore[arg-type]
        )
    if isinstance(item, (FunctionSummary, CallSite)):
        return dataclasses.replace(item, **{f.name: _renamed(getattr(item, f.name), old, new) for f in dataclasses.fields(item)})
    return item


class ExecutionModel:
    """Where the functions of the project's programs run, from their entries along the resolved calls.

    `resolve_module(module, from_file)` is the project's import resolution (a file, or None);
    `imported` holds the files some project file imports (a file nobody imports is run from outside).
    """

    def __init__(self, summaries: Mapping[str, ExecutionSummary], resolve_module: Callable[[str, str], Optional[str]], imported: FrozenSet[str]) -> None:
        self.files: Dict[str, _File] = {}
        for filename, summary in _own_module_names(summaries).items():
            self.files[filename] = _File(filename, summary, {f.name: f for f in summary.functions}, dict(summary.classes), dict(summary.aliases))
        self._resolve_module = resolve_module
        self._imported = imported
        # variable key → (function, guard, value) of each assignment
        self._assigned: Dict[str, List[Tuple[FunctionId, Guard, Expr]]] = {}
        for filename, info in self.files.items():
            for function in info.functions.values():
                for key, guard, value in function.assigns:
                    self._assigned.setdefault(key, []).append(((filename, function.name), guard, value))
        self._subclasses: Dict[str, Set[str]] = {}
        for info in self.files.values():
            for name, bases in info.classes.items():
                for base in bases:
                    resolved = self._class(base, info.filename)
                    if resolved is not None:
                        self._subclasses.setdefault(resolved[1], set()).add(name)
        self._class_file = {name: filename for filename, info in self.files.items() for name in info.classes}
        self._buffers: Dict[Tuple[str, str], bool] = {}
        self._passed: Dict[str, Optional[str]] = {}
        self._types: Dict[str, FrozenSet[str]] = {}
        for key in [key for key in self._assigned if key.startswith("T:")]:
            holder, _, attribute = key[2:].partition("|")
            filename = self._assigned[key][0][0][0]
            for class_name in self.types(("v", holder), filename):
                self._assigned.setdefault(f"S:{class_name}:{attribute}", []).extend(self._assigned[key])

    # -- resolving names ----------------------------------------------------------------------------

    def _lookup(self, qualified: str, from_file: str, depth: int = 0) -> Optional[Tuple[str, str, str]]:
        """("function" | "class", filename, qualified name in that file) for a dotted name, else None."""
        if depth > 4:
            return None
        own = self.files.get(from_file)
        if own is not None:
            found = self._in_file(own, qualified)
            if found is not None:
                return found
        parts = qualified.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            filename = self._resolve_module(".".join(parts[:cut]), from_file)
            if filename is None or filename not in self.files:
                continue
            info = self.files[filename]
            found = self._in_file(info, f"{info.summary.module}.{'.'.join(parts[cut:])}")
            if found is not None:
                return found
            alias = info.aliases.get(parts[cut])
            if alias is not None and alias != qualified:
                return self._lookup(".".join([alias, *parts[cut + 1 :]]), filename, depth + 1)
            return None
        return None

    @staticmethod
    def _in_file(info: _File, qualified: str) -> Optional[Tuple[str, str, str]]:
        if qualified in info.functions and qualified != info.summary.module:
            return ("function", info.filename, qualified)
        if qualified in info.classes:
            return ("class", info.filename, qualified)
        return None

    def _class(self, qualified: str, from_file: str) -> Optional[Tuple[str, str]]:
        found = self._lookup(qualified, from_file)
        return (found[1], found[2]) if found is not None and found[0] == "class" else None

    @cached_property
    def plain_object_makers(self) -> FrozenSet[str]:
        """The names a file must call to hold an object of a plain project class: the class (`FixMatch`),
        or a project function that returns one."""
        classes = frozenset(name.rpartition(".")[2] for name in self._class_file if self.plain_class(name))
        return classes | frozenset(name for name, built in self._built_by.items() if built & classes)

    @cached_property
    def loader_data_sets(self) -> FrozenSet[str]:
        """The project classes (qualified) whose objects the project hands to a torch `DataLoader` as its
        data set: `DataLoader(Stream(...))`, or a variable assigned `Stream(...)` that is passed."""
        found: Set[str] = set()
        for filename, info in self.files.items():
            for function in info.functions.values():
                for site in function.calls:
                    if site.callee[0] != "q" or site.callee[1] not in DATA_LOADERS:
                        continue
                    dataset = dict(site.keywords).get("dataset", site.arguments[0] if site.arguments else None)
                    values = [entry[2] for entry in self.assignments(dataset[1])] if dataset is not None and dataset[0] == "v" else [dataset]
                    for value in values:
                        if value is not None and value[0] == "call" and value[1][0] == "q":
                            resolved = self._class(value[1][1], filename)
                            if resolved is not None:
                                found.add(resolved[1])
        return frozenset(found)

    def plain_class(self, class_name: str, seen: FrozenSet[str] = frozenset()) -> bool:
        """Whether the project class is no `nn.Module`: every base is a plain class of the project (or
        `object`), and it defines no `parameters` a wrapper could call."""
        filename = self._class_file.get(class_name)
        if filename is None or class_name in seen or self._method(class_name, "parameters") is not None:
            return False
        for base in self.files[filename].classes.get(class_name, ()):
            resolved = self._class(base, filename)
            if base != "object" and (resolved is None or not self.plain_class(resolved[1], seen | {class_name})):
                return False
        return True

    def may_hold_buffers(self, class_name: str) -> bool:
        """Whether a project module class may hold buffers (which a DDP forward syncs): a base, a call in its
        methods, or its source (`hides_buffers`) may make one. Unknown is yes."""
        return self._makes_buffers(("class", class_name))

    def _makes_buffers(self, what: Tuple[str, str]) -> bool:
        """For ("class", qualified) or ("function", qualified): whether what it builds may hold buffers."""
        if what in self._buffers:
            return self._buffers[what]
        self._buffers[what] = True  # met again inside itself (a cycle): not followed round, so unknown: yes
        found = self._buffers[what] = self._own_buffers(*what)
        return found

    def _own_buffers(self, kind: str, name: str) -> bool:
        filename = self._class_file.get(name) if kind == "class" else self._function_file.get(name)
        if filename is None:
            return True
        info = self.files[filename]
        if name in info.summary.hides_buffers:
            return True
        if kind == "class":
            for base in info.classes.get(name, ()):
                resolved = self._class(base, filename)
                if self._makes_buffers(("class", resolved[1])) if resolved is not None else base_may_hold_buffers(base):
                    return True
        inside = name + "."
        return any(
            self._call_makes_buffers(site.callee, filename)
            for function in info.functions.values()
            if function.name == name or function.name.startswith(inside)
            for site in function.calls
        )

    def _call_makes_buffers(self, callee: Expr, filename: str) -> bool:
        kind = callee[0]
        if kind == "q":
            found = self._lookup(callee[1], filename)
            if found is not None:
                return self._makes_buffers((found[0], found[2]))
            return outside_call_may_make_buffers(callee[1], _BUILTINS)
        if kind == "either":
            return self._call_makes_buffers(callee[1], filename) or self._call_makes_buffers(callee[2], filename)
        if kind != "m" or _reaches_self(callee[1]):
            return False  # `super().__init__()`, or a part of `self` called
        receiver, method = callee[1], callee[2]
        if method != "__call__":
            return method in CONSTRUCTING_METHODS or method[:1].isupper()  # `AutoModel.from_pretrained`, `layers.Conv(...)`
        if receiver[0] != "v":
            return True
        if receiver[1].startswith("Q:"):
            return self._call_makes_buffers(("q", receiver[1][2:]), filename)
        assigned = self._assigned.get(receiver[1])
        if not assigned:
            return True  # a parameter (`norm_layer(dim)`): whatever the caller passes
        return any(
            self._class_reference_makes_buffers(alternative, where[0]) for where, _, value in assigned for alternative, _ in _alternatives(value)
        )

    def _class_reference_makes_buffers(self, value: Expr, filename: str) -> bool:
        """For a variable called (`block = Basic if small else Bottleneck`; `block(dim)`), each thing it may
        hold: what that builds. A part of `self` (`for layer in self.layers: layer(x)`) builds nothing."""
        if _reaches_self(value):
            return False
        if value[0] == "v" and value[1].startswith("Q:"):
            return self._call_makes_buffers(("q", value[1][2:]), filename)
        if value[0] == "call" and value[1] == ("q", "functools.partial") and value[2]:
            return self._class_reference_makes_buffers(value[2][0], filename)  # `partial(Block, dim=64)`
        return True

    @cached_property
    def _function_file(self) -> Dict[str, str]:
        return {name: filename for filename, info in self.files.items() for name in info.functions}

    def _method(self, class_name: str, method: str, seen: Optional[Set[str]] = None) -> Optional[FunctionId]:
        """The method a call on an instance of the class runs: its own, or the nearest base's."""
        seen = seen if seen is not None else set()
        filename = self._class_file.get(class_name)
        if filename is None or class_name in seen:
            return None
        seen.add(class_name)
        info = self.files[filename]
        if f"{class_name}.{method}" in info.functions:
            return (filename, f"{class_name}.{method}")
        for base in info.classes.get(class_name, ()):
            resolved = self._class(base, filename)
            if resolved is not None:
                found = self._method(resolved[1], method, seen)
                if found is not None:
                    return found
        return None

    def _overrides(self, class_name: str, method: str) -> List[FunctionId]:
        """The method as the class and each of its subclasses define it (a call on `self` runs any of them)."""
        found: List[FunctionId] = []
        pending, seen = [class_name], set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            target = self._method(name, method)
            if target is not None and target not in found:
                found.append(target)
            pending.extend(self._subclasses.get(name, ()))
        return found

    def targets(self, callee: Expr, from_file: str) -> List[Tuple[FunctionId, int]]:
        """The project functions a call may run, each with how many leading parameters the call does not
        pass (`self` of a method, of a class's `__init__`)."""
        kind = callee[0]
        if kind == "either":
            return self.targets(callee[1], from_file) or self.targets(callee[2], from_file)
        if kind == "q":
            found = self._lookup(callee[1], from_file)
            if found is None:
                return []
            if found[0] == "function":
                function = self.files[found[1]].functions[found[2]]
                return [((found[1], found[2]), 1 if function.owner is not None else 0)]
            init = self._method(found[2], "__init__")
            return [(init, 1)] if init is not None else []
        if kind == "super":
            filename = self._class_file.get(callee[1])
            bases = self.files[filename].classes.get(callee[1], ()) if filename else ()
            for base in bases:
                resolved = self._class(base, filename)  # type: ignore[arg-type]
                target = self._method(resolved[1], callee[2]) if resolved is not None else None
                if target is not None:
                    return [(target, 1)]
            return []
        if kind == "m":
            receiver, method = callee[1], callee[2]
            if method == "__call__" and receiver[0] == "v" and receiver[1].startswith("G:") and receiver[1] not in self._assigned:
                # A name the module neither defines nor imports by name: one of its `from X import *` (`from engine import *`).
                name = receiver[1].rpartition(":")[2]
                # A file the model holds no summary of (a vendored copy of a torch-like library) imports none known.
                info = self.files.get(from_file)
                for module in info.summary.star_imports if info is not None else ():
                    found = self.targets(("q", f"{module}.{name}"), from_file)
                    if found:
                        return found
            if receiver[0] == "self":
                return [(target, 1) for target in self._overrides(receiver[1], method)]
            return [(target, 1) for name in sorted(self.types(receiver, from_file)) for target in [self._method(name, method)] if target]
        return []

    def types(self, expr: Expr, from_file: str, depth: int = 0) -> FrozenSet[str]:
        """The project classes whose instance the expression may hold (`trainer = Trainer(cfg)`)."""
        kind = expr[0]
        if depth > _MAX_DEPTH:
            return frozenset()
        if kind == "call" and expr[1][0] == "m" and expr[1][2] in _SAME_MODULE_METHODS:
            return self.types(expr[1][1], from_file, depth + 1)  # `Net().cuda()` is the same `Net`
        if kind == "call" and expr[1][0] == "either":
            return self.types(("call", expr[1][1]), from_file, depth + 1) or self.types(("call", expr[1][2]), from_file, depth + 1)
        if kind == "call" and expr[1][0] == "q":
            found = self._lookup(expr[1][1], from_file)
            if found is not None and found[0] == "class":
                return frozenset({found[2]})
            if found is not None:
                function = self.files[found[1]].functions[found[2]]
                return frozenset().union(*(self.types(value, found[1], depth + 1) for _, value in function.returns))
            return frozenset()
        if kind == "self":
            return frozenset({expr[1]})
        if kind == "v":
            key = expr[1]
            if key in self._types:
                return self._types[key]
            self._types[key] = frozenset()
            found: Set[str] = set()
            for (filename, _), _, value in self._assigned.get(key, ()):
                found |= self.types(value, filename, depth + 1)
            self._types[key] = frozenset(found)
            return self._types[key]
        if kind == "or":
            return frozenset().union(*(self.types(part, from_file, depth + 1) for part in expr[1:]))
        if kind == "ifexp":
            return self.types(expr[2], from_file, depth + 1) | self.types(expr[3], from_file, depth + 1)
        return frozenset()

    # -- the call graph ----------------------------------------------------------------------------

    @cached_property
    def _edges(self) -> Dict[FunctionId, List[Tuple[CallSite, FunctionId, int, bool]]]:
        """Each function's calls of project functions: (site, callee, parameters skipped, spawned). A
        function passed to a call is called there too (`fire.Fire(main)`, a callback), and started as a
        group's workers where the callee spawns that parameter (`launch(main_worker, ...)`)."""
        edges: Dict[FunctionId, List[Tuple[CallSite, FunctionId, int, bool]]] = {}
        for filename, info in self.files.items():
            for name, function in info.functions.items():
                found = edges.setdefault((filename, name), [])
                for site in function.calls:
                    targets = self.targets(site.callee, filename)
                    for target, skipped in targets:
                        holder = site.callee[1] if site.callee[0] == "m" and site.callee[1][0] == "v" else None
                        guards = self._holding_guards(holder[1], (filename, name), target) if holder is not None else None
                        for guard in guards if guards is not None else [()]:
                            found.append((dataclasses.replace(site, guard=site.guard + guard) if guard else site, target, skipped, site.spawn))
                    for index, passed in site.functions:
                        spawns = [
                            spawn
                            for target, skipped in targets
                            for position, spawn in self.function(target).parameter_spawns
                            if position == index + skipped
                        ]
                        spawned = bool(spawns)
                        origin = spawns[0] if len(spawns) == 1 else None
                        for started, started_skipped in self.targets(passed, filename):
                            edge = CallSite(passed, site.guard, site.line, spawn=spawned, spawned_by=origin)
                            found.append((edge, started, started_skipped, spawned))
        return edges

    def _holding_guards(self, key: str, caller: FunctionId, target: FunctionId) -> Optional[List[Guard]]:
        """Where a local variable of `caller` holds an object whose method `target` is: the guard of each
        assignment there that gives one, less where a later assignment replaced it (`saver =
        Saver(path) if main else NoOp()`, or `if not main: saver = NoOp()`). None where the function's own
        assignments do not say (a parameter, an attribute, a guard of several terms replacing it)."""
        entries = self._assigned.get(key, ())
        if not key.startswith("L:") or not entries or any(where != caller for where, _, _ in entries):
            return None
        method = target[1].rpartition(".")[2]
        guards: List[Guard] = []
        yielded = False
        for index, (_, guard, value) in enumerate(entries):
            for alternative, condition in _alternatives(value):
                if not any(self._method(name, method) == target for name in self.types(alternative, caller[0])):
                    continue
                yielded = True
                kept = [*guard, *condition]
                for _, later, _ in entries[index + 1 :]:
                    if len(later) != 1:
                        if not later:
                            break  # replaced on every path: this object is gone
                        return None
                    kept.append((later[0][0], not later[0][1]))
                else:
                    guards.append(tuple(kept))
        return guards if yielded else None

    def function(self, function: FunctionId) -> FunctionSummary:
        return self.files[function[0]].functions[function[1]]

    @cached_property
    def _callers(self) -> Dict[FunctionId, List[Tuple[FunctionId, CallSite, int, bool]]]:
        callers: Dict[FunctionId, List[Tuple[FunctionId, CallSite, int, bool]]] = {}
        for caller, edges in self._edges.items():
            for site, target, skipped, spawn in edges:
                callers.setdefault(target, []).append((caller, site, skipped, spawn))
        return callers

    @lru_cache(maxsize=None)
    def _reaches_group(self, start: FunctionId) -> Tuple[bool, bool]:
        """Whether the calls from `start` reach a process group's start (or a DDP/FSDP wrap): directly,
        and through a spawn."""
        directly = spawned = False
        seen: Set[FunctionId] = set()
        pending: List[Tuple[FunctionId, bool]] = [(start, False)]
        while pending:
            current, through_spawn = pending.pop()
            if (current, through_spawn) in seen:  # type: ignore[comparison-overlap]
                continue
            seen.add((current, through_spawn))  # type: ignore[arg-type]
            function = self.function(current)
            if function.starts or function.wraps:
                if through_spawn:
                    spawned = True
                else:
                    directly = True
            for _, target, _, spawn in self._edges.get(current, ()):
                pending.append((target, through_spawn or spawn))
        return directly, spawned

    @cached_property
    def entries(self) -> Dict[FunctionId, Truth]:
        """The programs' entries and how each is launched: a script's top level, once (`python`) unless
        it reaches a group's start without spawning (then `torchrun` may run it on every rank), and a
        top-level function that starts a group in a file the project never imports (a console script)."""
        found: Dict[FunctionId, Truth] = {}
        for filename, info in self.files.items():
            top = (filename, info.summary.module)
            if info.summary.script and (info.functions[info.summary.module].main_guard is not None or filename not in self._imported):
                directly, _ = self._reaches_group(top)
                found[top] = ALWAYS if directly else ONE_PROCESS
            elif filename not in self._imported:
                for name, function in info.functions.items():
                    if function.owner is None and name.count(".") == info.summary.module.count(".") + 1 and not self._callers.get((filename, name)):
                        if self._reaches_group((filename, name))[0]:
                            found[(filename, name)] = ALWAYS
        return found

    # -- where each function runs -------------------------------------------------------------------

    @cached_property
    def programs(self) -> List["Program"]:
        """One program per entry, each with its mode tests and where its functions run."""
        # Programs with the same mode test share one evaluation over their functions together (one
        # project's scripts usually do): their values are worked out once.
        groups: Dict[FrozenSet[Tuple[Expr, bool]], List[FunctionId]] = {}
        for entry in self.entries:
            groups.setdefault(self._mode_literals(entry), []).append(entry)
        found = []
        for modes, entries in groups.items():
            evaluation = Evaluation(self, modes, frozenset().union(*(self._reachable(entry) for entry in entries)))
            for entry in entries:
                found.append(Program(entry, self._entry_truth(entry, self.entries[entry], evaluation), evaluation))
        return found

    @cached_property
    def default_evaluation(self) -> "Evaluation":
        return Evaluation(self, frozenset(), None)

    def _reachable(self, entry: FunctionId) -> FrozenSet[FunctionId]:
        """The functions the entry's calls reach, and the top level of their modules (run on import)."""
        seen = {entry}
        pending = [entry]
        while pending:
            for _, target, _, _ in self._edges.get(pending.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    pending.append(target)
        tops = {(filename, self.files[filename].summary.module) for filename, _ in seen}
        return frozenset(seen | tops)

    def _mode_literals(self, entry: FunctionId) -> FrozenSet[Tuple[Expr, bool]]:
        """The literals that hold wherever the program's process group exists: those on every path from
        its entry to every start of a group (`if args.distributed: init_process_group(...)`)."""
        dominating: Dict[FunctionId, FrozenSet[Tuple[Expr, bool]]] = {entry: frozenset()}
        order = [entry]
        while order:
            current = order.pop()
            for site, target, _, spawn in self._edges.get(current, ()):
                along = frozenset() if spawn else dominating[current] | frozenset(site.guard)
                before = dominating.get(target)
                after = along if before is None else before & along
                if after != before:
                    dominating[target] = after
                    order.append(target)
        necessary: Optional[FrozenSet[Tuple[Expr, bool]]] = None
        for function_id, literals in dominating.items():
            for guard, _ in self.function(function_id).starts:
                path = literals | frozenset(guard)
                necessary = path if necessary is None else necessary & path
        return necessary or frozenset()

    def _entry_truth(self, entry: FunctionId, launch: Truth, evaluation: "Evaluation") -> Dict[FunctionId, Truth]:
        """Where each function the entry reaches runs when called: along the calls, each call's
        conditions narrow where its caller runs; the workers a spawn starts run on every rank."""
        truth: Dict[FunctionId, Truth] = {entry: launch & self._decorated(entry, evaluation)}
        pending: List[FunctionId] = [entry]
        while pending:
            current = pending.pop()
            here = truth[current]
            for site, target, _, spawn in self._edges.get(current, ()):
                reached = evaluation.guard_truth(site.guard, current[0], here)
                if reached == NEVER:
                    continue
                if spawn:
                    # The processes a spawn starts form a group if they start one (or wrap in DDP).
                    arriving = WORKERS if self._reaches_group(target)[0] else ONE_PROCESS
                else:
                    arriving = reached
                arriving = arriving & self._decorated(target, evaluation)
                before = truth.get(target)
                after = arriving if before is None else before | arriving
                if after != before:
                    truth[target] = after
                    pending.append(target)
        return truth

    def _decorated(self, function_id: FunctionId, evaluation: "Evaluation") -> Truth:
        """Where a decorated function's body runs when called: `@rank_zero_only` (Lightning), `@master_only`
        (mmcv) on rank 0 alone; a project's decorator where its wrapper calls the function (`if rank == 0:
        return func(*args, **kwargs)`)."""
        truth = ALWAYS
        for decorator in self.function(function_id).decorators:
            if _RANK_ZERO_DECORATOR.search(decorator.rpartition(".")[2]):
                return Truth("TTFF")
            found = self._lookup(decorator, function_id[0])
            if found is not None and found[0] == "function":
                truth = truth & self._wrapper_calls((found[1], found[2]), evaluation)
        return truth

    def _wrapper_calls(self, decorator: FunctionId, evaluation: "Evaluation") -> Truth:
        """Where the wrapper a decorator defines calls the function it decorates (always, if it defines none)."""
        function = self.function(decorator)
        if not function.params:
            return ALWAYS
        wrapped = ("v", self._parameter_prefix(decorator) + function.params[0])
        truth: Optional[Truth] = None
        inner = decorator[1] + "."
        for name, nested in self.files[decorator[0]].functions.items():
            if name.startswith(inner) and "." not in name[len(inner) :]:
                for site in nested.calls:
                    if site.callee == ("m", wrapped, "__call__"):
                        found = evaluation.guard_truth(site.guard, decorator[0])
                        truth = found if truth is None else truth | found
        return ALWAYS if truth is None else truth

    @cached_property
    def _built_by(self) -> Dict[str, FrozenSet[str]]:
        """A project function's name → the names of the project classes it returns instances of
        (`new_model()` returning a `CRNN`)."""
        found: Dict[str, Set[str]] = {}
        for filename, info in self.files.items():
            for name, function in info.functions.items():
                classes = frozenset().union(*(self.types(value, filename) for _, value in function.returns)) if function.returns else frozenset()
                if classes:
                    found.setdefault(name.rpartition(".")[2], set()).update(qualified.rpartition(".")[2] for qualified in classes)
        return {name: frozenset(classes) for name, classes in found.items()}

    def models_built_by(self, name: str) -> FrozenSet[str]:
        """What a model built by `name(...)` is: the class itself, or the classes a project function of that name returns."""
        return frozenset({name}) | self._built_by.get(name, frozenset())

    def reads_rank(self, expr: Expr, filename: str) -> bool:
        """Whether the expression (of the file, symbolic) or a part of it holds a rank, the world size or
        something computed from the rank: a data set built for one rank's shard."""
        return _reads_rank(self.default_evaluation, expr, filename)

    def defines_method(self, method: str) -> bool:
        """Whether a class of the project defines a method of that name."""
        return any(function.owner is not None and name.endswith("." + method) for info in self.files.values() for name, function in info.functions.items())

    @cached_property
    def called_names(self) -> FrozenSet[str]:
        """The qualified names the project's functions call (`accelerate.Accelerator`, `deepspeed.initialize`)."""
        return frozenset(
            site.callee[1] for info in self.files.values() for function in info.functions.values() for site in function.calls if site.callee[0] == "q"
        )

    @cached_property
    def _method_receivers(self) -> FrozenSet[Tuple[str, str]]:
        """(variable key, method) of every `<variable>.<method>(...)` the project calls."""
        return frozenset(
            (site.callee[1][1], site.callee[2])
            for info in self.files.values()
            for function in info.functions.values()
            for site in function.calls
            if site.callee[0] == "m" and site.callee[1][0] == "v"
        )

    def method_called_on(self, key: str, method: str) -> bool:
        """Whether the project calls `<the variable>.<method>(...)` anywhere (`model.parameters()`)."""
        return (key, method) in self._method_receivers

    def calls_method(self, function_id: FunctionId, method: str) -> bool:
        """Whether the function calls `<anything>.<method>(...)`."""
        return any(site.callee[0] == "m" and site.callee[2] == method for site in self.function(function_id).calls)

    def guard_through_calls(self, program: "Program", function_id: FunctionId, guard: Guard) -> Truth:
        """Where a statement of the function runs in the program, its guard read at each call with what
        that call passes (`save_checkpoint(..., save_cur=True)` on every rank, the other branch only
        under `if rank == 0:`); the entry, a spawned function, or a guard that reads no parameter, as a whole."""
        evaluation = program.evaluation
        joined = evaluation.guard_truth(guard, function_id[0], program.truth[function_id])
        function = self.function(function_id)
        prefix = self._parameter_prefix(function_id)
        callers = self._callers.get(function_id, ())
        reads_parameter = any(_mentions(test, prefix) for test, _ in guard)
        if function_id == program.entry or not reads_parameter or any(spawn for *_, spawn in callers):
            return joined
        truth = NEVER
        for caller, site, skipped, _ in callers:
            if caller not in program.truth:
                continue
            at_site = evaluation.guard_truth(site.guard, caller[0], program.truth[caller]) & self._decorated(function_id, evaluation)
            if at_site == NEVER:
                continue
            if any(name in ("*", "**") for name, _ in site.keywords):
                return joined  # `f(**options)`, `f(*args)`: what each parameter gets is not known
            bindings: Dict[str, Value] = {}
            for index, param in enumerate(function.params[skipped:]):
                passed = evaluation.passed(site, function, index, param)
                if passed is not None:
                    bindings[prefix + param] = evaluation.value(passed, caller[0])
            truth = truth | evaluation.guard_truth(guard, function_id[0], at_site, bindings)
        return truth

    def _parameter_prefix(self, function_id: FunctionId) -> str:
        """The start of the variable keys of the function's parameters (`L:<module>:<function>:`)."""
        module = self.files[function_id[0]].summary.module
        return f"L:{module}:{function_id[1][len(module) + 1:]}:"

    def reaching(self, function_id: FunctionId) -> List[Tuple[Truth, "Evaluation"]]:
        """Where the function runs when called, in each program that reaches it through resolved calls."""
        return [(program.truth[function_id], program.evaluation) for program in self.programs if function_id in program.truth]

    def group_on_one_node(self, function_id: FunctionId, size: Optional[Expr]) -> Optional[bool]:
        """Whether the process group of `size` processes (an expression of the function, followed back
        through the parameters and the variables the program assigns once) is known to run on one node:
        True where its size is the node's GPU count (`torch.cuda.device_count()`), or where `mp.spawn`
        starts the function and no spawn starts only a part of the group; False where one does (the size
        is the spawn's process count times another number: `world_size = gpus * nodes` with
        `nprocs=gpus`, a spawn per node); None where nothing shows it (a launcher started the processes)."""
        one_node = False
        pending: List[Tuple[FunctionId, Optional[Expr]]] = [(function_id, size)]
        seen: Set[Tuple[FunctionId, Optional[Expr]]] = set()
        while pending:
            current, expr = pending.pop()
            if (current, expr) in seen:
                continue
            seen.add((current, expr))
            expr = self._assigned_once(expr)
            if expr == _NODE_GPU_COUNT:
                one_node = True
                continue
            for caller, site, skipped, spawn in self._callers.get(current, ()):
                located = self._parameters.get(expr[1]) if expr is not None and expr[0] == "v" else None
                position = located[1] - skipped if located is not None and located[0] == current else None
                if spawn:
                    one_node = True
                    started = site.spawned_by or site
                    # The process index comes first; the spawn's `args=` follow it.
                    given = started.arguments[position - 1] if position is not None and 0 < position <= len(started.arguments) else expr
                    if started.processes is not None and _multiple_of(self._assigned_once(given), started.processes):
                        return False
                elif position is not None:
                    param = self.function(current).params[located[1]]
                    pending.append((caller, self.default_evaluation.passed(site, self.function(current), position, param)))
                else:
                    pending.append((caller, expr))
        return True if one_node else None

    def _assigned_once(self, expr: Optional[Expr]) -> Optional[Expr]:
        """What a variable the program assigns once holds (`world_size = args.gpus * args.nodes`,
        `self.num_gpus = num_gpus`), followed through such variables; a parameter is what its callers pass."""
        for _ in range(_MAX_DEPTH):
            if expr is None or expr[0] != "v" or expr[1] in self._parameters:
                break
            assigned = self.assignments(expr[1])
            if len(assigned) != 1:
                break
            expr = assigned[0][2]
        return expr

    # -- what the names hold: parameters and assignments ---------------------------------------------

    @cached_property
    def _parameters(self) -> Dict[str, Tuple[FunctionId, int]]:
        """The variable key of each parameter → its function and position."""
        found: Dict[str, Tuple[FunctionId, int]] = {}
        for filename, info in self.files.items():
            for name, function in info.functions.items():
                for index, param in enumerate(function.params):
                    found[self._parameter_prefix((filename, name)) + param] = ((filename, name), index)
        return found

    def assignments(
        self, key: str, within: Optional[FrozenSet[FunctionId]] = None, seen: FrozenSet[str] = frozenset()
    ) -> List[Tuple[FunctionId, Guard, Expr]]:
        """The values assigned to a variable (by the functions `within`, if given); for an attribute of
        `self`, in the class's bases too (once each: `class Block(Block)` names the imported `Block`,
        which may resolve to itself)."""
        found = [entry for entry in self._assigned.get(key, ()) if within is None or entry[0] in within]
        if found or not key.startswith("S:"):
            return found
        class_name, _, path = key[2:].partition(":")
        filename = self._class_file.get(class_name)
        for base in self.files[filename].classes.get(class_name, ()) if filename and class_name not in seen else ():
            resolved = self._class(base, filename)  # type: ignore[arg-type]
            if resolved is not None:
                inherited = self.assignments(f"S:{resolved[1]}:{path}", within, seen | {class_name})
                if inherited:
                    return inherited
        passed = self.passed_attribute(key)
        return self.assignments(passed, within) if passed is not None else []

    def passed_attribute(self, key: str) -> Optional[str]:
        """For an attribute path of `self` whose head the class was passed (`self.args = args`, then
        `self.args.gpu`): the same path of the object passed, as other functions name it (`A:args.gpu`).
        Asked of every variable an evaluation reads where the program has mode tests: worked out once."""
        if key not in self._passed:
            self._passed[key] = self._passed_attribute(key)
        return self._passed[key]

    def _passed_attribute(self, key: str) -> Optional[str]:
        class_name, _, path = key[2:].partition(":")
        head, _, rest = path.partition(".")
        if not key.startswith("S:") or not rest:
            return None
        held = self.assignments(f"S:{class_name}:{head}")
        names = {value[1].rpartition(":")[2] if value[0] == "v" and value[1].startswith("L:") else "" for _, _, value in held}
        return f"A:{names.pop()}.{rest}" if len(names) == 1 and "" not in names else None


@dataclass(frozen=True)
class Program:
    entry: FunctionId
    truth: Dict[FunctionId, Truth]  # where each function it reaches runs when called
    evaluation: "Evaluation"


class Evaluation:
    """What expressions hold in one program: the assignments of its own functions, and what holds in its
    process group (its mode literals)."""

    def __init__(self, model: ExecutionModel, modes: FrozenSet[Tuple[Expr, bool]], functions: Optional[FrozenSet[FunctionId]]) -> None:
        self.model = model
        self._mode_tests = {test: "T" if holds else "F" for test, holds in modes}
        self._functions = functions  # the program's own: only their assignments count (None: every function's)
        self._values: Dict[str, Value] = {}
        self._evaluating: Set[str] = set()  # the variables whose assignments are being read (a cycle)
        self._rank_passed: Optional[Value] = None  # what `dist.get_rank()` returns (`_group_rank`)

    def guard_truth(self, guard: Guard, filename: str, within: Truth = ALWAYS, bindings: Optional[Mapping[str, Value]] = None, depth: int = 0) -> Truth:
        found = within
        for literal in guard:
            found = found & self.literal_truth(literal, filename, bindings, depth)
            if found == NEVER:
                break
        return found

    def literal_truth(self, literal: Tuple[Expr, bool], filename: str, bindings: Optional[Mapping[str, Value]] = None, depth: int = 0) -> Truth:
        test, holds = literal
        found = truth_of(self.value(test, filename, bindings, depth))
        return found if holds else ~found

    # -- values --------------------------------------------------------------------------------------

    def value(self, expr: Expr, filename: str, bindings: Optional[Mapping[str, Value]] = None, depth: int = 0) -> Value:
        found = self._value(expr, filename, bindings, depth)
        in_group = self._mode_tests.get(expr) if expr[0] in _TESTS else None
        if in_group is None and expr[0] == "v" and self._mode_tests:
            passed = self.model.passed_attribute(expr[1])  # `self.args.distributed` is `args.distributed`
            in_group = self._mode_tests.get(("v", passed)) if passed is not None else None
        if in_group is not None:
            # The program starts its group only where this test has this value: so it has it in every group.
            return ("bool", Truth(truth_of(found)[0] + in_group * 3))
        return found

    def _value(self, expr: Expr, filename: str, bindings: Optional[Mapping[str, Value]], depth: int) -> Value:
        kind = expr[0]
        if kind == "c":
            return ("const", expr[1])
        if kind == "v":
            if bindings and expr[1] in bindings:
                return bindings[expr[1]]
            if expr[1].endswith(":__name__"):
                return ("const", "__main__")  # what matters is a script's own run
            return self.variable(expr[1])
        if kind == "env":
            name = expr[1] or ""
            if name in _GLOBAL_RANK_VARIABLES:
                return ("rank", "global")
            if name in _LOCAL_RANK_VARIABLES:
                return ("rank", "local")
            if name in _WORLD_SIZE_VARIABLES:
                return ("world",)
            return UNIFORM_VALUE
        if kind == "has":
            launched = (expr[1] or "") in (_GLOBAL_RANK_VARIABLES | _LOCAL_RANK_VARIABLES | _WORLD_SIZE_VARIABLES)
            return ("bool", Truth("FUUU") if launched else UNIFORM)
        if kind in ("and", "or"):
            values = [self.value(part, filename, bindings, depth) for part in expr[1:]]
            if any(value[0] == "bool" for value in values):
                truths = [truth_of(value) for value in values]
                if kind == "or" and any(varies(("bool", truth)) for truth in truths):
                    # `not args.multiprocessing_distributed or args.rank % ngpus == 0`: beside a rank test, a
                    # test alike on every rank says which runs have no group; in a group, the rank test decides.
                    truths = [truth if varies(("bool", truth)) else Truth(truth[0] + truth[GROUP_WORLDS].replace("U", "F")) for truth in truths]
                found = truths[0]
                for truth in truths[1:]:
                    found = (found & truth) if kind == "and" else (found | truth)
                return ("bool", found)
            result = values[0]
            for value in values[1:]:
                result = join(result, value)
            return result
        if kind == "not":
            return ("bool", ~truth_of(self.value(expr[1], filename, bindings, depth)))
        if kind == "ifexp":
            test, body, orelse = (self.value(part, filename, bindings, depth) for part in expr[1:])
            if body[0] in ("bool", "const") and orelse[0] in ("bool", "const"):
                holds = truth_of(test)
                return ("bool", (holds & truth_of(body)) | (~holds & truth_of(orelse)))
            return join(body, orelse)
        if kind == "cmp":
            return _compare(expr[1], self.value(expr[2], filename, bindings, depth), self.value(expr[3], filename, bindings, depth))
        if kind == "bin":
            return _arithmetic(expr[1], self.value(expr[2], filename, bindings, depth), self.value(expr[3], filename, bindings, depth))
        if kind in ("fmt", "items"):
            return mixed([self.value(part, filename, bindings, depth) for part in expr[1:]])
        if kind == "tuple":
            return ("tuple", *(self.value(part, filename, bindings, depth) for part in expr[1:]))
        if kind == "item":
            container = self.value(expr[1], filename, bindings, depth)
            if container[0] == "tuple" and isinstance(expr[2], int) and expr[2] < len(container) - 1:
                return container[expr[2] + 1]
            if expr[2] is None:
                # What a loop takes from what it iterates: data, which differs between the ranks where the
                # ranks iterate different things, but no test on it picks ranks.
                if container[:2] in (("object", DATA_LOADER), ("object", PREPARED_LOADER)):
                    return self._batch(container)
                return SHARE_VALUE if varies(container) else UNIFORM_VALUE
            index = self.value(expr[2], filename, bindings, depth) if isinstance(expr[2], tuple) else UNIFORM_VALUE
            return mixed((container, index))
        if kind == "attr":
            known = _FRAMEWORK_ATTRIBUTES.get(expr[2].rpartition(".")[2])
            if known is not None:
                return known
            return mixed([self.value(expr[1], filename, bindings, depth)])
        if kind == "call":
            return self._call_value(expr, filename, bindings, depth)
        return UNIFORM_VALUE

    def _batch(self, loader: Value) -> Value:
        """What iterating a loader gives: a batch of the rank's own share where Accelerate prepared the
        loader or its sampler is a `DistributedSampler`."""
        if loader[1] == PREPARED_LOADER:
            return SHARE_VALUE
        filename, (_, _, arguments, keywords) = loader[2], loader[3]
        named = dict(keywords)
        samplers = [named.get("sampler", arguments[2] if len(arguments) > 2 else None), named.get("batch_sampler")]
        return mixed([self.value(sampler, filename) for sampler in samplers if sampler is not None])

    def _group_rank(self, depth: int) -> Value:
        """What `dist.get_rank()` returns in this program: the rank its `init_process_group` calls pass
        (`rank=local_rank` makes it the local rank), the global rank where a call passes none (torchrun's
        RANK) or the program starts no group itself."""
        if self._rank_passed is None:
            self._rank_passed = ("rank", "global")
            passed: List[Value] = []
            for filename, info in self.model.files.items():
                for function in info.functions.values():
                    if self._functions is not None and (filename, function.name) not in self._functions:
                        continue
                    for site in function.calls:
                        if site.callee[0] == "q" and site.callee[1] in INIT_PROCESS_GROUP:
                            rank = dict(site.keywords).get("rank", site.arguments[4] if len(site.arguments) > 4 else None)
                            passed.append(self.value(rank, filename, None, depth + 1) if rank is not None else ("rank", "global"))
            if passed and all(value == ("rank", "local") for value in passed):
                self._rank_passed = ("rank", "local")
        return self._rank_passed

    def _call_value(self, expr: Expr, filename: str, bindings: Optional[Mapping[str, Value]], depth: int) -> Value:
        callee, arguments, keywords = expr[1], expr[2], expr[3]
        if callee[0] == "q" and callee[1] in _LIBRARY_VALUES:
            known = _LIBRARY_VALUES[callee[1]]
            if (arguments or keywords) and known in (("rank", "global"), ("world",)):
                # `dist.get_rank(group=local_group)`: the rank within a subgroup (a node's, often), not the job's
                return ("rank", "any") if known[0] == "rank" else UNIFORM_VALUE
            if callee[1] in GROUP_RANK_GETTERS:
                return self._group_rank(depth)
            return known
        if callee[0] == "q" and _optimizer_class(callee[1]):
            return ("object", OPTIMIZER)
        if callee[0] == "q" and callee[1] in DATA_LOADERS:
            # A loader of what differs between the ranks (a rank's own shard) is what any other call of it is.
            passed = [*arguments, *(value for _, value in keywords)]
            if any(varies(self.value(argument, filename, bindings, depth), shares=False) for argument in passed):
                return VARIES_VALUE
            return ("object", DATA_LOADER, filename, expr)
        preparer = callee[0] == "q" and callee[1] in _LOADER_PREPARERS
        if preparer or (
            callee[0] == "m" and callee[2] in ("prepare", "prepare_data_loader") and self.value(callee[1], filename, bindings, depth) == ACCELERATOR
        ):
            # `accelerator.prepare(model, optimizer, loader, ...)` hands back each object wrapped, in order: the
            # same kinds, but a loader sharded between the processes (`prepare_data_loader`: its first argument).
            if preparer or callee[2] == "prepare_data_loader":
                arguments = arguments[:1] or tuple(value for name, value in keywords if name == "dataloader")
            prepared = tuple(
                SAME_VALUE if argument[0] == "v" and argument[1] in self._evaluating else _prepared(self.value(argument, filename, bindings, depth))
                for argument in arguments
            )
            return prepared[0] if len(prepared) == 1 else ("tuple", *prepared)
        if callee[0] == "m" and callee[2] in ("item", "to", "cuda", "cpu", "__call__", "format", "strip", "lower"):
            inner = self.value(callee[1], filename, bindings, depth)
            if callee[2] == "format":
                return mixed([inner] + [self.value(a, filename, bindings, depth) for a in arguments])
            if callee[2] != "__call__":
                return inner
        if depth < _MAX_DEPTH:
            results = []
            for target, skipped in self.model.targets(callee, filename):
                function = self.model.function(target)
                if not function.returns:
                    continue
                own: Dict[str, Value] = {}
                scope = self.model._parameter_prefix(target)
                site = CallSite(callee, (), 0, arguments, keywords)
                for index, name in enumerate(function.params[skipped:]):
                    # What the call passes, or the default it leaves (`is_master(args)`: `local=False`);
                    # after a `*args` only what is passed by keyword is known.
                    passed = dict(keywords).get(name) if ("*", UNKNOWN) in keywords else self.passed(site, function, index, name)
                    if passed is not None:
                        own[scope + name] = self.value(passed, filename, bindings, depth + 1)
                values = [(guard, self.value(returned, target[0], own, depth + 1)) for guard, returned in function.returns]
                if all(value[0] in ("bool", "const") for _, value in values):
                    # A predicate: it holds where one of its `return`s gives true, under that return's conditions.
                    holds = NEVER
                    for guard, value in values:
                        holds = holds | (self.guard_truth(guard, target[0], ALWAYS, own, depth + 1) & truth_of(value))
                    result: Optional[Value] = ("bool", holds)
                else:
                    result = None
                    given = NEVER  # where a `return` gives something other than None
                    for guard, value in values:
                        if value != ("const", None):
                            result = value if result is None else join(result, value)
                            given = given | self.guard_truth(guard, target[0], ALWAYS, own, depth + 1)
                    if result is not None and len(values) > 1 and ("const", None) in (value for _, value in values):
                        # `return None` unless rank 0: what a test of the result for None picks is where the rest return.
                        result = ("maybe", given, result)
                if result is not None:
                    results.append(result)
            if results:
                found = results[0]
                for other in results[1:]:
                    found = join(found, other)
                return found
        if callee[0] == "q" and callee[1].rpartition(".")[2] in _FRAMEWORK_ATTRIBUTES:
            return _FRAMEWORK_ATTRIBUTES[callee[1].rpartition(".")[2]]
        if callee[0] in ("q", "m"):
            name = callee[1].rpartition(".")[2] if callee[0] == "q" else callee[2]
            fallback = _by_name(name)
            if fallback is not None:
                return fallback
        parts = [self.value(argument, filename, bindings, depth) for argument in arguments]
        parts += [self.value(value, filename, bindings, depth) for _, value in keywords]
        if callee[0] == "m":
            parts.append(self.value(callee[1], filename, bindings, depth))
        return mixed(parts)

    def variable(self, key: str) -> Value:
        if key in self._values:
            return self._values[key]
        # An option's attribute (`args.local_rank`) also holds what the command line or a config gave it:
        # what `args.local_rank += ...` reads, and what it holds wherever no assignment surely runs.
        option = key.startswith("A:")
        given = (_by_name(key.rpartition(".")[2]) or UNIFORM_VALUE) if option else UNIFORM_VALUE
        self._values[key] = given  # a cycle adds nothing more
        self._evaluating.add(key)
        try:
            found = self._assigned_value(key, option, given)
        finally:
            self._evaluating.discard(key)
        self._values[key] = found
        return found

    def _assigned_value(self, key: str, option: bool, given: Value) -> Value:
        found: Optional[Value] = None
        prepared = False  # assigned what `accelerator.prepare` hands back for what it held
        flags: List[Tuple[FunctionId, Truth, Truth]] = []  # (function, where assigned, the truth assigned) of each boolean value
        for (filename, function), guard, value in self.model.assignments(key, self._functions):
            assigned_where = self.guard_truth(guard, filename)
            if assigned_where == NEVER:
                continue
            evaluated = self.value(value, filename)
            if evaluated == SAME_VALUE:
                prepared = True
                continue  # `model = accelerator.prepare(model)`: what it held before
            if evaluated == UNIFORM_VALUE and value[0] in ("call", "item", "u"):
                # What a call nothing resolves returns (`cfg.LOCAL_RANK = getattr(utils, f"init_{launcher}")(...)`)
                # is unknown: a name that says it holds a rank holds one.
                evaluated = _by_name(key.rpartition(":")[2].rpartition(".")[2]) or evaluated
            if evaluated[0] in ("bool", "const"):
                flags.append(((filename, function), assigned_where, truth_of(evaluated)))
            else:
                found = evaluated if found is None else join(found, evaluated)
        if flags:
            # A flag holds, in each world, one of the values assigned where its assignment can run there
            # (`master_process = rank == 0` in a group, `= True` in one process).
            # Assigned in several places, it holds one value or another: alike on every rank only if none
            # of the values depends on the rank (`is_master = True`, then `is_master = rank == 0`: unknown).
            # In one function, an assignment that surely runs in a world replaces the earlier ones there
            # (`verbose = True`, then `if distributed and gpu != 0: verbose = False`).
            by_rank = any(varies(("bool", truth)) for _, _, truth in flags)
            letters = []
            for world in range(len(WORLDS)):
                live: List[Tuple[FunctionId, Truth, Truth]] = []
                for entry in flags:
                    if entry[1][world] == "T":
                        live = [earlier for earlier in live if earlier[0] != entry[0]]
                    live.append(entry)
                seen = {truth[world] for _, where, truth in live if where[world] != "F"}
                if option and not any(where[world] == "T" for _, where, _ in flags):
                    seen.add(truth_of(given)[world])
                letters.append(seen.pop() if len(seen) == 1 else "Q" if "Q" in seen or (by_rank and world) else "U")
            flag: Value = ("bool", Truth("".join(letters)))
            found = flag if found is None else join(found, flag)
        parameter = self._parameter_value(key)
        if parameter is not None:
            found = parameter if found is None else join(found, parameter)
        if found is None:
            found = _by_name(key.rpartition(":")[2].rpartition(".")[2]) or UNIFORM_VALUE
        return _prepared(found) if prepared else found

    def passed(self, site: CallSite, function: FunctionSummary, position: int, param: str) -> Optional[Expr]:
        """What a call passes to a parameter (`position` among the arguments the call writes): by keyword,
        by position, the entry the caller set in the dict it unpacks, or else the parameter's default."""
        keywords = dict(site.keywords)
        passed = keywords.get(param)
        if passed is None and 0 <= position < len(site.arguments):
            passed = site.arguments[position]
        unpacked = keywords.get("**")
        if passed is None and unpacked is not None and unpacked[0] == "v":
            # `kwargs["device_id"] = i` … `main(**kwargs)`: the entry the caller put there.
            entry = f"A:{unpacked[1].rpartition(':')[2]}.{param}"
            if self.model.assignments(entry, self._functions):
                passed = ("v", entry)
        return passed if passed is not None else dict(function.defaults).get(param)

    def _parameter_value(self, key: str) -> Optional[Value]:
        """What the calls pass to a parameter: spawn's process index is the local rank."""
        located = self.model._parameters.get(key)
        if located is None:
            return None
        function_id, index = located
        function = self.model.function(function_id)
        param = function.params[index]
        found: Optional[Value] = None
        for caller, site, skipped, spawn in self.model._callers.get(function_id, ()):
            if self._functions is not None and caller not in self._functions:
                continue
            if spawn:
                value = ("rank", "local") if index == 0 else self.value(site.arguments[index - 1], caller[0]) if index - 1 < len(site.arguments) else None
            else:
                passed = self.passed(site, function, index - skipped, param)
                value = self.value(passed, caller[0]) if passed is not None else None
            if value is not None:
                found = value if found is None else join(found, value)
        return found


# How many GPUs this node has: a group of that many processes is one node's.
_NODE_GPU_COUNT: Expr = ("call", ("q", "torch.cuda.device_count"), (), ())


def _multiple_of(expr: Optional[Expr], factor: Expr) -> bool:
    """Whether the expression multiplies `factor` by something other than 1 (`gpus * nodes`, `nodes * gpus`)."""
    if expr is None or expr[0] != "bin" or expr[1] != "*":
        return False
    return any(side == factor and other != ("c", 1) for side, other in ((expr[2], expr[3]), (expr[3], expr[2])))


def _mentions(expr: object, prefix: str) -> bool:
    """Whether a symbolic expression reads a variable whose key starts with `prefix`."""
    if isinstance(expr, tuple):
        if len(expr) == 2 and expr[0] == "v" and isinstance(expr[1], str):
            return expr[1].startswith(prefix)
        return any(_mentions(part, prefix) for part in expr)
    return False


def _object_test(test: Expr, key: str) -> Optional[bool]:
    """The truth of a test of the variable `key` where it holds an object (truthy, never None):
    `x`, `x is None`, `x is not None`, `x == None`, `not x`, and `and`/`or` of these; None if unknown."""
    kind = test[0]
    if kind == "v":
        return True if test[1] == key else None
    if kind == "not":
        inner = _object_test(test[1], key)
        return None if inner is None else not inner
    if kind == "cmp" and test[1] in ("is", "is not", "==", "!="):
        sides = (test[2], test[3])
        if ("v", key) in sides and ("c", None) in sides:
            return test[1] in ("is not", "!=")
        return None
    if kind in ("and", "or"):
        parts = [_object_test(part, key) for part in test[1:]]
        if kind == "and":
            return False if False in parts else True if all(part is True for part in parts) else None
        return True if True in parts else False if all(part is False for part in parts) else None
    return None


def guards_exclude(guard: Guard, other: Guard) -> bool:
    """Whether two sets of conditions cannot both hold: one holds a test the other negates."""
    return any((test, not holds) in other for test, holds in guard)


# The kinds of expression a branch can test (a mode literal is one of these).
_TESTS = frozenset({"v", "cmp", "has", "and", "or", "call", "attr"})


def _by_name(name: str) -> Optional[Value]:
    """A value named like a rank, for a name the program never assigns (the last resort)."""
    if name in _GLOBAL_RANK_VARIABLES:  # an entry of a copy of the environment: `env_dict["RANK"]`
        return ("rank", "global")
    if name in _LOCAL_RANK_VARIABLES:
        return ("rank", "local")
    if name in _WORLD_SIZE_VARIABLES:
        return ("world",)
    if name in _FRAMEWORK_ATTRIBUTES:
        return _FRAMEWORK_ATTRIBUTES[name]
    if _LOCAL_RANK_NAME.match(name):
        return ("rank", "local")
    if _GLOBAL_RANK_NAME.match(name):
        return ("rank", "global")
    if _WORLD_SIZE_NAME.match(name):
        return ("world",)
    if _RANK_NAME.match(name):
        return ("rank", "any") if name.lower() == "rank" else VARIES_VALUE  # a node's rank is shared by its processes
    if _RANK_PREDICATE_NAME.match(name):
        return VARIES_VALUE
    return None


# ----- pass 2: the statements of one file ----------------------------------------------------------------


class FileExecution:
    """Where the statements of one file run, from the project's model and the file's own tree."""

    def __init__(self, model: ExecutionModel, tree: ast.Module, filename: str, module: str, package: str) -> None:
        self.model = model
        self.filename = filename
        if filename in model.files:
            module = model.files[filename].summary.module  # the name the model knows the file by
        self.module = module
        self.symbols = Symbols(tree, module, package)
        # (first line, last line, name, node, scope) of the module's top level and of every function
        self._functions: List[Tuple[int, int, str, ast.AST, _Scope]] = [
            (getattr(node, "lineno", 1), getattr(node, "end_lineno", None) or 1 << 30, name, node, scope)
            for name, node, scope, _ in self.symbols.functions
        ]
        self._guarded: Dict[str, List[Tuple[ast.stmt, Guard]]] = {}

    def _function_at(self, line: int) -> Optional[Tuple[str, ast.AST, _Scope]]:
        """The innermost function whose body holds the line (the module for top-level code)."""
        best = None
        for first, last, name, node, scope in self._functions:
            body = getattr(node, "body", None)
            if not body:
                continue
            if body[0].lineno <= line <= last and (best is None or first >= best[0]):
                best = (first, name, node, scope)
        return best[1:] if best is not None else None

    def _statement(self, line: int) -> Optional[Tuple[str, ast.stmt, Guard]]:
        """The function holding the line, and its innermost statement there with that statement's guard."""
        found = self._function_at(line)
        if found is None:
            return None
        name, node, scope = found
        statements = self._guarded.get(name)
        if statements is None:
            statements = self._guarded[name] = list(guarded_statements(node.body, self.symbols, scope))  # type: ignore[attr-defined]
        innermost: Optional[Tuple[ast.stmt, Guard]] = None
        for statement, guard in statements:
            if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
                if innermost is None or statement.lineno >= innermost[0].lineno:
                    innermost = (statement, guard)
        if innermost is None or isinstance(innermost[0], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None
        return name, innermost[0], innermost[1]

    def _evaluations(self, name: str) -> List[Tuple[Truth, "Evaluation"]]:
        return self.model.reaching((self.filename, name))

    def where(self, line: int) -> Optional[Where]:
        """Where the statement at the line runs; None where no entry reaches it through resolved calls,
        or it is not in a function's (or the module's) own statements."""
        found = self._statement(line)
        if found is None:
            return None
        name, _, guard = found
        function = (self.filename, name)
        truth: Optional[Truth] = None
        for program in self.model.programs:
            if function in program.truth:
                found = self.model.guard_through_calls(program, function, guard)
                truth = found if truth is None else truth | found
        return Where(truth) if truth is not None else None

    def unreached_helper(self, line: int) -> Optional[str]:
        """The name of the top-level function holding the line where it is a helper no program reaches
        and no function of the project calls, in a module the project imports (so not a surface left
        for code outside the project); else None."""
        found = self._function_at(line)
        if found is None or self.filename not in self.model._imported:
            return None
        name = found[0]
        function = (self.filename, name)
        info = self.model.files.get(self.filename)
        if info is None or name not in info.functions or info.functions[name].owner is not None:
            return None
        if name.count(".") != info.summary.module.count(".") + 1 or self.model._callers.get(function):
            return None
        if any(function in program.truth for program in self.model.programs):
            return None
        return name.rpartition(".")[2]

    def local_where(self, line: int) -> Optional[Where]:
        """Where the statement at the line runs each time its function is called: its own function's
        conditions alone (what a rank test written there does), in the programs that reach it (or, where
        none does, as the file shows it)."""
        found = self._statement(line)
        if found is None:
            return None
        name, _, guard = found
        evaluations = [evaluation for _, evaluation in self._evaluations(name)] or [self.model.default_evaluation]
        truth: Optional[Truth] = None
        for evaluation in evaluations:
            found = evaluation.guard_truth(guard, self.filename)
            truth = found if truth is None else truth | found
        return Where(truth)  # type: ignore[arg-type]

    def test_truth(self, code: str, line: int) -> Truth:
        """Per world, whether a condition written at the line holds."""
        found = self._function_at(line)
        if found is None:
            return VARIES
        name, _, scope = found
        try:
            node = ast.parse(f"(\n{code}\n)", mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return VARIES
        test = self.symbols.expr(node, scope)
        evaluations = [evaluation for _, evaluation in self._evaluations(name)] or [self.model.default_evaluation]
        truth: Optional[Truth] = None
        for evaluation in evaluations:
            found_truth = truth_of(evaluation.value(test, self.filename))
            truth = found_truth if truth is None else truth.either(found_truth)
        return truth or VARIES

    def programs_call(self, line: int, method: str, among_callers_of: Optional[str] = None) -> Optional[bool]:
        """Whether every program that runs the statement at the line in a process group calls
        `<anything>.<method>(...)` somewhere in its own code (None: no program is known to); with
        `among_callers_of`, of those programs only the ones that call that method too (`backward`: the
        programs that train)."""
        found = self._statement(line)
        if found is None:
            return None
        name, _, guard = found
        function = (self.filename, name)
        programs = [
            program
            for program in self.model.programs
            if function in program.truth
            and Where(self.model.guard_through_calls(program, function, guard)).in_group
            and (among_callers_of is None or any(self.model.calls_method(other, among_callers_of) for other in program.truth))
        ]
        if not programs:
            return None
        return all(any(self.model.calls_method(function, method) for function in program.truth) for program in programs)

    def _reaching_evaluations(self, line: int) -> List["Evaluation"]:
        """The values of each program that reaches the function at the line (its own assignments: another
        program's module of the same name does not count), or where none does, the whole project's."""
        found = self._function_at(line)
        evaluations = [evaluation for _, evaluation in self._evaluations(found[0])] if found is not None else []
        return evaluations or [self.model.default_evaluation]

    def feeds_a_loader(self, class_name: str) -> bool:
        """Whether the project hands objects of this file's top-level class to a torch `DataLoader`
        (`ExecutionModel.loader_data_sets`)."""
        info = self.model.files.get(self.filename)
        return info is not None and f"{info.summary.module}.{class_name}" in self.model.loader_data_sets

    def reads_rank(self, code: str, line: int) -> bool:
        """Whether an expression at the line, or a part of it, holds a rank, the world size or something
        computed from the rank (`ExecutionModel.reads_rank`); one the model cannot read may."""
        expr = self.expression(code, line)
        return expr is None or any(_reads_rank(evaluation, expr, self.filename) for evaluation in self._reaching_evaluations(line))

    def rules_out_object(self, line: int, code: str) -> bool:
        """Whether the conditions of the statement at the line rule out that the expression holds the
        object it holds (`accelerator`, an Accelerator): a test of the expression itself (the body of
        `if accelerator is None:`, the `else` of `if self.accelerator:`), or the negation of a condition
        under which every assignment of that object is made (the `else` of `if args.deepspeed:` where the
        engine is built under it). A statement outside any function's own statements is ruled out."""
        found = self._statement(line)
        expr = self.expression(code, line)
        if found is None or expr is None:
            return True
        guard = found[2]
        key = expr[1] if expr[0] == "v" else None
        if key is not None:
            for test, holds in guard:
                known = _object_test(test, key)
                if known is not None and known != holds:
                    return True
        held = self.value(code, line)
        if key is None or held[0] != "object":
            return False
        for evaluation in self._reaching_evaluations(line):
            common: Optional[Set[Tuple[Expr, bool]]] = None
            for (filename, _), assigned_guard, assigned in self.model.assignments(key, evaluation._functions):
                if evaluation.value(assigned, filename) == held:
                    common = set(assigned_guard) if common is None else common & set(assigned_guard)
            if common and guards_exclude(guard, tuple(common)):
                return True
        return False

    def statement_guard(self, line: int) -> Optional[Guard]:
        """The conditions the statement at the line runs under in its function (None: no statement there)."""
        found = self._statement(line)
        return found[2] if found is not None else None

    def _program_calls(self, line: int) -> Iterator[Tuple[str, CallSite, "Evaluation"]]:
        """Every call the programs reaching the statement at the line make anywhere in their code (the
        whole project's, where no program reaches it), with its file and that program's values."""
        found = self._function_at(line)
        function = (self.filename, found[0]) if found is not None else None
        programs = [program for program in self.model.programs if function in program.truth]
        searched = [(program.evaluation, tuple(program.truth)) for program in programs] or [
            (self.model.default_evaluation, tuple((filename, name) for filename, info in self.model.files.items() for name in info.functions))
        ]
        for evaluation, functions in searched:
            for function_id in functions:
                for site in self.model.function(function_id).calls:
                    yield function_id[0], site, evaluation

    def object_calls(self, line: int, object_class: str, methods: FrozenSet[str]) -> List[Tuple[str, CallSite, "Evaluation"]]:
        """The calls `<object of the class>.<method>(...)` that the programs reaching the statement at the
        line make (see `_program_calls`)."""
        return [
            (filename, site, evaluation)
            for filename, site, evaluation in self._program_calls(line)
            if site.callee[0] == "m" and site.callee[2] in methods and evaluation.value(site.callee[1], filename) == ("object", object_class)
        ]

    def library_calls(self, line: int, qualified: str) -> List[Tuple[str, CallSite, "Evaluation"]]:
        """The calls of a library function (`deepspeed.initialize`) that the programs reaching the statement
        at the line make (see `_program_calls`)."""
        return [(filename, site, evaluation) for filename, site, evaluation in self._program_calls(line) if site.callee == ("q", qualified)]

    def same_variable(self, code: str, line: int, other: Expr) -> bool:
        """Whether the expression (its source code, at the line) names the same variable as a symbolic one."""
        expr = self.expression(code, line)
        return expr is not None and expr[0] == "v" and expr == other

    def expression(self, code: str, line: int) -> Optional[Expr]:
        """An expression (its source code) of the function at the line, as the model reads it (symbolic);
        None where it does not parse."""
        try:
            node = ast.parse(f"(\n{code}\n)", mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        found = self._function_at(line)
        return self.symbols.expr(node, found[2] if found is not None else self.symbols.module_scope)

    def value(self, code: str, line: int) -> Value:
        """What an expression (its source code) of the function at the line holds."""
        expr = self.expression(code, line)
        if expr is None:
            return VARIES_VALUE
        value: Optional[Value] = None
        for evaluation in self._reaching_evaluations(line):
            found_value = evaluation.value(expr, self.filename)
            value = found_value if value is None else join(value, found_value)
        return value  # type: ignore[return-value]

    def group_on_one_node(self, line: int, size: Optional[str]) -> Optional[bool]:
        """Whether the process group of `size` processes (an expression's source code, at the line) is
        known to run on one node (`ExecutionModel.group_on_one_node`): True, False (a spawn per node) or
        None (unknown)."""
        found = self._function_at(line)
        if found is None:
            return None
        return self.model.group_on_one_node((self.filename, found[0]), self.expression(size, line) if size is not None else None)

    def holds_plain_objects(self, code: str, line: int) -> bool:
        """Whether an expression at the line holds only objects of project classes that are no `nn.Module`
        (`FixMatch(...)`, whose `.model` is the network)."""
        classes = self._classes_held(code, line)
        return bool(classes) and all(self.model.plain_class(name) for name in classes)

    def holds_modules_without_buffers(self, code: str, line: int) -> bool:
        """Whether an expression at the line holds only objects of project classes known to hold no buffers
        (`Generator(h)`, built of convolutions with weight norm)."""
        classes = self._classes_held(code, line)
        return bool(classes) and not any(self.model.may_hold_buffers(name) for name in classes)

    def _classes_held(self, code: str, line: int) -> FrozenSet[str]:
        expr = self.expression(code, line)
        return frozenset() if expr is None else self.model.types(expr, self.filename)

    def varies(self, code: str, line: int) -> bool:
        """Whether an expression at the line may hold a different value on each rank (a path built from the rank)."""
        return varies(self.value(code, line))
