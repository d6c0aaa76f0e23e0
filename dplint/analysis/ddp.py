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
from dplint.analysis.names import Body, block_body, child_blocks, child_nodes, descendants, dotted, iter_calls, names_in, signed_integer_value
from dplint.analysis.patterns import GuardedPattern
from dplint.context import FileContext

DISTRIBUTED = "torch.distributed"
DISTRIBUTED_SAMPLERS = frozenset({"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"})
DATA_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
DDP = frozenset({"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"})
FSDP = frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    }
)
INIT_PROCESS_GROUP = frozenset({"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"})
# torch.distributed's collectives (2.13). All of them return None, or a work handle with async_op=True.
COLLECTIVE_NAMES = frozenset(
    """barrier monitored_barrier all_reduce reduce broadcast all_gather all_gather_into_tensor gather scatter
    reduce_scatter reduce_scatter_tensor all_to_all all_to_all_single all_gather_object broadcast_object_list
    gather_object scatter_object_list""".split()
)
# FSDP's class methods that gather the full parameters: every rank must call them.
FSDP_COLLECTIVE_METHODS = frozenset({"summon_full_params", "full_optim_state_dict", "optim_state_dict", "sharded_optim_state_dict"})

# Where each collective takes `async_op` positionally (torch 2.13's signatures).
ASYNC_OP_POSITION = {
    "barrier": 1, "all_reduce": 3, "reduce": 4, "broadcast": 3, "all_gather": 3, "all_gather_into_tensor": 3, "gather": 4,
    "scatter": 4, "reduce_scatter": 4, "reduce_scatter_tensor": 4, "all_to_all": 3, "all_to_all_single": 5,
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
# An identifier naming the rank or a rank-zero predicate: `rank`, `local_rank`, `dist.get_rank`,
# `is_main_process`, `master_process`, `trainer.is_global_zero`, `rank_zero_only`.
_RANK_WORD = re.compile(
    r"(?:^|_)rank(?:$|_|0)|is_global_zero|(?:^|_)(?:main|master)_process$|^is_(?:main|master)$|^rank0$",
    re.I,
)
# A name whose truth value differs between ranks: the rank itself, or a rank-zero predicate. (Flags
# such as `args.eval_on_rank0` are the same on every rank.)
_RANK_PREDICATE = re.compile(
    r"^(?:(?:local_|global_|node_|ddp_)?rank|get_(?:local_|global_)?rank|(?:is_)?(?:local_)?(?:main|master)(?:_process|_rank)?"
    r"|is_global_zero|is_local_zero|is_rank_?(?:0|zero)|rank_?(?:0|zero))$",
    re.I,
)
_RANK_ZERO_DECORATOR = re.compile(r"rank_?zero|rank0|master_only|main_process_only|on_main_process", re.I)
_EVALUATION_WORD = re.compile(r"(?:^|_)(?:val|valid|validation|eval|evaluation|test|dev|holdout)(?:$|_|\d)", re.I)


def collective_name(ctx: FileContext, call: cst.Call) -> Optional[str]:
    """`all_reduce` for `dist.all_reduce(t)`, else None."""
    qualified = ctx.qualify(call.func)
    if qualified is None:
        return None
    module, _, name = qualified.rpartition(".")
    if module in (DISTRIBUTED, "torch.distributed.distributed_c10d") and name in COLLECTIVE_NAMES:
        return name
    return None


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


def mentions(expr: cst.CSTNode, pattern: "re.Pattern[str]") -> bool:
    """Whether any name or attribute in `expr` matches `pattern`."""
    return any(pattern.search(word) for word in names_in(expr))


def names_a_rank(word: str) -> bool:
    """Whether an identifier can make an `if` test or a decorator rank-dependent, by what `is_rank_test`
    and `is_rank_zero_decorated` look for."""
    return bool(_RANK_WORD.search(word) or _RANK_PREDICATE.match(word) or _RANK_ZERO_DECORATOR.search(word))


def looks_like_evaluation(expr: cst.CSTNode) -> bool:
    return mentions(expr, _EVALUATION_WORD)


def is_evaluation_name(name: str) -> bool:
    return any(_EVALUATION_WORD.search(part) for part in name.split("."))


@dataclass(frozen=True)
class RankKnowledge:
    """What a file shows about ranks beyond the rank words: identifiers that hold a rank (`gpu`, spawn's
    process index; `self.gpu_id = int(os.environ["LOCAL_RANK"])`; a path built from one), identifiers that
    hold a rank test (`save_to_disk = get_rank() == 0`), and functions that return one (`is_primary()`,
    from any file of the project)."""

    values: FrozenSet[str] = frozenset()
    flags: FrozenSet[str] = frozenset()
    predicates: FrozenSet[str] = frozenset()

    def mentions_rank(self, expr: cst.CSTNode) -> bool:
        words = names_in(expr)
        return not self.values.isdisjoint(words) or any(_RANK_WORD.search(word) for word in words)


NO_KNOWLEDGE = RankKnowledge()
_RANK_VARIABLE = re.compile(r"RANK|PROCID")  # LOCAL_RANK, RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK
_SPAWNERS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes", "torch.multiprocessing.spawn.spawn"})
_DEVICE_MOVES = frozenset({"to", "cuda"})


def rank_knowledge(ctx: FileContext) -> RankKnowledge:
    return ctx.memo("rank-knowledge", lambda: _rank_knowledge(ctx))


def _rank_knowledge(ctx: FileContext) -> RankKnowledge:
    functions: Dict[str, cst.FunctionDef] = {}
    assignments: List[Tuple[List[str], cst.BaseExpression]] = []
    values: Set[str] = set()
    spawned: List[str] = []
    calls: List[cst.Call] = []  # `Trainer(model, loader, rank)`, `train(args, gpu)`: a rank may be passed on
    classes: Dict[str, cst.ClassDef] = {}
    for node in descendants(ctx.module):
        if isinstance(node, cst.FunctionDef):
            functions.setdefault(node.name.value, node)
        elif isinstance(node, cst.ClassDef):
            classes.setdefault(node.name.value, node)
        elif isinstance(node, cst.Assign):
            assignments.append(([_last_name(t.target) for t in node.targets], node.value))
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            assignments.append(([_last_name(node.target)], node.value))
        elif isinstance(node, cst.Call):
            if ctx.qualify(node.func) in _SPAWNERS:
                spawned.append(dotted(node.args[0].value) or "" if node.args else "")
            elif isinstance(node.func, cst.Name):
                calls.append(node)
    for name in spawned:  # `mp.spawn(main_worker, ...)` passes each process its index first
        target = functions.get(name.rpartition(".")[2])
        if target is not None and parameter_names(target):
            values.add(parameter_names(target)[0])
    predicates = set(ctx.project.rank_predicates)
    for name, function in functions.items():
        returns = [n.value for n in _returns(function) if n.value is not None]
        if not function.params.params and returns and all(is_rank_test(value) for value in returns):
            predicates.add(name)
    flags: Set[str] = set()
    changed = True
    while changed:
        changed = False
        known = RankKnowledge(frozenset(values), frozenset(flags), frozenset(predicates))
        for targets, value in assignments:
            before = len(flags) + len(values)
            if is_rank_test(value, known):
                flags.update(t for t in targets if t)
            if _holds_rank(ctx, value, known):
                values.update(t for t in targets if t)
            changed = changed or len(flags) + len(values) != before
        for call in calls:
            before = len(values)
            values.update(_parameters_given_a_rank(call, functions, classes, known))
            changed = changed or len(values) != before
    return RankKnowledge(frozenset(values), frozenset(flags), frozenset(predicates))


def _parameters_given_a_rank(
    call: cst.Call, functions: Dict[str, cst.FunctionDef], classes: Dict[str, cst.ClassDef], known: RankKnowledge
) -> List[str]:
    """The parameters of a function or class of this file that the call passes a rank."""
    name = call.func.value if isinstance(call.func, cst.Name) else ""
    function = functions.get(name)
    params = parameter_names(function) if function is not None else []
    if name in classes:
        init = next((s for s in block_body(classes[name].body) if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        params = parameter_names(init)[1:] if init is not None else []
    if not params:
        return []
    found = []
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    for param, arg in zip(params, positional):
        if known.mentions_rank(arg.value):
            found.append(param)
    found.extend(arg.keyword.value for arg in call.args if arg.keyword is not None and known.mentions_rank(arg.value))
    return found


def _last_name(target: cst.BaseExpression) -> str:
    """`gpu` for `gpu`, `gpu_id` for `self.gpu_id`; "" for a target that is neither."""
    if isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Attribute):
        return target.attr.value
    return ""


def _returns(function: cst.FunctionDef) -> Iterator[cst.Return]:
    pending: List[cst.CSTNode] = [function.body]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.Return):
            yield node
        elif not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            pending.extend(child_nodes(node))


def _holds_rank(ctx: FileContext, value: cst.BaseExpression, known: RankKnowledge) -> bool:
    """Whether an assigned value is a rank, or built from one (`int(os.environ["LOCAL_RANK"])`,
    `f"ckpt_{gpu}.pt"`, `args.rank % torch.cuda.device_count()`): not a tensor or model moved to it."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _DEVICE_MOVES:
        return False
    if isinstance(value, cst.Call) and ctx.qualify(value.func) in DDP:
        return False
    if known.mentions_rank(value):
        return True
    return any(
        isinstance(node, cst.SimpleString) and _RANK_VARIABLE.search(node.value) for node in descendants(value)
    )


def is_rank_test(expr: cst.BaseExpression, known: RankKnowledge = NO_KNOWLEDGE) -> bool:
    """Whether a condition can differ between the ranks of one job: `rank == 0`, `is_main_process()`,
    `local_rank in (-1, 0)`. `local_rank == -1` and `rank is None` test the mode, the same on every rank."""
    if isinstance(expr, cst.BooleanOperation):
        return is_rank_test(expr.left, known) or is_rank_test(expr.right, known)
    if isinstance(expr, cst.UnaryOperation):
        return is_rank_test(expr.expression, known)
    if isinstance(expr, cst.Comparison):
        if not known.mentions_rank(expr):
            return False
        literals: List[int] = []
        for target in expr.comparisons:
            if is_literal(target.comparator, None):
                return False
            literals.extend(_int_literals(target.comparator))
            if isinstance(target.operator, cst.GreaterThanEqual) and literals == [0]:
                return False
        return not literals or any(value >= 0 for value in literals)
    if isinstance(expr, (cst.Name, cst.Attribute)):
        word = expr.value if isinstance(expr, cst.Name) else expr.attr.value
        return bool(_RANK_PREDICATE.match(word)) or word in known.flags or word in known.predicates
    if isinstance(expr, cst.Call):
        return isinstance(expr.func, (cst.Name, cst.Attribute)) and is_rank_test(expr.func, known)
    return False


def is_single_process_test(expr: cst.BaseExpression, known: RankKnowledge = NO_KNOWLEDGE) -> bool:
    """`local_rank == -1` (alone or with `and`): true only when no process group runs, on no rank of a job."""
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And):
        return is_single_process_test(expr.left, known) or is_single_process_test(expr.right, known)
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1 and known.mentions_rank(expr):
        target = expr.comparisons[0]
        return isinstance(target.operator, cst.Equal) and _int_literals(target.comparator) == [-1]
    return False


def _int_literals(expr: cst.BaseExpression) -> List[int]:
    value = signed_integer_value(expr)
    if value is not None:
        return [value]
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        return [value for element in expr.elements for value in _int_literals(element.value)]
    return []


def is_rank_zero_decorated(function: cst.FunctionDef) -> bool:
    for decorator in function.decorators:
        target = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
        name = dotted(target)
        if name is not None and _RANK_ZERO_DECORATOR.search(name.rpartition(".")[2]):
            return True
    return False


# ----- the statements of a scope, and whether every rank runs them ------------------------------------


@dataclass(frozen=True)
class Site:
    """A small statement, and the rank condition it runs under (None: every rank that gets here runs it)."""

    statement: cst.BaseSmallStatement
    guard: Optional[cst.CSTNode]


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


def iter_sites(scope: ScopeInfo, known: RankKnowledge = NO_KNOWLEDGE) -> Iterator[Site]:
    """Every small statement of the scope (not of nested functions), in source order, with its rank guard."""
    guard = scope.node if scope.node is not None and is_rank_zero_decorated(scope.node) else None
    yield from _sites(scope.body, guard, known)


def _sites(body: Body, guard: Optional[cst.CSTNode], known: RankKnowledge) -> Iterator[Site]:
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                yield Site(small, guard)
            continue
        if isinstance(statement, cst.If) and is_single_process_test(statement.test, known):
            # `if args.local_rank == -1: evaluate(...)`: its body runs in no distributed job.
            if statement.orelse is not None:
                yield from _sites(block_body(statement.orelse.body) if isinstance(statement.orelse, cst.Else) else [statement.orelse], guard, known)
            continue
        if isinstance(statement, cst.If) and guard is None and is_rank_test(statement.test, known):
            for block in child_blocks(statement):
                yield from _sites(block, statement, known)
            if statement.orelse is None and exits(block_body(statement.body)):
                # `if rank != 0: return`: what follows runs on some ranks only.
                guard = statement
            continue
        if isinstance(statement, cst.BaseCompoundStatement):
            for block in child_blocks(statement):
                yield from _sites(block, guard, known)


def exits(body: Body) -> bool:
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


def scope_calls(scope: ScopeInfo, distributed: bool = False) -> List[cst.Call]:
    """Every call in the scope's own statements, headers of compound statements included; with
    `distributed`, only those a distributed job can run (not the body of `if local_rank == -1:`)."""
    found: List[cst.Call] = []
    for statement in scope.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.BaseCompoundStatement):
            found.extend(_compound_calls(statement, distributed))
        else:
            found.extend(calls_in(statement))
    return found


def _compound_calls(statement: cst.BaseCompoundStatement, distributed: bool) -> List[cst.Call]:
    found: List[cst.Call] = []
    for header in _headers(statement):
        found.extend(calls_in(header))
    blocks = list(child_blocks(statement))
    if distributed and isinstance(statement, cst.If) and is_single_process_test(statement.test):
        blocks = blocks[1:]  # the body runs only without a process group
    for block in blocks:
        found.extend(scope_calls(ScopeInfo(None, block, None), distributed))
    return found


def _headers(statement: cst.BaseCompoundStatement) -> Iterator[cst.CSTNode]:
    if isinstance(statement, (cst.If, cst.While)):
        yield statement.test
    elif isinstance(statement, cst.For):
        yield statement.iter
    elif isinstance(statement, cst.With):
        for item in statement.items:
            yield item.item


def is_backward_call(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


# ----- names bound to a DDP/FSDP wrapper ------------------------------------------------------------


def wrap_of(ctx: FileContext, expr: Optional[cst.BaseExpression], wrappers: FrozenSet[str] = DDP) -> Optional[cst.Call]:
    """The wrapper call `expr` evaluates to on some path: `DDP(m)`, `DDP(m) if distributed else m`."""
    if isinstance(expr, cst.Call) and ctx.qualify(expr.func) in wrappers:
        return expr
    if isinstance(expr, cst.IfExp):
        return wrap_of(ctx, expr.body, wrappers) or wrap_of(ctx, expr.orelse, wrappers)
    return None


def wrapped_names(ctx: FileContext, scope: ScopeInfo, wrappers: FrozenSet[str] = DDP) -> FrozenSet[str]:
    """Dotted names the scope binds to a wrapper, and the `self.<attr>` its class binds to one."""
    key = f"ddp-wrapped:{id(scope.node)}:{sorted(wrappers)}"
    return ctx.memo(key, lambda: _wrapped_names(ctx, scope, wrappers))


def _wrapped_names(ctx: FileContext, scope: ScopeInfo, wrappers: FrozenSet[str]) -> FrozenSet[str]:
    names: Set[str] = set()
    for site in iter_sites(scope):
        names.update(_wrap_targets(ctx, site.statement, wrappers))
    if scope.owner is not None:
        names.update(_class_wrapped_attributes(ctx, scope.owner, wrappers))
    return frozenset(names)


def _wrap_targets(ctx: FileContext, small: cst.BaseSmallStatement, wrappers: FrozenSet[str]) -> List[str]:
    if isinstance(small, cst.Assign) and wrap_of(ctx, small.value, wrappers) is not None:
        return [name for name in (dotted(t.target) for t in small.targets) if name is not None]
    if isinstance(small, cst.AnnAssign) and wrap_of(ctx, small.value, wrappers) is not None:
        name = dotted(small.target)
        return [name] if name else []
    return []


def _class_wrapped_attributes(ctx: FileContext, owner: cst.ClassDef, wrappers: FrozenSet[str]) -> FrozenSet[str]:
    return ctx.memo(f"ddp-class-wrapped:{id(owner)}:{sorted(wrappers)}", lambda: _scan_class_wrapped_attributes(ctx, owner, wrappers))


def _scan_class_wrapped_attributes(ctx: FileContext, owner: cst.ClassDef, wrappers: FrozenSet[str]) -> FrozenSet[str]:
    found: Set[str] = set()
    for statement in block_body(owner.body):
        if isinstance(statement, cst.FunctionDef):
            for site in iter_sites(ScopeInfo(statement, block_body(statement.body), None)):
                found.update(name for name in _wrap_targets(ctx, site.statement, wrappers) if name.startswith("self."))
    return frozenset(found)


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
        facts = FileFacts(ctx.module_name, scan_imports(ctx.source, ctx.package), distributed=scan_distributed(ctx.source))
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
        for site in iter_sites(scope):
            small = site.statement
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


def branches(expr: cst.BaseExpression) -> List[cst.BaseExpression]:
    """`a if c else b` → [a, b]; anything else → [itself]."""
    if isinstance(expr, cst.IfExp):
        return branches(expr.body) + branches(expr.orelse)
    return [expr]


def for_loops(scope: ScopeInfo) -> List[cst.For]:
    """The scope's `for` loops (not those of nested functions)."""
    found: List[cst.For] = []
    pending: List[Body] = [scope.body]
    while pending:
        for statement in pending.pop():
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, cst.For):
                found.append(statement)
            if isinstance(statement, cst.BaseCompoundStatement):
                pending.extend(child_blocks(statement))
    return found
