"""Which names may hold a DataParallel/DDP wrapper at each statement of a function.

A wrap on some path is a wrap: `if torch.cuda.device_count() > 1: model = nn.DataParallel(model)` is
exactly the multi-GPU run where the wrapper's pitfalls show. The walk follows the function's blocks in
order, joins branches at their merge, and remembers under which branch condition each wrap happened,
so a use on the opposite branch of the same condition (`if ngpu == 1: ... else: ...`) is not counted.
Code that already handles both cases (`hasattr(m, "module")`, `isinstance(m, DataParallel)`, a branch
that reaches `m.module`) is marked as handled for that name.

A wrap is seen however it reaches a name: a wrap call, a project function that returns one
(`model = build_model(args)`), a container whose every element is one (`heads = [DataParallel(h) for h
in hs]`, held as `heads[]`), an object whose class wraps `self.<attr>` in `__init__` (`trainer =
Trainer(net)` holds `trainer.model`), or a module that Accelerate's `accelerator.prepare` hands back
(`model, opt = accelerator.prepare(model, opt)`: DDP when the script runs in several processes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Dict, FrozenSet, Generator, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import libcst as cst

from dplint.analysis.ddp import ScopeInfo, accelerator_builds, is_literal, prepared_arguments, shards_through_accelerate
from dplint.analysis.facts import MODULE_RETURNING_METHODS, WRAPPER_KEYWORDS
from dplint.analysis.inference import Inference, Kind
from dplint.analysis.torch_api import ATTRIBUTE_WRAPPERS, FULLY_SHARDED_DATA_PARALLEL
from dplint.analysis.names import Body, assigned_parts, block_body, child_blocks, descendants, dotted, iter_calls, iter_small_statements, run_visitor
from dplint.analysis.context import FileContext
from dplint.analysis.patterns import GuardedPattern

# FSDP is not among them: its `state_dict()` keys are the inner module's (checked on torch 2.13), and
# its `__getattr__` forwards to the wrapped module. `wrapped_names` follows it with its own flow.
DDP_CLASSES = {name: wrapper for name, wrapper in ATTRIBUTE_WRAPPERS.items() if wrapper == "DistributedDataParallel"}
FSDP_CLASSES = {name: "FullyShardedDataParallel" for name in FULLY_SHARDED_DATA_PARALLEL}

# `accelerator.prepare(`, `self.accelerator.prepare_model(`.
_PREPARE_CALL = GuardedPattern(r"\.prepare(?:_model)?\s*\(", [".prepare"])


def may_prepare_models(text: str) -> bool:
    """Whether a file's text may hand models to an Accelerator it builds (a prefilter: the flow reads them)."""
    return "Accelerator" in text and _PREPARE_CALL.search(text) is not None

# A branch condition on the path: its source text and which branch (True: the `if` body).
CONDITION_QUOTED = 40
Condition = Tuple[str, bool]


@dataclass(frozen=True)
class WrapSite:
    """A wrap into a name, under the branch conditions that led there: the wrapping expression `node`
    of this file, or `path:line` in another file. A line here is looked up only for a message, since
    positions cost a pass over the file."""

    wrapper: str
    conditions: Tuple[Condition, ...] = ()
    node: Optional[cst.CSTNode] = None
    line: int = 0
    path: str = ""
    # The function whose call returned the wrapper, named in the message since the wrap is in its body.
    via: str = ""
    # The Accelerator whose `prepare` made the wrap (`accelerator`): a wrapper only when the script runs
    # in several processes, and its `unwrap_model` gives the model back.
    accelerator: str = ""

    def line_in(self, ctx: FileContext) -> int:
        return ctx.line(self.node) if self.node is not None else self.line

    def where(self, ctx: FileContext) -> str:
        """`line 12 if args.multi_gpu`, for the message: which line wraps, and when."""
        place = f"{self.path}:{self.line}" if self.path else f"line {self.line_in(ctx)}"
        if self.via:
            place = f"`{self.via}()`, {place}"
        if not self.conditions:
            return place
        text = " and ".join(test if holds else f"not ({test})" for test, holds in self.conditions)
        # A condition too long to quote whole is not quoted: a cut one would read as different code.
        return f"{place} if `{text}`" if len(text) <= CONDITION_QUOTED else f"{place}, under a condition"

    def possible_under(self, path: Iterable[Condition]) -> bool:
        """False when the current path took the opposite branch of a condition this wrap needed."""
        taken = [implied for condition in path for implied in _implied(condition)]
        return not any(_excludes(needed, fact) for condition in self.conditions for needed in _implied(condition) for fact in taken)


State = Mapping[str, FrozenSet[WrapSite]]


@dataclass(frozen=True)
class Point:
    """A small statement, the wraps that may reach it, and the names whose wrapping the code handles there."""

    statement: cst.BaseSmallStatement
    wrapped: Dict[str, FrozenSet[WrapSite]]
    handled: FrozenSet[str]
    path: Tuple[Condition, ...] = ()


def wrap_call(ctx: FileContext, value: cst.BaseExpression, classes: Mapping[str, str] = ATTRIBUTE_WRAPPERS) -> Optional[str]:
    """The wrapper class `value` builds (through `.cuda()`, `.to(device)` chained on it), else None."""
    built = _built_wrapper(ctx, value, classes)
    return built[0] if built is not None else None


def wrapper_call(ctx: FileContext, value: Optional[cst.BaseExpression], classes: Mapping[str, str]) -> Optional[cst.Call]:
    """The call building one of `classes` that `value` evaluates to on some path: `DDP(m)`, `DDP(m).cuda()`,
    either branch of `DDP(m) if distributed else m`."""
    if isinstance(value, cst.IfExp):
        return wrapper_call(ctx, value.body, classes) or wrapper_call(ctx, value.orelse, classes)
    built = _built_wrapper(ctx, value, classes) if value is not None else None
    return built[1] if built is not None else None


def _built_wrapper(ctx: FileContext, value: cst.BaseExpression, classes: Mapping[str, str]) -> Optional[Tuple[str, cst.Call]]:
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in MODULE_RETURNING_METHODS
    ):
        value = value.func.value
    if not isinstance(value, cst.Call):
        return None
    wrapper = classes.get(ctx.qualify(value.func) or "")
    if wrapper is None:
        return None
    if wrapper in WRAPPER_KEYWORDS and not set(_keywords(value)) <= WRAPPER_KEYWORDS[wrapper]:
        return None  # `DataParallel(net, output_dim=1)` raises TypeError: no wrapper is ever made
    wrapped = next((arg.value for arg in value.args if arg.keyword is None or arg.keyword.value == "module"), None)
    if wrapped is not None and ctx.never_a_module(wrapped):
        return None  # `DDP(FixMatch(...))`, an object that is no module: the wrap raises
    return wrapper, value


