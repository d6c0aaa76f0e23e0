"""What the DDP/torchrun rules (DPL5xx) know about a file of a distributed program: qualified names of
the collectives and wrappers, which values are ranks and which tests run code on some ranks only
(`RankKnowledge`), the code every rank runs, and the names bound to a DDP/FSDP wrapper. Which programs
start a process group, and what their files say, is in `facts` (`DistributedProject`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple

import libcst as cst

from dplint.analysis.facts import DistributedProgram, FileFacts, scan_distributed, scan_imports
from dplint.analysis.names import Body, block_body, child_blocks, dotted, header_expressions, iter_calls, iter_small_statements, names_in
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.analysis.execution import ACCELERATOR_CLASS, DEEPSPEED_ENGINE, OPTIMIZER, builders_of
from dplint.analysis.torch_api import DISTRIBUTED_SAMPLERS

DISTRIBUTED = "torch.distributed"
# torch.distributed's collectives (2.13). All of them return None, or a work handle with async_op=True.
COLLECTIVE_NAMES = frozenset(
    """barrier monitored_barrier all_reduce reduce broadcast all_gather all_gather_into_tensor gather scatter
    reduce_scatter reduce_scatter_tensor all_to_all all_to_all_single all_gather_object broadcast_object_list
    gather_object scatter_object_list""".split()
)
# Methods of the frameworks' objects (the classes `FileContext.framework_object` names) that run a
# collective inside: every rank must call them. Accelerate's `save_state` and `get_state_dict` gather only
# under DeepSpeed or FSDP: `SHARDED_ACCELERATE_COLLECTIVES`, where the program itself sets those up.
FRAMEWORK_COLLECTIVES: Dict[str, FrozenSet[str]] = {
    ACCELERATOR_CLASS: frozenset({"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes"}),
    DEEPSPEED_ENGINE: frozenset({"save_checkpoint"}),
    "lightning.Trainer": frozenset({"save_checkpoint"}),  # the strategy's barrier, under a multi-process strategy
    "lightning.Fabric": frozenset({"barrier", "all_gather", "all_reduce", "broadcast", "save"}),
}
# torch.distributed.checkpoint's save and load: every rank plans, gathers the plans and meets at a barrier.
CHECKPOINT_COLLECTIVES = frozenset(
    f"torch.distributed.checkpoint.{name}"
    for name in ("save", "load", "async_save", "state_dict_saver.save", "state_dict_saver.async_save", "state_dict_loader.load")
)
# torch.distributed.checkpoint.state_dict's getters and setters: a full state dict of a sharded model is
# gathered from every rank (and a setter broadcasts from rank 0), so every rank must call them.
STATE_DICT_COLLECTIVES = frozenset(
    f"torch.distributed.checkpoint.state_dict.{name}"
    for name in ("get_model_state_dict", "get_optimizer_state_dict", "get_state_dict", "set_model_state_dict", "set_optimizer_state_dict", "set_state_dict")
)
# DTensor's method that gathers its shards from every rank of its mesh.
GATHERING_TENSOR_METHODS = frozenset({"full_tensor"})
SHARDED_ACCELERATE_COLLECTIVES = frozenset({"save_state", "get_state_dict"})
# What sets up DeepSpeed or FSDP for an Accelerator: its plugins, or the keywords that take them.
ACCELERATE_SHARDING_PLUGINS = frozenset(
    f"accelerate.{module}{name}"
    for module in ("", "utils.", "utils.dataclasses.")
    for name in ("DeepSpeedPlugin", "FullyShardedDataParallelPlugin")
)
ACCELERATE_SHARDING_KEYWORDS = frozenset({"deepspeed_plugin", "deepspeed_plugins", "fsdp_plugin"})
ACCELERATOR_BUILDERS = builders_of(ACCELERATOR_CLASS)
# The Accelerator's methods that hand back the objects they are given, prepared, in order.
PREPARE_METHODS = frozenset({"prepare", "prepare_model"})
# The frameworks' collective methods by name alone: a first test of a call, before its receiver's value is read.
FRAMEWORK_METHODS = frozenset().union(*FRAMEWORK_COLLECTIVES.values(), SHARDED_ACCELERATE_COLLECTIVES)
# A file that calls one of these methods by name (a prefilter: the receiver is read later).
_COLLECTIVE_METHODS = sorted(
    FRAMEWORK_METHODS | GATHERING_TENSOR_METHODS | {name.rpartition(".")[2] for name in CHECKPOINT_COLLECTIVES | STATE_DICT_COLLECTIVES}
)
CALLS_A_FRAMEWORK_COLLECTIVE = GuardedPattern(r"\.(?:" + "|".join(_COLLECTIVE_METHODS) + r")\s*\(", _COLLECTIVE_METHODS)
# FSDP's class methods that gather the full parameters: every rank must call them.
FSDP_COLLECTIVE_METHODS = frozenset({"summon_full_params", "full_optim_state_dict", "optim_state_dict", "sharded_optim_state_dict"})

# Where each collective takes `async_op` positionally (torch 2.13's signatures).
ASYNC_OP_POSITION = {
    "barrier": 1, "all_reduce": 3, "reduce": 4, "broadcast": 3, "all_gather": 3, "all_gather_into_tensor": 3, "gather": 4,
    "scatter": 4, "reduce_scatter": 4, "reduce_scatter_tensor": 4, "all_to_all": 3, "all_to_all_single": 5,
}  # fmt: skip
# Where each collective takes its `group` positionally (torch 2.13's signatures).
GROUP_POSITION = {
    **{name: position - 1 for name, position in ASYNC_OP_POSITION.items()},
    "monitored_barrier": 0, "all_gather_object": 2, "broadcast_object_list": 2, "gather_object": 3, "scatter_object_list": 3,
}  # fmt: skip
# The wrappers whose forward or state_dict is a collective: their wrap names them in the file.
NAMES_A_DISTRIBUTED_MODEL = GuardedPattern(
    r"DistributedDataParallel|FullyShardedDataParallel|fully_shard", ["DistributedDataParallel", "FullyShardedDataParallel", "fully_shard"]
)
# Searched in "\n" + text: a pattern that opens with a newline lets the regex engine jump between lines.
_IMPORT_STATEMENT = re.compile(
    r"\n[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)|import[ \t]+([^\n#;]*))"
)
_COLLECTIVE_ALTERNATIVES = "|".join(sorted(COLLECTIVE_NAMES, key=len, reverse=True))
_COLLECTIVE_NAME_CALL = re.compile(rf"(?:{_COLLECTIVE_ALTERNATIVES})[ \t]*\(")
_NO_MATCH = re.compile("(?!)")


class CollectiveCalls:
    r"""The calls in one text that can be torch.distributed collectives, read from its imports.

    Cheap and generous (a prefilter): `dist.all_reduce(` for any alias bound to a module of
    torch.distributed, `torch.distributed.barrier(`, and a bare `all_reduce(` only where the file
    imports a collective by name. `torch.gather(` or `x.scatter(` are not collectives.

    `regex` says what a call is, but opening with `(?:\w+\.)*` it is tried at every position of the
    text (5 s over torch's sources); a call is looked for where a collective's name is followed by
    `(`, and `regex` is matched from the start of the dotted name before it.
    """

    def __init__(self, text: str) -> None:
        self.regex = _NO_MATCH
        self._names = _NO_MATCH
        if not any(name in text for name in COLLECTIVE_NAMES):  # a match, or the import of a bare alias, names one
            return
        prefixes = {r"\w*distributed", r"distributed_c10d"}
        bare: Set[str] = set()
        for match in _IMPORT_STATEMENT.finditer("\n" + text):
            source, imported, modules = match.groups()
            from_distributed = modules is None and ("distributed" in source or "c10d" in source or not source.strip("."))
            for item in (imported or modules).strip("()").split(","):
                original, _, alias = (part.strip() for part in item.strip().partition(" as "))
                bound = alias or original
                if original == "*" and from_distributed:
                    bare.add(_COLLECTIVE_ALTERNATIVES)
                elif not bound.isidentifier():
                    continue
                elif from_distributed and original in COLLECTIVE_NAMES:
                    bare.add(re.escape(bound))
                elif from_distributed or "distributed" in original or "c10d" in original:
                    if modules is None or alias:
                        prefixes.add(re.escape(bound))
        qualified = rf"(?:{'|'.join(sorted(prefixes))})\.(?:{_COLLECTIVE_ALTERNATIVES})"
        alternatives = [qualified] + ([f"(?:{'|'.join(sorted(bare))})"] if bare else [])
        self.regex = re.compile(rf"(?<![\w.])(?:\w+\.)*(?:{'|'.join(alternatives)})[ \t]*\(")
        self._names = re.compile(rf"(?:{'|'.join(sorted(bare))}|{_COLLECTIVE_ALTERNATIVES})[ \t]*\(") if bare else _COLLECTIVE_NAME_CALL

    def finditer(self, text: str) -> Iterator["re.Match[str]"]:
        """The matches of `regex` in `text`, found from the names that end them."""
        for name in self._names.finditer(text):
            start = name.start()
            if start and _continues_a_word(text[start - 1]):
                continue
            while start and (text[start - 1] == "." or _continues_a_word(text[start - 1])):
                start -= 1
            match = self.regex.match(text, start)
            if match is not None:
                yield match

    def search(self, text: str) -> Optional["re.Match[str]"]:
        return next(self.finditer(text), None)


def _continues_a_word(character: str) -> bool:
    return character.isalnum() or character == "_"  # what `\w` matches


@lru_cache(maxsize=1)  # DPL507 and DPL512 ask for the same file's calls in turn
def collective_calls(text: str) -> CollectiveCalls:
    return CollectiveCalls(text)


# A file that never names torch.distributed, DDP or FSDP has no collective and no DDP model of its own.
USES_DISTRIBUTED = GuardedPattern(
    r"distributed|FSDP|fully_shard", ["istributed", "ISTRIBUTED", "FSDP", "fsdp", "Fsdp", "ully_shard", "ULLY_SHARD"], re.IGNORECASE, one_line=True
)
# ... or, for the frameworks' collectives, names Accelerate (an `accelerator`), DeepSpeed or Lightning.
USES_DISTRIBUTED_OR_A_FRAMEWORK = GuardedPattern(
    r"distributed|FSDP|fully_shard|accelerat|deepspeed|lightning",
    ["istributed", "ISTRIBUTED", "FSDP", "fsdp", "Fsdp", "ully_shard", "ULLY_SHARD", "ccelerat", "eepspeed", "eepSpeed", "EEPSPEED", "ightning", "IGHTNING"],
    re.IGNORECASE,
    one_line=True,
)
_EVALUATION_WORD = re.compile(r"(?:^|_)(?:val|valid|validation|eval|evaluation|test|dev|holdout)(?:$|_|\d)", re.I)


def mentions(expr: cst.CSTNode, pattern: "re.Pattern[str]") -> bool:
    """Whether any name or attribute in `expr` matches `pattern`."""
    return any(pattern.search(word) for word in names_in(expr))


def looks_like_evaluation(expr: cst.CSTNode) -> bool:
    """Whether a loader's dataset is named for evaluation (`val_dataset`, `args.test_data`)."""
    return mentions(expr, _EVALUATION_WORD)


def is_evaluation_name(name: str) -> bool:
    return any(_EVALUATION_WORD.search(part) for part in name.split("."))


def collective_name(ctx: FileContext, call: cst.Call) -> Optional[str]:
    """`all_reduce` for `dist.all_reduce(t)`, else None."""
    qualified = ctx.qualify(call.func)
    if qualified is None:
        return None
    module, _, name = qualified.rpartition(".")
    if module in (DISTRIBUTED, "torch.distributed.distributed_c10d") and name in COLLECTIVE_NAMES:
        return name
    return None


def on_a_subgroup(ctx: FileContext, call: cst.Call, name: str) -> bool:
    """Whether a collective names a process group of its own (`dist.broadcast(t, src, group)`), not the
    default one: which ranks belong to it is not known here."""
    group = argument(call, "group", GROUP_POSITION.get(name))
    if group is None or is_literal(group, None):
        return False
    return ctx.qualify(group) not in ("torch.distributed.group.WORLD", "torch.distributed.GroupMember.WORLD")


def argument(call: cst.Call, keyword: str, index: Optional[int] = None) -> Optional[cst.BaseExpression]:
    """The argument passed as `keyword=`, or at position `index`."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    if index is not None:
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        if index < len(positional):
            return positional[index].value
    return None


def is_literal(expr: Optional[cst.BaseExpression], value: object) -> bool:
    if value is None or isinstance(value, bool):
        return isinstance(expr, cst.Name) and expr.value == str(value)
    return False


def prepared_arguments(ctx: FileContext, call: cst.Call) -> Optional[Tuple[cst.BaseExpression, ...]]:
    """What `accelerator.prepare(model, optimizer, ...)` hands back, in order: the objects it is given,
    each prepared (`prepare_model(model)`: its model). None for any other call, and where the objects
    cannot be lined up with what comes back (`prepare(*objects)`)."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in PREPARE_METHODS or any(arg.star for arg in call.args):
        return None
    if ctx.object_class(func.value) != ACCELERATOR_CLASS:
        return None
    positional = tuple(arg.value for arg in call.args if arg.keyword is None)
    if func.attr.value == "prepare":
        return positional
    model = positional[:1] or tuple(arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "model")
    return model or None


def accelerator_builds(ctx: FileContext) -> List[cst.Call]:
    """The file's calls that build an Accelerator."""
    return ctx.memo("accelerator-builds", lambda: [call for call in iter_calls(ctx.module) if ctx.qualify(call.func) in ACCELERATOR_BUILDERS])


def shards_through_accelerate(ctx: FileContext) -> bool:
    """Whether the file sets up DeepSpeed or FSDP for its Accelerator: it builds one of their plugins, or
    passes a value other than None to `Accelerator(deepspeed_plugin=...)` (another script of the
    project may train without them)."""

    def shards() -> bool:
        plugins = any(ctx.qualify(call.func) in ACCELERATE_SHARDING_PLUGINS for call in iter_calls(ctx.module))
        return plugins or any(
            argument.keyword is not None and argument.keyword.value in ACCELERATE_SHARDING_KEYWORDS and not is_literal(argument.value, None)
            for call in accelerator_builds(ctx)
            for argument in call.args
        )

    return ctx.memo("accelerate-shards", shards)


# ----- the statements of a scope --------------------------------------------------------------------


@dataclass(frozen=True)
class ScopeInfo:
    node: Optional[cst.FunctionDef]  # None: the module's top level
    body: Body
    owner: Optional[cst.ClassDef]


def iter_scopes(module: cst.Module) -> Iterator[ScopeInfo]:
    """The module's top level and every function in it, with the class a method belongs to."""
    yield ScopeInfo(None, module.body, None)
    pending: List[Tuple[Body, Optional[cst.ClassDef]]] = [(module.body, None)]
    while pending:
        body, owner = pending.pop()
        for statement in body:
            if isinstance(statement, cst.FunctionDef):
                yield ScopeInfo(statement, block_body(statement.body), owner)
                pending.append((block_body(statement.body), None))
            elif isinstance(statement, cst.ClassDef):
                pending.append((block_body(statement.body), statement))
            elif isinstance(statement, cst.BaseCompoundStatement):
                pending.extend((block, owner) for block in child_blocks(statement))


def iter_statements(scope: ScopeInfo) -> Iterator[cst.BaseSmallStatement]:
    """Every small statement of the scope (not of nested functions), in source order."""
    return iter_small_statements(scope.body, into_functions=False)


def exits(body: Body) -> bool:
    """Whether a block always leaves the code after it (`return`, `raise`, `sys.exit()`...)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, cst.SimpleStatementLine) and last.body:
        small = last.body[-1]
        if isinstance(small, (cst.Return, cst.Continue, cst.Break, cst.Raise)):
            return True
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            name = dotted(small.value.func) or ""
            return name in ("sys.exit", "exit", "quit", "os._exit")
    return False


# ----- calls ----------------------------------------------------------------------------------------


def calls_in(node: cst.CSTNode) -> List[cst.Call]:
    """Calls in a node, not descending into lambdas."""
    return list(iter_calls(node, into_lambdas=False))


def scope_calls(scope: ScopeInfo) -> List[cst.Call]:
    """Every call in the scope's own statements, headers of compound statements included."""
    found: List[cst.Call] = []
    for statement in scope.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.BaseCompoundStatement):
            for header in header_expressions(statement):
                found.extend(calls_in(header))
            for block in child_blocks(statement):
                found.extend(scope_calls(ScopeInfo(None, block, None)))
        else:
            found.extend(calls_in(statement))
    return found