def _keywords(call: cst.Call) -> List[str]:
    return [arg.keyword.value for arg in call.args if arg.keyword is not None]




def holder(expr: cst.BaseExpression) -> Optional[str]:
    """The name a wrap is tracked under: `model`, `self.model`, or `self.heads[]` for an element `self.heads[i]`."""
    if isinstance(expr, cst.Subscript):
        container = dotted(expr.value)
        return container + "[]" if container is not None else None
    return dotted(expr)


def describe(sites: FrozenSet[WrapSite], ctx: FileContext) -> Tuple[str, str, bool]:
    """For a message: the wrapper's name, where the first wrap is, and whether it happens on every path."""
    wrappers = {site.wrapper for site in sites}
    first = min(sites, key=lambda site: (site.path, site.line_in(ctx)))
    wrapper = wrappers.pop() if len(wrappers) == 1 else "DataParallel/DDP"
    return wrapper, first.where(ctx), all(not site.conditions and not site.accelerator for site in sites)


def preparer(sites: FrozenSet[WrapSite]) -> Optional[str]:
    """The Accelerator whose `prepare` made every one of the wraps, if one did (`accelerator`)."""
    accelerators = {site.accelerator for site in sites}
    return accelerators.pop() if len(accelerators) == 1 and "" not in accelerators else None


def unwrapped(sites: FrozenSet[WrapSite], shown: str) -> str:
    """The plain model behind `shown`, for a message: `accelerator.unwrap_model(model)` where one
    Accelerator prepared every wrap, else `getattr(model, "module", model)`."""
    accelerator = preparer(sites)
    return f"{accelerator}.unwrap_model({shown})" if accelerator is not None else f'getattr({shown}, "module", {shown})'


def handled_names(node: cst.CSTNode, ignored: FrozenSet[int] = frozenset()) -> Set[str]:
    """Names whose wrapped and unwrapped cases `node` tells apart: `hasattr(m, "module")`,
    `isinstance(m, ...)`, `getattr(m, "module", ...)`, or a read of `m.module`; the calls in `ignored`
    (by `id`) do not count."""
    finder = _HandledFinder(ignored)
    run_visitor(node, finder)
    return finder.names[0]


def handled_by_if(ctx: FileContext) -> Dict[int, FrozenSet[str]]:
    """`handled_names` of every `if` statement of the file (by `id`), found in one pass."""

    def find() -> Dict[int, FrozenSet[str]]:
        finder = _HandledFinder()
        run_visitor(ctx.module, finder)
        return finder.by_if

    return ctx.memo("handled-by-if", find)


class _HandledFinder(cst.CSTVisitor):
    """Collects handled names per `if` statement; a nested function's names stay its own."""

    def __init__(self, ignored: FrozenSet[int] = frozenset()) -> None:
        self.ignored = ignored
        self.names: List[Set[str]] = [set()]
        self.by_if: Dict[int, FrozenSet[str]] = {}

    def visit_If(self, node: cst.If) -> None:
        self.names.append(set())

    def leave_If(self, original_node: cst.If) -> None:
        found = self.names.pop()
        self.by_if[id(original_node)] = frozenset(found)
        self.names[-1] |= found

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.names.append(set())

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.names.pop()

    def visit_Call(self, node: cst.Call) -> Optional[bool]:
        if id(node) in self.ignored:
            return False
        if isinstance(node.func, cst.Name) and node.func.value in ("hasattr", "isinstance", "getattr") and node.args:
            name = dotted(node.args[0].value)
            if name is not None:
                self.names[-1].add(name)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "module":
            name = dotted(node.value)
            if name is not None:
                self.names[-1].add(name)


class WrapFlow:
    """Walks one function (or the module) body and yields a `Point` per reachable small statement."""

    def __init__(self, ctx: FileContext, classes: Mapping[str, str] = ATTRIBUTE_WRAPPERS) -> None:
        self.ctx = ctx
        self.classes = classes
        # Per `if`/`elif` (by `id`): the wraps that may reach its test and the names handled there.
        self.tests: Dict[int, Tuple[Dict[str, FrozenSet[WrapSite]], FrozenSet[str]]] = {}

    def points(
        self,
        body: Body,
        initial: Optional[State] = None,
        exits: Optional[List[State]] = None,
        after_call: Optional[Callable[[cst.Call], State]] = None,
    ) -> Iterable[Point]:
        """The points of the body; `exits` collects the state at each way out (a `return`, the end);
        `after_call(call)` says what a call leaves wrapped (a method of the same object's)."""
        self._exits = exits
        self._after_call = after_call
        final = yield from self._block(body, dict(initial or {}), (), frozenset())
        if exits is not None and final is not None:
            exits.append(final)

    def _block(
        self, body: Body, state: Optional[Dict[str, FrozenSet[WrapSite]]], path: Tuple[Condition, ...], handled: FrozenSet[str]
    ) -> Generator[Point, None, Optional[Dict[str, FrozenSet[WrapSite]]]]:
        for statement in body:
            if state is None:  # after return/raise/continue/break: unreachable
                return None
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, (cst.SimpleStatementLine, cst.BaseSmallStatement)):
                # A one-line suite (`if c: x = 1`) holds small statements directly.
                for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else (statement,):
                    if state is None:
                        return None
                    yield Point(small, _possible(state, path), handled, path)
                    state = self._transfer(small, state, path)
                    if isinstance(small, cst.Assert):
                        # `assert not distributed`: what follows runs only where it holds (and, through
                        # `_implied`, where each part of an `assert a and b` holds).
                        path = (*path, self._condition(small.test))
            elif isinstance(statement, cst.If):
                state = yield from self._if(statement, state, path, handled)
            elif isinstance(statement, (cst.For, cst.While)):
                entry = dict(state)
                if isinstance(statement, cst.For) and isinstance(statement.target, cst.Name):
                    # `for head in self.heads:` over a container of wrappers binds a wrapper each time.
                    container = dotted(statement.iter)
                    entry.pop(statement.target.value, None)
                    if container is not None and container + "[]" in state:
                        entry[statement.target.value] = state[container + "[]"]
                after_body = yield from self._block(block_body(statement.body), entry, path, handled)
                state = _join(state, after_body)
                if statement.orelse is not None:
                    state = yield from self._block(block_body(statement.orelse.body), state, path, handled)
            elif isinstance(statement, cst.Try) or isinstance(statement, getattr(cst, "TryStar", ())):
                after_body = yield from self._block(block_body(statement.body), dict(state), path, handled)
                merged = _join(state, after_body)
                ends = [after_body]
                for handler in statement.handlers:
                    ends.append((yield from self._block(block_body(handler.body), dict(merged), path, handled)))
                if statement.orelse is not None and after_body is not None:
                    ends[0] = yield from self._block(block_body(statement.orelse.body), after_body, path, handled)
                state = None
                for end in ends:
                    state = _join(state, end)
                if statement.finalbody is not None:
                    final = yield from self._block(block_body(statement.finalbody.body), dict(_join(merged, state) or {}), path, handled)
                    state = final if state is not None else None
            elif isinstance(statement, cst.With):
                state = yield from self._block(block_body(statement.body), state, path, handled)
            elif isinstance(statement, cst.Match):
                ends = [state]
                for case in statement.cases:
                    ends.append((yield from self._block(block_body(case.body), dict(state), path, handled)))
                state = None
                for end in ends:
                    state = _join(state, end)
        return state

    def _if(self, statement: cst.If, state, path, handled):
        self.tests[id(statement)] = (_possible(state, path), handled)
        test, holds = self._condition(statement.test)
        checked = handled_by_if(self.ctx).get(id(statement), frozenset())  # the test, or a branch reaching `m.module`
        inner = handled | frozenset(checked)
        body_state, else_state = dict(state), dict(state)
        tested = self._wrapper_test(statement.test)
        if tested is not None:
            # `if isinstance(m, DataParallel): ... else: net = m`: on the branch where the test says
            # `m` is no wrapper, it holds none.
            name, is_wrapper = tested
            (else_state if is_wrapper else body_state).pop(name, None)
        after_body = yield from self._block(block_body(statement.body), body_state, (*path, (test, holds)), inner)
        orelse = statement.orelse
        if orelse is None:
            after_else = else_state
        elif isinstance(orelse, cst.If):
            after_else = yield from self._if(orelse, else_state, (*path, (test, not holds)), handled)
        else:
            after_else = yield from self._block(block_body(orelse.body), else_state, (*path, (test, not holds)), inner)
        merged = _join(after_body, after_else)
        if merged is not None:
            for name in checked:
                # `if isinstance(m, DataParallel): m = m.module` unwraps on the path where it was wrapped.
                if name in merged and (name not in (after_body or {}) or name not in (after_else or {})):
                    del merged[name]
        return merged

    def _wrapper_test(self, test: cst.BaseExpression) -> Optional[Tuple[str, bool]]:
        """`isinstance(m, nn.DataParallel)` or `hasattr(m, "module")` → ("m", True); `not isinstance(m,
        (DataParallel, DDP))` → ("m", False); None for any other test."""
        holds = True
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, holds = test.expression, not holds
        if isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and test.func.value == "hasattr" and len(test.args) == 2:
            # `hasattr(m, "module")`: only a wrapper has one.
            attribute = test.args[1].value
            name = dotted(test.args[0].value)
            if name is not None and isinstance(attribute, cst.SimpleString) and attribute.evaluated_value == "module":
                return name, holds
            return None
        if not (isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and test.func.value == "isinstance"):
            return None
        if len(test.args) != 2:
            return None
        name = dotted(test.args[0].value)
        classes = test.args[1].value
        elements = [e.value for e in classes.elements] if isinstance(classes, cst.Tuple) else [classes]
        if name is None or not elements or not all(self._names_wrapper_class(e) for e in elements):
            return None
        return name, holds

    def _names_wrapper_class(self, expr: cst.BaseExpression) -> bool:
        """`nn.DataParallel`, or a name ending in `DataParallel` that a star import hides: read only to
        silence, so the name is enough."""
        return self.ctx.qualify(expr) in ATTRIBUTE_WRAPPERS or (dotted(expr) or "").endswith("DataParallel")

    def _condition(self, test: cst.BaseExpression) -> Condition:
        """A test as (text, whether it holds): `not c` is `c` not holding."""
        holds = True
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, holds = test.expression, not holds
        return " ".join(self.ctx.code(test).split()), holds

    def _transfer(self, small: cst.BaseSmallStatement, state, path):
        after_call = getattr(self, "_after_call", None)
        if after_call is not None:
            for call in iter_calls(small):
                left = after_call(call)
                if left:
                    state = {**state, **{name: state.get(name, frozenset()) | sites for name, sites in left.items()}}
        if isinstance(small, cst.Return) and getattr(self, "_exits", None) is not None:
            self._exits.append(state)  # type: ignore[union-attr]
        if isinstance(small, (cst.Return, cst.Raise, cst.Continue, cst.Break)):
            return None
        if isinstance(small, cst.Assign):
            targets = [t.target for t in small.targets]
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and small.value is not None:
            targets = [small.target]
        else:
            return state
        prepared = self._prepared(small, path)
        if prepared is not None:  # `model, opt = accelerator.prepare(model, opt)`: each target its own
            bound = [(target, sites, frozenset(), {}) for target, sites in prepared]
        else:
            plain = isinstance(small, cst.AugAssign)
            sites = frozenset() if plain else self._sites(small.value, state, path)
            elements = frozenset() if plain else self._element_sites(small.value, path)
            members = {} if plain else self._member_sites(small.value, path)
            bound = [(target, sites, elements, members) for target in targets]
        state = dict(state)
        # `model, opt, _, _ = deepspeed.initialize(model=model)`: each name unpacked holds what the call
        # returned, not the wrapper it held before.
        bound += [(element, frozenset(), frozenset(), {}) for target, *_ in bound for element in _unpacked(target)]
        for target, sites, elements, members in bound:
            name = dotted(target)
            if name is None:
                continue
            for key in [key for key in state if key in (name, name + "[]") or key.startswith(name + ".")]:
                del state[key]
            if sites:
                state[name] = sites
            if elements:
                state[name + "[]"] = elements
            for attribute, found in members.items():
                state[f"{name}.{attribute}"] = found
        return state

    def _sites(self, value: cst.BaseExpression, state, path) -> FrozenSet[WrapSite]:
        """The wraps `value` may hold: a wrap call, a call of a project function returning one, a name
        or an element of a container holding one, or either branch of `a if c else b`."""
        wrapper = wrap_call(self.ctx, value, self.classes)
        if wrapper is not None:
            return frozenset({WrapSite(wrapper, path, node=value)})
        returned = self._returned(value)
        if returned is not None:
            return frozenset({replace(returned, conditions=(*path, *returned.conditions))})
        if isinstance(value, cst.IfExp):
            if {dotted(value.body), dotted(value.orelse)} & handled_names(value):
                return frozenset()  # `m.module if hasattr(m, "module") else m`: the plain model either way
            test, holds = self._condition(value.test)
            return self._sites(value.body, state, (*path, (test, holds))) | self._sites(value.orelse, state, (*path, (test, not holds)))
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in MODULE_RETURNING_METHODS:
            value = value.func.value  # `net = net.eval()`: the same wrapper
        name = holder(value)
        # A copy made on the other branch of the wrap's own test holds no wrapper (`if conf.distributed:
        # g = generator.module` / `else: g = generator`, the generator wrapped by the caller under the same test).
        held = state.get(name, frozenset()) if name is not None else frozenset()
        return frozenset(site for site in held if site.possible_under(path))

    def wrapping_targets(self, small: cst.BaseSmallStatement) -> List[cst.BaseExpression]:
        """What an assignment binds to a wrapper it makes, from nothing wrapped before it."""
        if not isinstance(small, cst.Assign):
            return []
        prepared = self._prepared(small, ())
        if prepared is not None:
            return [target for target, sites in prepared if sites]
        if not (self._sites(small.value, {}, ()) or self._element_sites(small.value, ())):
            return []
        return [target.target for target in small.targets]

    def _prepared(self, small: cst.BaseSmallStatement, path) -> Optional[List[Tuple[cst.BaseExpression, FrozenSet[WrapSite]]]]:
        """For `model, opt = accelerator.prepare(model, opt)`: each target assigned, and the DDP wrap it may
        then hold (none for what is no module); None for any other statement."""
        if not (isinstance(small, cst.Assign) and isinstance(small.value, cst.Call)):
            return None
        call = small.value
        handed = prepared_arguments(self.ctx, call)
        if handed is None:
            return None
        found: List[Tuple[cst.BaseExpression, FrozenSet[WrapSite]]] = []
        for assigned in small.targets:
            target = assigned.target
            elements = list(target.elements) if isinstance(target, (cst.Tuple, cst.List)) else [target]
            lined_up = len(elements) == len(handed) and not any(isinstance(e, cst.StarredElement) for e in elements)
            for index, element in enumerate(elements):
                bound = element.value if isinstance(element, cst.BaseElement) else element
                found.append((bound, self._prepared_wrap(small, call, handed[index], path) if lined_up else frozenset()))
        return found

    def _prepared_wrap(self, small: cst.BaseSmallStatement, call: cst.Call, argument: cst.BaseExpression, path) -> FrozenSet[WrapSite]:
        """The DDP wrap Accelerate makes of what `prepare` hands back for `argument` (accelerate 1.15's
        `prepare_model`, in a run of several processes, GPUs or CPUs): only of a module, with a parameter
        that may train, not under `evaluation_mode`, and by an Accelerator that the file builds with
        neither DeepSpeed nor FSDP (their engines forward attribute reads to the model, and their state
        dicts are their own)."""
        func = cst.ensure_type(call.func, cst.Attribute)  # `prepared_arguments` found the Accelerator's method
        evaluation = [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "evaluation_mode"]
        positional = [arg for arg in call.args if arg.keyword is None]
        if func.attr.value == "prepare_model" and (len(positional) > 2 or any(not is_literal(value, False) for value in evaluation)):
            return frozenset()
        if not _prepares_in_ddp(self.ctx) or holder(argument) in _frozen_modules(self.ctx):
            return frozenset()
        inference = Inference.of(self.ctx)
        scope = inference.scope_of(small)
        if scope is None or inference.kind(argument, scope) is not Kind.MODULE:
            return frozenset()  # an optimizer, a loader, or what the file does not show is a module
        accelerator = self.ctx.code(func.value)
        return frozenset({WrapSite("DistributedDataParallel", path, node=call, via=f"{accelerator}.{func.attr.value}", accelerator=accelerator)})

    def _returned(self, value: cst.BaseExpression) -> Optional[WrapSite]:
        """The wrap returned by `build_model(args)` (`.cuda()` chained on it or not), a project function."""
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in MODULE_RETURNING_METHODS:
            value = value.func.value
        if not isinstance(value, cst.Call):
            return None
        name = self.ctx.qualify(value.func)
        if name is None and isinstance(value.func, cst.Name):
            name = value.func.value  # a function of this file
        found = self.ctx.project.returned_wrap(name, self.ctx.filename) if name is not None else None
        if found is None or (found.conditions and found.wrapper == "DistributedDataParallel" and not self._may_run_ranks()):
            # A helper that wraps in DDP only under its own test (`if dist.is_initialized():`), called from
            # a script that neither starts a process group nor reads the launcher's rank: the test decides.
            return None
        here = found.path == self.ctx.path
        return WrapSite(found.wrapper, found.conditions, line=found.line, path="" if here else found.path, via=found.function)

    def _may_run_ranks(self) -> bool:
        facts = self.ctx.project.files.get(self.ctx.filename)
        ranks = facts.distributed if facts is not None else None
        return ranks is not None and (ranks.starts_process_group or ranks.reads_local_rank_env)

    def _element_sites(self, value: cst.BaseExpression, path) -> FrozenSet[WrapSite]:
        """The wraps every element of a list, tuple or comprehension holds (`[DataParallel(h) for h in hs]`)."""
        if isinstance(value, cst.Call) and len(value.args) == 1:
            if dotted(value.func) in ("list", "tuple") or self.ctx.qualify(value.func) == "torch.nn.ModuleList":
                value = value.args[0].value
        if isinstance(value, (cst.ListComp, cst.GeneratorExp)):
            elements = [value.elt]
        elif isinstance(value, (cst.List, cst.Tuple)) and value.elements:
            elements = [element.value for element in value.elements]
        else:
            return frozenset()
        wrappers = [wrap_call(self.ctx, element, self.classes) for element in elements]
        if None in wrappers:
            return frozenset()
        return frozenset(WrapSite(wrapper, path, node=element) for wrapper, element in zip(wrappers, elements))

    def _member_sites(self, value: cst.BaseExpression, path) -> Dict[str, FrozenSet[WrapSite]]:
        """`trainer = Trainer(net)`: the `self.<attr>` wraps that the class's `__init__` (or a base's) makes."""
        if not isinstance(value, cst.Call):
            return {}
        name = dotted(value.func)
        if name is None:
            return {}
        found: Dict[str, FrozenSet[WrapSite]] = {}
        for wrap in self.ctx.project.attribute_wraps.get(name.rpartition(".")[2], ()):
            if wrap.method == "__init__":
                here = wrap.path == self.ctx.path
                site = WrapSite(wrap.wrapper, (*path, *wrap.conditions), line=wrap.line, path="" if here else wrap.path)
                found[wrap.attribute] = found.get(wrap.attribute, frozenset()) | {site}
        return found