def is_backward_call(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def is_no_sync_call(node: cst.CSTNode) -> bool:
    """`model.no_sync()` (DDP, FSDP) or `accelerator.no_sync(model)`: the context that skips the all-reduce."""
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "no_sync"


def steps_an_optimizer(ctx: FileContext, call: cst.Call) -> bool:
    """`optimizer.step()` on a torch optimizer, or `scaler.step(optimizer)`."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "step"):
        return False
    if ctx.object_class(call.func.value) == OPTIMIZER:
        return True
    return len(call.args) >= 1 and ctx.object_class(call.args[0].value) == OPTIMIZER


# ----- names bound to a DDP/FSDP wrapper ------------------------------------------------------------


def module_functions(module: cst.Module) -> Dict[str, cst.FunctionDef]:
    """The file's top-level functions by name."""
    return {statement.name.value: statement for statement in module.body if isinstance(statement, cst.FunctionDef)}


def parameter_names(function: cst.FunctionDef) -> List[str]:
    params = list(function.params.posonly_params) + list(function.params.params)
    return [param.name.value for param in params]


def passed_parameters(call: cst.Call, function: cst.FunctionDef, names: FrozenSet[str]) -> List[str]:
    """The parameters of `function` that `call` binds to one of `names`."""
    params = parameter_names(function)
    found = []
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    for index, arg in enumerate(positional):
        if index < len(params) and dotted(arg.value) in names:
            found.append(params[index])
    for arg in call.args:
        if arg.keyword is not None and dotted(arg.value) in names:
            found.append(arg.keyword.value)
    return found


def program(ctx: FileContext) -> Optional[DistributedProgram]:
    """The facts of the distributed programs this file belongs to (None: it belongs to none)."""
    return ctx.memo("ddp-program", lambda: ctx.project.distributed.program_of(ctx.filename))


def in_distributed_program(ctx: FileContext) -> bool:
    return program(ctx) is not None


def program_or_file(ctx: FileContext) -> DistributedProgram:
    """The program's facts, or for a file in no known program, what the file itself says."""

    def own() -> DistributedProgram:
        facts = FileFacts(ctx.module_name, scan_imports(ctx.source, ctx.package, submodules=True), distributed=scan_distributed(ctx.source))
        return DistributedProgram.merge([facts])

    return program(ctx) or ctx.memo("ddp-own-facts", own)


def enclosing_function_names(function: Optional[cst.FunctionDef]) -> str:
    return function.name.value if function is not None else "<module>"


def first_positional(call: cst.Call) -> Optional[cst.BaseExpression]:
    return argument(call, "", 0)


def sequence(items: Sequence[str]) -> str:
    return ", ".join(f"`{item}`" for item in items)


def scope_bindings(ctx: FileContext, scope: ScopeInfo) -> Dict[str, List[cst.BaseExpression]]:
    """Every value the scope assigns to each dotted name (`x = ...`, `self.x = ...`)."""

    def compute() -> Dict[str, List[cst.BaseExpression]]:
        found: Dict[str, List[cst.BaseExpression]] = {}
        for small in iter_statements(scope):
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    name = dotted(target.target)
                    if name is not None:
                        found.setdefault(name, []).append(small.value)
            elif isinstance(small, cst.AnnAssign) and small.value is not None:
                name = dotted(small.target)
                if name is not None:
                    found.setdefault(name, []).append(small.value)
        return found

    return ctx.memo(f"ddp-bindings:{id(scope.node)}:{id(scope.body)}", compute)


def values_of(ctx: FileContext, scope: ScopeInfo, expr: cst.BaseExpression) -> List[cst.BaseExpression]:
    """What `expr` may hold: itself, or for a name, the values the scope assigns to it (one level)."""
    name = dotted(expr)
    if name is not None and not isinstance(expr, cst.Call):
        return list(scope_bindings(ctx, scope).get(name, []))
    return [expr]


def passed_argument(
    ctx: FileContext, scope: ScopeInfo, call: cst.Call, keyword: str, index: Optional[int] = None
) -> Tuple[bool, Optional[cst.BaseExpression]]:
    """The argument passed as `keyword=` or at `index`, also through a `**mapping` splat of a dict literal
    the scope binds the mapping to and never changes: (True, value), (True, None) where none is passed,
    (False, None) where a splat may pass it and what the splat holds is unknown."""
    explicit = argument(call, keyword, index)
    if explicit is not None:
        return True, explicit
    for arg in call.args:
        if arg.star != "**":
            continue
        name = dotted(arg.value)
        values = values_of(ctx, scope, arg.value)
        if len(values) != 1 or not isinstance(values[0], cst.Dict):
            return False, None
        if name is not None and _changes_mapping(scope, name):
            return False, None
        for element in values[0].elements:
            if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                return False, None  # a `**other` inside, or a key computed at run time
            if element.key.evaluated_value == keyword:
                return True, element.value
    return True, None


def _changes_mapping(scope: ScopeInfo, name: str) -> bool:
    """Whether the scope changes the dict `name` after building it (`name[k] = v`, `name.update(...)`)."""
    for small in iter_statements(scope):
        if isinstance(small, cst.Assign) and any(
            isinstance(t.target, cst.Subscript) and dotted(t.target.value) == name for t in small.targets
        ):
            return True
        for call in iter_calls(small):
            if isinstance(call.func, cst.Attribute) and dotted(call.func.value) == name and call.func.attr.value in ("update", "setdefault", "pop"):
                return True
    return False


def branches(expr: cst.BaseExpression) -> List[cst.BaseExpression]:
    """`a if c else b` → [a, b]; anything else → [itself]."""
    if isinstance(expr, cst.IfExp):
        return branches(expr.body) + branches(expr.orelse)
    return [expr]


def for_loops(scope: ScopeInfo) -> List[cst.For]:
    """The scope's `for` loops (not those of nested functions)."""
    return [loop for loop, _ in loops_and_after(scope)]


def loops_and_after(scope: ScopeInfo) -> List[Tuple[cst.For, Body]]:
    """The scope's `for` loops (not those of nested functions), each with the statements that follow it
    in its block."""
    found: List[Tuple[cst.For, Body]] = []
    pending: List[Body] = [scope.body]
    while pending:
        body = pending.pop()
        for index, statement in enumerate(body):
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, cst.For):
                found.append((statement, body[index + 1 :]))
            if isinstance(statement, cst.BaseCompoundStatement):
                pending.extend(child_blocks(statement))
    return found