def _prepares_in_ddp(ctx: FileContext) -> bool:
    """Whether the Accelerator of the file wraps the modules it prepares in DDP in a run of several
    processes: the file builds it, from settings it shows (no `**options`), with no DeepSpeed or FSDP."""
    builds = accelerator_builds(ctx)
    return bool(builds) and not shards_through_accelerate(ctx) and not any(arg.star for call in builds for arg in call.args)


def _frozen_modules(ctx: FileContext) -> FrozenSet[str]:
    """Names whose every parameter the file freezes (`vae.requires_grad_(False)`, `p.requires_grad =
    False` for each `p` of `model.parameters()`): Accelerate wraps such a model in DDP on no GPU (and
    DDP refuses it on CPUs)."""

    def find() -> FrozenSet[str]:
        found: Set[str] = set()
        for node in descendants(ctx.module):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "requires_grad_":
                if node.args and is_literal(node.args[0].value, False):
                    found.add(dotted(node.func.value) or "")
            elif isinstance(node, cst.For) and isinstance(node.iter, cst.Call) and isinstance(node.iter.func, cst.Attribute):
                if node.iter.func.attr.value == "parameters" and _sets_requires_grad_false(node):
                    found.add(dotted(node.iter.func.value) or "")
        return frozenset(found - {""})

    return ctx.memo("frozen-modules", find)


def _sets_requires_grad_false(loop: cst.For) -> bool:
    """`for p in m.parameters(): p.requires_grad = False` (a statement of the loop's own body)."""
    target = dotted(loop.target)
    for small in iter_small_statements(block_body(loop.body), into_functions=False):
        if isinstance(small, cst.Assign) and is_literal(small.value, False):
            if any(dotted(t.target) == f"{target}.requires_grad" for t in small.targets):
                return True
    return False


def _unpacked(target: cst.BaseExpression) -> List[cst.BaseExpression]:
    """The targets an unpacking assignment binds (`a, (b, *c)` → a, b, c); none for a single target."""
    if not isinstance(target, (cst.Tuple, cst.List)):
        return []
    found: List[cst.BaseExpression] = []
    for element in target.elements:
        value = element.value
        found += _unpacked(value) or [value]
    return found


def _possible(state: Mapping[str, FrozenSet[WrapSite]], path: Tuple[Condition, ...]) -> Dict[str, FrozenSet[WrapSite]]:
    possible = {}
    for name, sites in state.items():
        kept = frozenset(site for site in sites if site.possible_under(path))
        if kept:
            possible[name] = kept
    return possible


def _join(a, b):
    if a is None:
        return None if b is None else dict(b)
    if b is None:
        return dict(a)
    joined = dict(a)
    for name, sites in b.items():
        joined[name] = joined.get(name, frozenset()) | sites
    return joined




_COMPARISON = re.compile(r"^(?P<left>.+?)\s*(?P<op>==|!=|<=|>=|<|>)\s*(?P<right>-?\d+)$")
_OPS = {
    "==": lambda x, k: x == k,
    "!=": lambda x, k: x != k,
    "<=": lambda x, k: x <= k,
    ">=": lambda x, k: x >= k,
    "<": lambda x, k: x < k,
    ">": lambda x, k: x > k,
}


@lru_cache(maxsize=None)
def _implied(condition: Condition) -> Tuple[Condition, ...]:
    """A condition and the parts it implies: each side of an `and` that holds, of an `or` that fails
    (so that `if a and b:` rules out a wrap made under `not b`)."""
    text, holds = condition
    try:
        test = cst.parse_expression(text)
    except cst.ParserSyntaxError:
        return (condition,)
    parts: List[Condition] = [condition]
    pending = [(test, holds)]
    while pending:
        test, holds = pending.pop()
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And if holds else cst.Or):
            for side, side_holds in ((test.left, holds), (test.right, holds)):
                while isinstance(side, cst.UnaryOperation) and isinstance(side.operator, cst.Not):
                    side, side_holds = side.expression, not side_holds  # as a branch records `not c`
                side = side.with_changes(lpar=(), rpar=())
                parts.append((" ".join(cst.Module([]).code_for_node(side).split()), side_holds))
                pending.append((side, side_holds))
    return tuple(parts)


def _excludes(needed: Condition, taken: Condition) -> bool:
    """Whether taking `taken` rules out `needed`: the same test on the other branch, or comparisons of
    the same value with constants that no integer satisfies together (`ngpu > 1` and `ngpu == 1`)."""
    (needed_test, needed_holds), (taken_test, taken_holds) = needed, taken
    if needed_test == taken_test:
        return needed_holds != taken_holds
    a, b = _COMPARISON.match(needed_test), _COMPARISON.match(taken_test)
    if a is None or b is None or a.group("left") != b.group("left"):
        return False
    ka, kb = int(a.group("right")), int(b.group("right"))
    for x in range(min(ka, kb, 0) - 1, max(ka, kb) + 3):
        if _OPS[a.group("op")](x, ka) == needed_holds and _OPS[b.group("op")](x, kb) == taken_holds:
            return False
    return True


@dataclass(frozen=True)
class ClassWraps:
    """The wraps of `self.<attr>` a class's methods make (`{"self.model": sites}`; a container of
    wrappers as `{"self.heads[]": sites}`): `leaving`, those a method can return with, which any later
    method may see; `during`, by method name, those a method holds while it calls that other method on
    `self` (`self._train()` between a wrap and `self.model = self.model.module`)."""

    leaving: Mapping[str, FrozenSet[WrapSite]]
    during: Mapping[str, Mapping[str, FrozenSet[WrapSite]]]

    def seen_by(self, method: str) -> Dict[str, FrozenSet[WrapSite]]:
        found = dict(self.leaving)
        for key, sites in self.during.get(method, {}).items():
            found[key] = found.get(key, frozenset()) | sites
        return found