# Wrappers a loop iterates a loader through: their first argument is what it iterates.
_ITERATION_WRAPPERS = frozenset({"enumerate", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.std.tqdm", "tqdm.notebook.tqdm", "tqdm.rich.tqdm"})


def iterated_loader(ctx: FileContext, expr: cst.BaseExpression) -> cst.BaseExpression:
    """What a loop iterates through `enumerate(...)` and `tqdm(...)`: `loader` in `enumerate(tqdm(loader))`."""
    while isinstance(expr, cst.Call) and expr.args and expr.args[0].keyword is None and not expr.args[0].star:
        name = expr.func.value if isinstance(expr.func, cst.Name) and expr.func.value == "enumerate" else ctx.qualify(expr.func)
        if name not in _ITERATION_WRAPPERS:
            break
        expr = expr.args[0].value
    return expr


def trains(ctx: FileContext, loop: cst.For) -> bool:
    """Whether the loop's own body computes gradients or steps an optimizer (`accelerator.backward(loss)`,
    `loss.backward()`, `optimizer.step()`)."""
    for call in scope_calls(ScopeInfo(None, block_body(loop.body), None)):
        if not isinstance(call.func, cst.Attribute):
            continue
        method = call.func.attr.value
        if method == "backward" or (method == "step" and ctx.object_class(call.func.value) == OPTIMIZER):
            return True
    return False