def class_attribute_wraps(ctx: FileContext, cls: cst.ClassDef) -> ClassWraps:
    """What the class's methods leave wrapped in `self.<attr>` (self named `self` in the keys): each
    method walked from its start with nothing wrapped, a call of another of its methods on `self`
    leaving what that one leaves. A method that only the class's own methods call leaves its wraps to
    them (`incremental_train` unwraps what `self._train()` wrapped); the others, to any later method."""
    methods = {m.name.value: m for m in block_body(cls.body) if isinstance(m, cst.FunctionDef) and method_self(m) is not None}
    left: Dict[str, Dict[str, FrozenSet[WrapSite]]] = {}  # method → the `self.<attr>` wraps it returns with
    during: Dict[str, Dict[str, FrozenSet[WrapSite]]] = {}
    called_on_self: Set[str] = set()

    def leaves(name: str) -> Dict[str, FrozenSet[WrapSite]]:
        if name in left:
            return left[name]
        left[name] = {}  # a recursive call leaves nothing more
        method = methods[name]
        self_name = method_self(method) or "self"

        def after_call(call: cst.Call) -> State:
            if isinstance(call.func, cst.Attribute) and dotted(call.func.value) == self_name and call.func.attr.value in methods:
                return {f"{self_name}.{key[5:]}": sites for key, sites in leaves(call.func.attr.value).items()}
            return {}

        exits: List[State] = []
        found: Dict[str, FrozenSet[WrapSite]] = {}
        for point in WrapFlow(ctx).points(block_body(method.body), exits=exits, after_call=after_call):
            if _own_attributes(point.wrapped, self_name):
                holds.add(name)
            for node in descendants(point.statement):
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and dotted(node.func.value) == self_name:
                    called_on_self.add(node.func.attr.value)
        for state in exits:
            for key, sites in _own_attributes(state, self_name).items():
                found[key] = found.get(key, frozenset()) | sites
        if found:
            holds.add(name)
        left[name] = found
        return found

    holds: Set[str] = set()  # the methods that hold a wrap of `self.<attr>` somewhere
    for name in methods:
        leaves(name)
    if not holds:
        return ClassWraps({}, {})
    # What each method holds while it calls another on `self`, and so what that one starts with,
    # through any depth of calls (`incremental_train` wraps, `_train()` calls `replace_fc()`).
    changed = True
    while changed:
        changed = False
        for name, method in methods.items():
            self_name = method_self(method) or "self"
            initial = {f"{self_name}.{key[5:]}": sites for key, sites in during.get(name, {}).items()}

            def after_call(call: cst.Call, self_name: str = self_name) -> State:
                if isinstance(call.func, cst.Attribute) and dotted(call.func.value) == self_name and call.func.attr.value in methods:
                    return {f"{self_name}.{key[5:]}": sites for key, sites in left[call.func.attr.value].items()}
                return {}

            for point in WrapFlow(ctx).points(block_body(method.body), initial, after_call=after_call):
                held = _own_attributes(point.wrapped, self_name)
                if not held:
                    continue
                for node in descendants(point.statement):
                    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and dotted(node.func.value) == self_name:
                        into = during.setdefault(node.func.attr.value, {})
                        for key, sites in held.items():
                            if not sites <= into.get(key, frozenset()):
                                into[key] = into.get(key, frozenset()) | sites
                                changed = True
    called_elsewhere = attribute_references(ctx)
    self_calls = _self_calls(ctx, cls)
    leaving: Dict[str, FrozenSet[WrapSite]] = {}
    for name, found in left.items():
        # Called only as `self.<name>()` by this class's methods: what it leaves, they handle.
        only_inside = name in called_on_self and called_elsewhere.get(name, 0) == self_calls.get(name, 0)
        if only_inside:
            continue
        for key, sites in found.items():
            leaving[key] = leaving.get(key, frozenset()) | sites
    init = methods.get("__init__")
    kept = _parameters_kept_on_self(cls, init) if init is not None and left.get("__init__") else {}
    if kept:
        # Other methods test what `__init__` tested through the attribute that keeps it: a wrap made
        # `if args.distributed:` is one made `if self.args.distributed:` (`self.args = args`).
        made_in_init = {site for sites in left["__init__"].values() for site in sites}

        def restate(sites: FrozenSet[WrapSite]) -> FrozenSet[WrapSite]:
            return frozenset(_restated(site, kept) if site in made_in_init else site for site in sites)

        leaving = {key: restate(sites) for key, sites in leaving.items()}
        during = {method: {key: restate(sites) for key, sites in held.items()} for method, held in during.items()}
    return ClassWraps(leaving, during)


def _restated(site: WrapSite, kept: Mapping[str, str]) -> WrapSite:
    """The site with each kept parameter in its conditions named by the attribute that keeps it."""
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, kept)) + r")\b")
    conditions = tuple((pattern.sub(lambda match: kept[match.group(1)], test), holds) for test, holds in site.conditions)
    return replace(site, conditions=conditions) if conditions != site.conditions else site


def _parameters_kept_on_self(cls: cst.ClassDef, init: cst.FunctionDef) -> Dict[str, str]:
    """`__init__`'s parameters that it keeps whole on `self` (`self.args = args` in its body, not in a
    branch): parameter → `self.args`. Only where `__init__` never rebinds the parameter and no method
    assigns the attribute again."""
    self_name = method_self(init)
    if self_name is None:
        return {}
    parameters = {param.name.value for param in (*init.params.posonly_params, *init.params.params, *init.params.kwonly_params)}
    parameters.discard(self_name)
    kept: Dict[str, str] = {}
    for statement in (small for line in block_body(init.body) if isinstance(line, cst.SimpleStatementLine) for small in line.body):
        if (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Attribute)
            and dotted(statement.targets[0].target.value) == self_name
            and isinstance(statement.value, cst.Name)
            and statement.value.value in parameters
        ):
            kept[statement.value.value] = statement.targets[0].target.attr.value
    if not kept:
        return {}
    assigned: Dict[str, int] = {}  # attribute → how many times the class's methods assign it
    rebound: Set[str] = set()
    for scope in (cls, init):
        for node in descendants(scope):
            if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
                target: cst.CSTNode = node.target
            elif isinstance(node, cst.AsName):
                target = node.name
            else:
                continue
            for part in assigned_parts(target):
                if scope is cls and isinstance(part, cst.Attribute):
                    assigned[part.attr.value] = assigned.get(part.attr.value, 0) + 1
                elif scope is init and isinstance(part, cst.Name):
                    rebound.add(part.value)
    return {parameter: f"self.{attribute}" for parameter, attribute in kept.items() if parameter not in rebound and assigned.get(attribute) == 1}


def _self_calls(ctx: FileContext, cls: cst.ClassDef) -> Dict[str, int]:
    """How many times the class's methods call each attribute on their own object (`self.name(...)`)."""
    found: Dict[str, int] = {}
    for method in block_body(cls.body):
        if isinstance(method, cst.FunctionDef):
            self_name = method_self(method)
            for node in descendants(method):
                if isinstance(node, cst.Attribute) and self_name is not None and dotted(node.value) == self_name:
                    found[node.attr.value] = found.get(node.attr.value, 0) + 1
    return found


def _own_attributes(state: Mapping[str, FrozenSet[WrapSite]], self_name: str) -> Dict[str, FrozenSet[WrapSite]]:
    """`self.<attr>` (and `self.<attr>[]`) that hold a wrapper in `state`, keyed with `self`."""
    found = {}
    for name, sites in state.items():
        head, _, attribute = name.partition(".")
        if head == self_name and attribute and "." not in attribute:
            found["self." + attribute] = sites
    return found


def method_self(method: cst.FunctionDef) -> Optional[str]:
    """The name of a method's first parameter, unless it is a static or class method."""
    for decorator in method.decorators:
        if dotted(decorator.decorator) in ("staticmethod", "classmethod"):
            return None
    params = method.params.params or method.params.posonly_params
    return params[0].name.value if params else None


def method_initial_state(
    class_wraps: Mapping[str, FrozenSet[WrapSite]], method: cst.FunctionDef, self_name: str, wrapped_here: Set[str]
) -> Dict[str, FrozenSet[WrapSite]]:
    """What a method starts with: the class's `self.<attr>` wraps made in other methods (not in `__init__`,
    where the object is fresh, and not for attributes this method wraps itself)."""
    if method.name.value == "__init__":
        return {}
    state = {}
    for key, sites in class_wraps.items():
        attribute = key.partition(".")[2]
        if attribute.removesuffix("[]") not in wrapped_here:
            state[f"{self_name}.{attribute}"] = sites
    return state


def attributes_wrapped_in(ctx: FileContext, method: cst.FunctionDef, self_name: str) -> Set[str]:
    flow = WrapFlow(ctx)
    wrapped = set()
    for small in _small_statements(block_body(method.body)):
        for target in flow.wrapping_targets(small):
            name = dotted(target)
            if name and name.startswith(self_name + ".") and name.count(".") == 1:
                wrapped.add(name.partition(".")[2])
    return wrapped


def _small_statements(body: Body) -> Iterable[cst.BaseSmallStatement]:
    return iter_small_statements(body, into_functions=False)


def scope_points(ctx: FileContext) -> Iterator[Point]:
    for points in scopes(ctx):
        yield from points


def scopes(ctx: FileContext) -> List[List[Point]]:
    """The points of the module body and of every function in it, one list per scope; a method
    starts with its class's `self.<attr>` wraps made in other methods, and those of its base classes
    (this file, or the project). Computed once per file: DPL302, DPL303, DPL507 and DPL514 share it."""
    return list(_points_by_scope(ctx).values())


def _points_by_scope(ctx: FileContext) -> Dict[Optional[cst.FunctionDef], List[Point]]:
    return ctx.memo("wrap-scopes", lambda: {node: list(points) for node, points in _walk_scopes(ctx, _scope_flow(ctx))})


def _scope_flow(ctx: FileContext) -> WrapFlow:
    """The flow that walks the scopes of `scopes`; its `tests` fill as they are walked."""
    return ctx.memo("wrap-scope-flow", lambda: WrapFlow(ctx))


def if_tests(ctx: FileContext) -> Dict[int, Tuple[Dict[str, FrozenSet[WrapSite]], FrozenSet[str]]]:
    """For each `if`/`elif` that `scopes` reaches (by `id`): the wraps that may reach its test, and the
    names the code handles there (an `if` statement's own checks count only inside it)."""
    _points_by_scope(ctx)
    return _scope_flow(ctx).tests


def wrapped_names(ctx: FileContext, scope: ScopeInfo, classes: Mapping[str, str] = DDP_CLASSES, prepared: bool = True) -> FrozenSet[str]:
    """The names that may hold a wrapper of `classes` somewhere in the scope (a function, or the module's
    top level); without `prepared`, not those whose only wraps are an Accelerator's `prepare`."""
    if classes is FSDP_CLASSES:
        return ctx.memo(f"fsdp-wrapped:{id(scope.node)}", lambda: _fsdp_wrapped_names(ctx, scope))
    kinds = set(classes.values())
    return frozenset(
        name
        for point in _points_by_scope(ctx).get(scope.node, ())
        for name, sites in point.wrapped.items()
        if any(site.wrapper in kinds and (prepared or not site.accelerator) for site in sites)
    )


def ddp_wraps_at(ctx: FileContext, scope: ScopeInfo, node: cst.CSTNode) -> Optional[Dict[str, FrozenSet[WrapSite]]]:
    """The DDP wraps that may reach the statement holding `node`, by the name they wrap into: a forward
    written before `model = DDP(model)` goes through the bare model. None outside any small statement
    (an `if` or `for` header)."""
    point = ctx.memo(f"wrap-lines:{id(scope.node)}", lambda: _points_by_line(ctx, scope)).get(ctx.line(node))
    if point is None:
        return None
    kinds = set(DDP_CLASSES.values())
    return {name: wraps for name, sites in point.wrapped.items() if (wraps := frozenset(site for site in sites if site.wrapper in kinds))}


def _points_by_line(ctx: FileContext, scope: ScopeInfo) -> Dict[int, Point]:
    found: Dict[int, Point] = {}
    for point in _points_by_scope(ctx).get(scope.node, ()):
        position = ctx.position(point.statement)
        for line in range(position.start.line, position.end.line + 1):
            found.setdefault(line, point)
    return found


def _fsdp_wrapped_names(ctx: FileContext, scope: ScopeInfo) -> FrozenSet[str]:
    """FSDP is no attribute-hiding wrapper, so not in the shared walk: its own walk of the scope, and
    the `self.<attr>` that the scope's class wraps in any of its methods."""
    if "FullyShardedDataParallel" not in ctx.source:
        return frozenset()
    flow = WrapFlow(ctx, FSDP_CLASSES)
    names: Set[str] = set()
    for point in flow.points(scope.body):
        names.update(name for name, sites in point.wrapped.items() if _fsdp(sites))
    if scope.owner is not None:
        for method in block_body(scope.owner.body):
            if isinstance(method, cst.FunctionDef):
                exits: List[State] = []
                for _ in flow.points(block_body(method.body), exits=exits):
                    pass
                names.update(name for state in exits for name, sites in state.items() if name.startswith("self.") and _fsdp(sites))
    return frozenset(names)


def _fsdp(sites: FrozenSet[WrapSite]) -> bool:
    return any(site.wrapper == "FullyShardedDataParallel" for site in sites)


def _walk_scopes(ctx: FileContext, flow: WrapFlow) -> Iterator[Tuple[Optional[cst.FunctionDef], Iterable[Point]]]:
    module_points = list(flow.points(ctx.module.body))
    yield None, module_points
    module_calls: Dict[str, List[Point]] = {}  # the module's statements that call each name
    for point in module_points:
        for node in descendants(point.statement):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
                module_calls.setdefault(node.func.value, []).append(point)
    classes = {s.name.value: s for s in all_classes(ctx.module.body)}
    own: Dict[str, ClassWraps] = {}

    def wraps_of(name: str, method: str = "", seen: FrozenSet[str] = frozenset()) -> Dict[str, FrozenSet[WrapSite]]:
        """The wraps of `self.<attr>` that `method` of the class `name` (or of its bases) may see."""
        if name in seen:
            return {}
        if name not in classes:
            return {
                f"self.{attribute}": frozenset(WrapSite(w.wrapper, w.conditions, line=w.line, path=w.path) for w in wraps if w.leaves or method in w.during)
                for attribute, wraps in ctx.project.inherited_attribute_wraps(name).items()
                if any(w.leaves or method in w.during for w in wraps)
            }
        if name not in own:
            own[name] = class_attribute_wraps(ctx, classes[name])
        found: Dict[str, FrozenSet[WrapSite]] = {}
        for base in classes[name].bases:
            base_name = dotted(base.value)
            if base_name is not None:
                base_name = base_name.rpartition(".")[2]
                ruled_out = ctx.project.ruled_out_base_wraps(name, base_name)
                for key, sites in wraps_of(base_name, method, seen | {name}).items():
                    if ruled_out:
                        sites = frozenset(site for site in sites if (site.path or ctx.path, site.line_in(ctx)) not in ruled_out)
                    if sites:
                        found[key] = found.get(key, frozenset()) | sites
        found.update(own[name].seen_by(method))
        return found

    def walk(body: Body, cls: Optional[cst.ClassDef], top: bool = False) -> Iterator[Tuple[cst.FunctionDef, Iterable[Point]]]:
        early = _methods_run_before_the_wrap(ctx, cls, wraps_of(cls.name.value)) if cls is not None else frozenset()
        for statement in body:
            if isinstance(statement, cst.ClassDef):
                yield from walk(block_body(statement.body), statement)
            elif isinstance(statement, cst.FunctionDef):
                initial: Dict[str, FrozenSet[WrapSite]] = (
                    {**global_wraps(ctx, statement, module_calls.get(statement.name.value, [])), **parameter_wraps(ctx, statement)}
                    if top
                    else {}
                )
                self_name = method_self(statement) if cls is not None else None
                if cls is not None and self_name is not None and statement.name.value not in early:
                    initial = method_initial_state(
                        wraps_of(cls.name.value, statement.name.value), statement, self_name, attributes_wrapped_in(ctx, statement, self_name)
                    )
                yield statement, flow.points(block_body(statement.body), initial)
                yield from walk(block_body(statement.body), None)
            elif isinstance(statement, cst.BaseCompoundStatement):
                for block in child_blocks(statement):
                    yield from walk(block, None)

    yield from walk(ctx.module.body, None, top=True)


def global_wraps(ctx: FileContext, function: cst.FunctionDef, calls: Sequence[Point]) -> Dict[str, FrozenSet[WrapSite]]:
    """The module's names that may hold a wrapper when the top-level `function` runs (`net` wrapped at
    module level, saved in `def test(epoch):`): at each of `calls`, the module's statements that call
    it, what the module's flow says there. Only when those calls are its only uses, here or in another
    file, and for the names the function does not bind itself."""
    name = function.name.value
    if function.decorators:
        return {}
    if not calls or _name_counts(ctx).get(name, 0) != 1 + len(calls) or ctx.project.calls_from_other_files(ctx.filename, name) != ():
        return {}
    local = Inference.of(ctx).local_names(function)
    state: Dict[str, FrozenSet[WrapSite]] = {}
    for point in calls:
        for held, sites in point.wrapped.items():
            base = held.removesuffix("[]")  # a module-level list of wrappers too
            if base.isidentifier() and base not in local:
                state[held] = state.get(held, frozenset()) | sites
    return state


def parameter_wraps(ctx: FileContext, function: cst.FunctionDef) -> Dict[str, FrozenSet[WrapSite]]:
    """The parameters of a top-level function to which every call in the project passes a wrapper (at
    the wrap in the caller, under its conditions there). A decorated function may be called by its
    decorator, and one that its own file uses elsewhere (a file that wraps nothing and names no torch
    is not read for calls) may be called with a plain model: neither has any."""
    name = function.name.value
    if function.decorators or name not in ctx.project.wrapper_receivers:
        return {}
    calls = ctx.project.wrapper_arguments_of(ctx.filename, name)
    facts = ctx.project.files.get(ctx.filename)
    unread = facts is None or facts.other_references is None
    if not calls or (unread and _name_counts(ctx).get(name, 0) > 1):  # more than the `def`'s own name
        return {}
    params = function.params
    positional = [param.name.value for param in (*params.posonly_params, *params.params)]
    state: Dict[str, FrozenSet[WrapSite]] = {}
    for index, param in enumerate((*positional, *(p.name.value for p in params.kwonly_params))):
        sites = set()
        for call in calls:
            slot = next((s for s in call.slots if s[0] == param or (index < len(positional) and s[0] == index)), None)
            if slot is None:
                break
            _, wrapper, line, conditions = slot
            sites.add(WrapSite(wrapper, conditions, line=line, path="" if call.path == ctx.path else call.path))
        else:
            state[param] = frozenset(sites)
    return state


def _name_counts(ctx: FileContext) -> Dict[str, int]:
    """How many times each name occurs in the file (definitions and uses); an attribute (`model.train()`)
    and a keyword (`f(train=True)`) are other names, whatever they are spelt."""

    def count() -> Dict[str, int]:
        found: Dict[str, int] = {}
        others = set()
        for node in descendants(ctx.module):
            if isinstance(node, cst.Attribute):
                others.add(id(node.attr))
            elif isinstance(node, cst.Arg) and node.keyword is not None:
                others.add(id(node.keyword))
            elif isinstance(node, cst.Name) and id(node) not in others:
                found[node.value] = found.get(node.value, 0) + 1
        return found

    return ctx.memo("name-counts", count)


def _methods_run_before_the_wrap(ctx: FileContext, cls: cst.ClassDef, class_wraps: Mapping[str, FrozenSet[WrapSite]]) -> FrozenSet[str]:
    """Methods that only `__init__` calls, before it wraps anything (`self.load_model(path)` then
    `self.model = DDP(self.model)`): they never see the wrapper. Only when `__init__` makes every wrap
    of the class, and the file names the method nowhere else; a caller in another file is unknown, so
    such a method is public API and the rule stays silent on it rather than guess."""
    methods = {s.name.value: s for s in block_body(cls.body) if isinstance(s, cst.FunctionDef)}
    init = methods.get("__init__")
    self_name = method_self(init) if init is not None else None
    if init is None or self_name is None or not class_wraps:
        return frozenset()
    wrapped_in_init = attributes_wrapped_in(ctx, init, self_name)
    if {key.partition(".")[2].removesuffix("[]") for key in class_wraps} - wrapped_in_init:
        return frozenset()  # a wrap made elsewhere (another method, a base class)
    flow = WrapFlow(ctx)
    early: Dict[str, int] = {}
    late: Set[str] = set()
    wrapped = False
    for small in _small_statements(block_body(init.body)):
        for node in descendants(small):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and dotted(node.func.value) == self_name:
                name = node.func.attr.value
                if wrapped:
                    late.add(name)
                else:
                    early[name] = early.get(name, 0) + 1
        if flow.wrapping_targets(small):
            wrapped = True
    references = attribute_references(ctx)
    return frozenset(name for name, calls in early.items() if name in methods and name not in late and references.get(name) == calls)


def attribute_references(ctx: FileContext) -> Dict[str, int]:
    """How many times the file reads each attribute name (`x.name`, any `x`)."""

    def count() -> Dict[str, int]:
        found: Dict[str, int] = {}
        for node in descendants(ctx.module):
            if isinstance(node, cst.Attribute):
                found[node.attr.value] = found.get(node.attr.value, 0) + 1
        return found

    return ctx.memo("attribute-references", count)


def all_classes(body: Body) -> Iterator[cst.ClassDef]:
    for statement in body:
        if isinstance(statement, cst.ClassDef):
            yield statement
            yield from all_classes(block_body(statement.body))
        elif isinstance(statement, cst.BaseCompoundStatement) and not isinstance(statement, cst.FunctionDef):
            for block in child_blocks(statement):
                yield from all_classes(block)
