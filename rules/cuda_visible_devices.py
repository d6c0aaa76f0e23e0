from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.torch_api import DATA_PARALLEL
from dplint.analysis.wrapping import all_classes, attribute_references, method_self
from dplint.analysis.names import (
    Body,
    ImportMap,
    block_body,
    child_blocks,
    child_nodes,
    descendants,
    header_expressions,
    dotted,
    iter_small_statements,
)
from dplint.rule import Invalid, Report, Rule, Valid

VARIABLE = "CUDA_VISIBLE_DEVICES"
# torch.cuda functions that call cuInit (read from torch/cuda/__init__.py: `_lazy_init` and friends).
CUDA_INITIALISERS = frozenset(
    "torch.cuda." + name
    for name in """is_available init set_device current_device get_device_name get_device_properties
    get_device_capability synchronize current_stream default_stream mem_get_info is_bf16_supported
    get_rng_state get_rng_state_all initial_seed can_device_access_peer set_per_process_memory_fraction
    device device_count""".split()
)
DEVICE_COUNT = "torch.cuda.device_count"
ENVIRON_SETTERS = frozenset({"os.environ.setdefault", "os.environ.update", "os.environ.__setitem__", "os.putenv"})
ENVIRON_READERS = frozenset({"os.environ.get", "os.getenv", "os.environ.pop"})
# Calls that start a process which reads the environment afresh (a new interpreter, or Ray's workers):
# a write followed by one of them, and by no CUDA use of this process, is made for that child.
CHILD_STARTERS = frozenset(
    {
        "os.system", "os.popen", "os.execv", "os.execve", "os.execvp", "os.execvpe", "os.execl", "os.execle",
        "os.execlp", "os.execlpe", "os.spawnv", "os.spawnve", "os.spawnvp", "os.spawnvpe", "os.spawnl", "os.spawnle",
        "os.spawnlp", "os.spawnlpe", "os.posix_spawn", "os.posix_spawnp", "subprocess.run", "subprocess.Popen",
        "subprocess.call", "subprocess.check_call", "subprocess.check_output", "subprocess.getoutput",
        "subprocess.getstatusoutput", "ray.init",
        # SGLang's inference server, a process of its own (`multiprocessing` with `spawn`).
        "sglang.srt.entrypoints.http_server_engine.launch_server_process",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Event:
    """Something that happened on the executed path: torch imported, or CUDA initialised."""

    text: str
    node: cst.CSTNode  # its line is looked up only when a finding names it: positions are costly
    function: Optional[str] = None  # the function of this file it happened in
    device_count: bool = False
    imports_torch_indirectly: bool = False

    def describe(self, ctx: FileContext) -> str:
        inside = f" (in `{self.function}()`)" if self.function else ""
        indirect = ", which imports torch" if self.imports_torch_indirectly else ""
        return f"{self.text} on line {ctx.line(self.node)}{inside}{indirect}"


@dataclass(frozen=True)
class FlowState:
    torch_import: Optional[Event] = None
    cuda_init: Optional[Event] = None
    cuda_names: frozenset = frozenset()  # names bound to a CUDA device (`device = torch.device("cuda")`)
    pending: frozenset = frozenset()  # the writes before CUDA initialises, which no initialisation followed yet

    def merge(self, other: "FlowState") -> "FlowState":
        """Where two paths meet: torch may have been imported on either (DPL202 says "may"), but CUDA
        counts as initialised, and a name as a CUDA device, only when it is so on both (DPL201 is certain)."""
        return FlowState(
            self.torch_import or other.torch_import,
            self.cuda_init if other.cuda_init is not None else None,
            self.cuda_names & other.cuda_names,
            self.pending | other.pending,
        )


@dataclass
class Assignment:
    node: cst.CSTNode
    statement: cst.CSTNode
    code: str  # DPL201 or DPL202
    cause: Event
    scope: Optional[cst.FunctionDef]  # the function whose statement it is (None: the module's)


# Abstract runs of function bodies one file may cost before its flow is given up as unknown. Each
# function runs once per distinct entry state; adversarial code could make those exponential.
MAX_FUNCTION_RUNS = 2000


class _TooComplex(Exception):
    pass


@dataclass
class FlowAnalysis:
    """Executes the file abstractly, in execution order, and records every CUDA_VISIBLE_DEVICES write."""

    ctx: FileContext
    assignments: Dict[cst.CSTNode, Assignment] = field(default_factory=dict)
    functions: Dict[str, cst.FunctionDef] = field(default_factory=dict)
    executed: Set[cst.FunctionDef] = field(default_factory=set)
    running: List[cst.FunctionDef] = field(default_factory=list)
    # A function's effect depends only on the state it is entered with: run each pair once.
    effects: Dict[Tuple[cst.FunctionDef, FlowState], FlowState] = field(default_factory=dict)
    calls: Dict[cst.CSTNode, List[cst.Call]] = field(default_factory=dict)
    local_names: Dict[cst.FunctionDef, frozenset] = field(default_factory=dict)
    # The writes made before CUDA initialised that an initialisation of this process then followed.
    followed_by_cuda: Set[cst.CSTNode] = field(default_factory=set)

    def run(self) -> "FlowAnalysis":
        module = self.ctx.module
        if not any(variable_write(self.ctx, small) is not None for small in iter_small_statements(module.body)):
            return self
        for statement in module.body:
            if isinstance(statement, cst.FunctionDef):
                self.functions[statement.name.value] = statement
        try:
            state = self._block(module.body, FlowState())
            # A function nothing in the file calls runs later, after the module has been imported.
            later = FlowState(state.torch_import, state.cuda_init)
            for function in _all_functions(module.body):
                if function not in self.executed:
                    self.executed.add(function)
                    self._run_function(function, later)
        except _TooComplex:
            self.assignments.clear()  # unknown stays silent
        return self

    def _run_function(self, function: cst.FunctionDef, state: FlowState) -> FlowState:
        """The state after a call: a function's own local names neither come in nor go out."""
        if function not in self.local_names:
            self.local_names[function] = _local_names(function)
        local = self.local_names[function]
        entry = replace(state, cuda_names=state.cuda_names - local)
        key = (function, entry)
        if key not in self.effects:
            if len(self.effects) >= MAX_FUNCTION_RUNS:
                raise _TooComplex
            self.running.append(function)
            try:
                self.effects[key] = self._block(block_body(function.body), entry)
            finally:
                self.running.pop()
        after = self.effects[key]
        return replace(after, cuda_names=state.cuda_names)

    def _block(self, body: Body, state: FlowState) -> FlowState:
        for statement in body:
            state = self._statement(statement, state)
        return state

    def _statement(self, statement: cst.CSTNode, state: FlowState) -> FlowState:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                state = self._small(small, state)
            return state
        if isinstance(statement, cst.FunctionDef):
            return state
        if isinstance(statement, cst.ClassDef):
            return self._block(block_body(statement.body), state)
        state = self._expressions(header_expressions(statement), statement, state)
        if isinstance(statement, cst.With):
            return self._block(block_body(statement.body), state)
        after = state
        paths = [self._block(block, state) for block in child_blocks(statement)]
        if _one_block_runs(statement):
            after = paths.pop(0)
        for path in paths:
            after = after.merge(path)
        return after

    def _small(self, small: cst.BaseSmallStatement, state: FlowState) -> FlowState:
        if isinstance(small, (cst.Import, cst.ImportFrom)):
            if state.torch_import is None:
                state = replace(state, torch_import=self._torch_import(small))
            return state
        if isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            value = small.value
            if value is not None:
                state = self._expressions([value], small, state)
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
            if any(_is_variable_subscript(self.ctx, target) for target in targets):
                state = self._record(small, small, state)
            return self._track_device_names(targets, value, state)
        return self._expressions([small], small, state)

    def _track_device_names(self, targets: Sequence[cst.BaseExpression], value, state: FlowState) -> FlowState:
        names = {t.value for t in targets if isinstance(t, cst.Name)}
        if not names:
            return state
        is_cuda = value is not None and self._is_cuda_device(value, state)
        cuda_names = state.cuda_names | names if is_cuda else state.cuda_names - names
        return replace(state, cuda_names=frozenset(cuda_names))

    def _expressions(self, nodes: Sequence[cst.CSTNode], statement: cst.CSTNode, state: FlowState) -> FlowState:
        for node in nodes:
            if node not in self.calls:
                self.calls[node] = list(_calls_in_evaluation_order(node))
            for call in self.calls[node]:
                state = self._call(call, statement, state)
        return state

    def _call(self, call: cst.Call, statement: cst.CSTNode, state: FlowState) -> FlowState:
        qualified = self.ctx.qualify(call.func)
        if qualified in ENVIRON_SETTERS and _set_value(call, qualified) is not None:
            return self._record(call, statement, state)
        if state.cuda_init is None and self._initialises_cuda(call, qualified, state):
            function = self.running[-1].name.value if self.running else None
            event = Event(f"`{self.ctx.short_code(call)}`", call, function, qualified == DEVICE_COUNT)
            self.followed_by_cuda.update(state.pending)
            return replace(state, cuda_init=event, pending=frozenset())
        if isinstance(call.func, cst.Name):
            function = self.functions.get(call.func.value)
            if function is not None and function not in self.running:
                self.executed.add(function)
                return self._run_function(function, state)
        return state

    def _record(self, node: cst.CSTNode, statement: cst.CSTNode, state: FlowState) -> FlowState:
        scope = self.running[-1] if self.running else None
        if state.cuda_init is not None:
            found = Assignment(node, statement, "DPL201", state.cuda_init, scope)
        elif state.torch_import is not None:
            found = Assignment(node, statement, "DPL202", state.torch_import, scope)
        else:
            return state
        previous = self.assignments.get(node)
        if previous is None or (previous.code == "DPL202" and found.code == "DPL201"):
            self.assignments[node] = found
        return state if state.cuda_init is not None else replace(state, pending=state.pending | {node})

    # ----- what the code does ---------------------------------------------------------------------

    def _torch_import(self, node: cst.Import | cst.ImportFrom) -> Optional[Event]:
        """The import as an event when it imports torch, directly or through another module."""
        if isinstance(node, cst.Import):
            modules = [dotted(alias.name) or "" for alias in node.names]
        else:
            base = ImportMap.resolve_from(node, self.ctx.package)
            names = node.names if isinstance(node.names, Sequence) else ()
            modules = [base] + [f"{base}.{dotted(alias.name)}" if base else (dotted(alias.name) or "") for alias in names]
        for module in filter(None, modules):
            if self.ctx.project.imports_torch(module, self.ctx.filename):
                function = self.running[-1].name.value if self.running else None
                indirect = module.split(".")[0] != "torch"
                return Event(f"`{self.ctx.short_code(node)}`", node, function, imports_torch_indirectly=indirect)
        return None

    def _initialises_cuda(self, call: cst.Call, qualified: Optional[str], state: FlowState) -> bool:
        if qualified is not None:
            if qualified in CUDA_INITIALISERS or qualified in DATA_PARALLEL:
                return True
            if qualified == "torch.device":
                return False
        if isinstance(call.func, cst.Attribute):
            method = call.func.attr.value
            if method == "cuda":
                return True
            if method == "to" and call.args and call.args[0].keyword is None:
                if self._is_cuda_device(call.args[0].value, state, allow_index=True):
                    return True
        return any(
            arg.keyword is not None and arg.keyword.value == "device" and self._is_cuda_device(arg.value, state)
            for arg in call.args
        )

    def _is_cuda_device(self, node: cst.BaseExpression, state: FlowState, allow_index: bool = False) -> bool:
        if isinstance(node, cst.SimpleString):
            value = node.evaluated_value
            return isinstance(value, str) and value.startswith("cuda")
        if isinstance(node, cst.FormattedString):
            head = node.parts[0] if node.parts else None
            return isinstance(head, cst.FormattedStringText) and head.value.startswith("cuda")
        if isinstance(node, cst.Integer):
            return allow_index  # `.to(0)` means cuda:0
        if isinstance(node, cst.Name):
            return node.value in state.cuda_names
        if isinstance(node, cst.Call) and self.ctx.qualify(node.func) == "torch.device" and node.args:
            return self._is_cuda_device(node.args[0].value, state)
        return False



def variable_write(ctx: FileContext, small: cst.BaseSmallStatement) -> Optional[cst.BaseExpression]:
    """The value a statement writes to `CUDA_VISIBLE_DEVICES` (`os.environ[...] = v`, `setdefault`,
    `update`, `putenv`), or None when it writes nothing to it."""
    if isinstance(small, cst.Assign):
        return small.value if any(_is_variable_subscript(ctx, target.target) for target in small.targets) else None
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        qualified = ctx.qualify(small.value.func)
        return _set_value(small.value, qualified) if qualified in ENVIRON_SETTERS else None
    return None


def _is_variable_subscript(ctx: FileContext, target: cst.BaseExpression) -> bool:
    if not (isinstance(target, cst.Subscript) and ctx.qualify(target.value) == "os.environ"):
        return False
    index = target.slice[0].slice if len(target.slice) == 1 else None
    return isinstance(index, cst.Index) and _is_variable_name(index.value)


def _set_value(call: cst.Call, qualified: Optional[str]) -> Optional[cst.BaseExpression]:
    """The value an environ setter call gives `CUDA_VISIBLE_DEVICES`, if it sets it."""
    if qualified == "os.environ.update":
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == VARIABLE:
                return arg.value
            if isinstance(arg.value, cst.Dict):
                for element in arg.value.elements:
                    if isinstance(element, cst.DictElement) and _is_variable_name(element.key):
                        return element.value
        return None
    if len(call.args) >= 2 and _is_variable_name(call.args[0].value):
        return call.args[1].value
    return None


def _is_variable_name(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.SimpleString) and node.evaluated_value == VARIABLE


def _one_block_runs(statement: cst.CSTNode) -> bool:
    """An `if`/`elif` chain that ends in `else`: one of its blocks always runs. (A loop may run no
    iteration; a `try` body may stop at its first statement; a `match` may match no case.)"""
    while isinstance(statement, cst.If):
        statement = statement.orelse
    return isinstance(statement, cst.Else)


def _calls_in_evaluation_order(node: cst.CSTNode) -> Iterator[cst.Call]:
    """Calls inside an expression, each after its arguments (lambda bodies never run here)."""
    if isinstance(node, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
        return
    for child in node.children:
        yield from _calls_in_evaluation_order(child)
    if isinstance(node, cst.Call):
        yield node


def _local_names(function: cst.FunctionDef) -> frozenset:
    """Names the function binds by assignment or as parameters, unless declared `global`/`nonlocal`."""
    params = function.params
    names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
    declared = set()
    for small in iter_small_statements(block_body(function.body), into_functions=False):
        if isinstance(small, (cst.Global, cst.Nonlocal)):
            declared.update(item.name.value for item in small.names)
        elif isinstance(small, cst.Assign):
            names.update(t.target.value for t in small.targets if isinstance(t.target, cst.Name))
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and isinstance(small.target, cst.Name):
            names.add(small.target.value)
    return frozenset(names - declared)


def _all_functions(body: Body) -> Iterator[cst.FunctionDef]:
    for statement in body:
        if isinstance(statement, cst.FunctionDef):
            yield statement
        if isinstance(statement, cst.BaseCompoundStatement):
            for block in child_blocks(statement):
                yield from _all_functions(block)


def _analysis(ctx: FileContext) -> FlowAnalysis:
    return ctx.memo("cuda-visible-devices-flow", lambda: FlowAnalysis(ctx).run())


def _assignments(ctx: FileContext, code: str) -> Iterator[Assignment]:
    """The writes that set this process's devices too late (`code`'s kind): not a restore of the value
    read before, nor a value set for a child process started after it."""
    for found in _analysis(ctx).assignments.values():
        if found.code == code and not _restores(ctx, found) and not _starts_a_child_after(ctx, found):
            yield found


def _scope_body(ctx: FileContext, found: Assignment) -> Body:
    return block_body(found.scope.body) if found.scope is not None else ctx.module.body


def _restores(ctx: FileContext, found: Assignment) -> bool:
    """`os.environ["CUDA_VISIBLE_DEVICES"] = saved` where its function read `saved` from the variable
    (`saved = os.environ.get("CUDA_VISIBLE_DEVICES")`): the value it had, put back."""
    value = _written_value(ctx, found)
    if not isinstance(value, cst.Name):
        return False
    for small in iter_small_statements(_scope_body(ctx, found)):
        if isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == value.value for t in small.targets):
            read = small.value
            if isinstance(read, cst.Call) and ctx.qualify(read.func) in ENVIRON_READERS and read.args and _is_variable_name(read.args[0].value):
                return True
            if isinstance(read, cst.Subscript) and _is_variable_subscript(ctx, read):
                return True
    return False


def _written_value(ctx: FileContext, found: Assignment) -> Optional[cst.BaseExpression]:
    node = found.node
    if isinstance(node, cst.Call):
        return _set_value(node, ctx.qualify(node.func))
    if isinstance(node, cst.BaseSmallStatement):
        return variable_write(ctx, node)
    return None


def _starts_a_child_after(ctx: FileContext, found: Assignment) -> bool:
    """Whether the write is for a child process: its function (or module) then starts one that inherits
    this environment (`os.system`, `subprocess.run` without `env=`, `ray.init`, a Ray actor's
    `.remote()`, a method of its class that does), which reads the variable afresh, and touches CUDA no
    more itself. A method whose every caller in its class does so after the call counts too
    (`self._set_devices()`, then `self._launch_server()`)."""
    if found.node in _analysis(ctx).followed_by_cuda:
        return False  # this process initialises CUDA after it: the write is for it too
    verdict = _child_after(ctx, _scope_body(ctx, found), found.statement)
    if verdict is not None or found.scope is None:
        return bool(verdict)
    cls = next((c for c in all_classes(ctx.module.body) if any(m is found.scope for m in block_body(c.body))), None)
    name = found.scope.name.value
    if cls is None or method_self(found.scope) is None:
        return False
    calls = [
        (method, node)
        for method in block_body(cls.body)
        if isinstance(method, cst.FunctionDef) and method_self(method) is not None
        for node in descendants(method)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == name
        and dotted(node.func.value) == method_self(method)
    ]
    if not calls or attribute_references(ctx).get(name, 0) != len(calls):
        return False  # called from elsewhere too, where no child may follow
    return all(_child_after(ctx, block_body(method.body), call) for method, call in calls)


def _child_after(ctx: FileContext, body: Body, start: cst.CSTNode) -> Optional[bool]:
    """After `start` in `body`: False where this process initialises CUDA, else True where it starts a
    child process that inherits the environment, else None."""
    analysis = _analysis(ctx)
    methods = _child_starting_methods(ctx)
    seen = child = False
    for node in _in_source_order(body):
        if node is start:
            seen = True
        elif seen and isinstance(node, cst.Call):
            qualified = ctx.qualify(node.func)
            if analysis._initialises_cuda(node, qualified, FlowState()):
                return False  # this process uses the devices too
            if _starts_inheriting_child(node, qualified):
                child = True
            elif isinstance(node.func, cst.Attribute) and (node.func.attr.value == "remote" or node.func.attr.value in methods):
                child = True
    return True if child else None


def _starts_inheriting_child(call: cst.Call, qualified: Optional[str]) -> bool:
    """A call that starts a child process with this process's environment (no `env=` of its own)."""
    return qualified in CHILD_STARTERS and not any(arg.keyword is not None and arg.keyword.value == "env" for arg in call.args)


def _child_starting_methods(ctx: FileContext) -> FrozenSet[str]:
    """Methods of the file's classes whose own body starts a child process that inherits the environment
    (`def _launch_server(self):`)."""

    def find() -> FrozenSet[str]:
        return frozenset(
            method.name.value
            for cls in all_classes(ctx.module.body)
            for method in block_body(cls.body)
            if isinstance(method, cst.FunctionDef)
            and method_self(method) is not None
            and any(
                isinstance(node, cst.Call) and _starts_inheriting_child(node, ctx.qualify(node.func))
                for node in _in_source_order(block_body(method.body))
            )
        )

    return ctx.memo("child-starting-methods", find)


def _in_source_order(body: Body) -> Iterator[cst.CSTNode]:
    """Every node of the statements, in source order, outside nested functions and classes."""
    stack: List[cst.CSTNode] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(reversed(child_nodes(node)))


TRIGGERS = re.compile(VARIABLE)


class CudaVisibleDevicesAfterCudaInit(Rule):
    """
    ## What it does
    Checks for writes to `CUDA_VISIBLE_DEVICES` (`os.environ[...] = ...`, `os.environ.update`,
    `os.environ.setdefault`, `os.putenv`) that execute after something in the same program flow has
    initialised CUDA: `torch.cuda.is_available()`, `set_device`, `current_device`,
    `get_device_name/properties/capability`, `synchronize`, a `torch.cuda.device(...)` context,
    `.cuda()`, `.to("cuda…")`, a tensor created with `device="cuda…"`, `nn.DataParallel(...)`, or
    `torch.cuda.device_count()`.

    Order is execution order: module-level statements in sequence, and a call to a function defined
    in the same file (including `if __name__ == "__main__": main()`) runs that function's body at the
    call. A CUDA call written earlier in the file inside a function that only runs later does not
    count.

    ## Why is this bad?
    The CUDA driver reads `CUDA_VISIBLE_DEVICES` once, when CUDA initialises. A later assignment is
    silently ignored: the process keeps seeing every GPU, so `cuda:0` may be a GPU another job is
    using, and `DataParallel` spreads over GPUs you meant to leave alone.
    `torch.cuda.device_count()` froze the value before torch 2.4 (pytorch#95073) and still does
    wherever NVML is unavailable.

    ## Example
    ```python
    import os
    import torch

    if torch.cuda.is_available():
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
    ```

    ## Use instead
    ```python
    import os

    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"

    import torch
    ```
    or set it in the launching shell: `CUDA_VISIBLE_DEVICES=0,1 python train.py`.

    ## Known problems
    Only calls the file makes itself are followed: a CUDA call inside another module's function, or
    a method called through an object, is not seen. CUDA counts as initialised only where it is on
    every path: after an `if` whose every branch initialises it, not after one branch, a loop body or
    a `try` body (DPL202 reports those as possibly too late). A write followed, in its function,
    by a child process that inherits the environment (`os.system`, `subprocess` without `env=`,
    `ray.init`, a Ray actor's `.remote()`, SGLang's server, a method of its class that starts one) and
    by no CUDA use of this process is taken as meant for that child, which reads the variable afresh,
    and is not reported; so is a method whose every caller in its class does that after calling it,
    and a write that puts back the value its function read before.
    """

    code = "DPL201"
    name = "cuda-visible-devices-after-cuda-init"
    summary = "`CUDA_VISIBLE_DEVICES` is set after CUDA was initialised, so it is silently ignored."
    triggers = TRIGGERS

    VALID = [
        Valid(
            """
            import os
            import subprocess
            import torch

            def launch(script):
                count = torch.cuda.device_count()
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(count // 2))
                subprocess.run(["python", script], check=True)  # the child reads it afresh
            """
        ),
        Valid(
            """
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
            import torch
            print(torch.cuda.is_available())
            """
        ),
        Valid(
            """
            import os
            import torch

            def report():
                print(torch.cuda.device_count())

            def main():
                os.environ["CUDA_VISIBLE_DEVICES"] = "1"  # DPL202, but nothing initialised CUDA yet
                report()

            main()
            """
        ),
        Valid(
            """
            import os
            import torch
            device = torch.device("cuda:0")  # a device object does not initialise CUDA
            torch.cuda.manual_seed_all(0)
            torch.backends.cudnn.benchmark = True
            os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
            """
        ),
        Valid(
            """
            import os
            import torch

            if args.gpu == "all":
                args.gpu = ",".join(str(i) for i in range(torch.cuda.device_count()))
            os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu  # DPL202: CUDA is initialised on one path only
            """
        ),
        Valid(
            """
            import os
            import torch
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            torch.cuda.set_device(0)  # runs after the assignment
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import os
            import torch
            use_cuda = torch.cuda.is_available()
            os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
            """,
            line=4,
        ),
        Invalid(
            """
            import os
            import torch

            def main(args):
                report_devices()  # written below, but it runs before the assignment
                os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus

            def report_devices():
                print(torch.cuda.get_device_name())

            if __name__ == "__main__":
                main(parse_args())
            """,
            line=6,
        ),
        Invalid(
            """
            import os
            import torch

            def setup():
                torch.cuda.set_device(0)

            def main():
                setup()
                os.environ.update({"CUDA_VISIBLE_DEVICES": "2,3"})

            if __name__ == "__main__":
                main()
            """,
            line=9,
        ),
        Invalid(
            """
            import os
            import torch
            n = torch.cuda.device_count()
            os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
            """,
            line=4,
        ),
        Invalid(
            """
            import os
            import torch
            device = torch.device("cuda")
            x = torch.zeros(3).to(device)
            os.putenv("CUDA_VISIBLE_DEVICES", "1")
            """,
            line=5,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for assignment in _assignments(ctx, self.code):
            cause = assignment.cause
            effect = "fixed the devices (torch < 2.4 or no NVML)" if cause.device_count else "initialised CUDA"
            yield Report(
                node=assignment.node,
                message=f"`{VARIABLE}` is set after {cause.describe(ctx)} {effect}.",
                help=f"Move this above {cause.text} (best: before `import torch`), or run `{VARIABLE}=0,1 python …`.",
                statement=assignment.statement,
            )


class CudaVisibleDevicesAfterTorchImport(Rule):
    """
    ## What it does
    Checks for writes to `CUDA_VISIBLE_DEVICES` that execute after `import torch` (or after importing
    a project or third-party module that imports torch) but before anything on the executed path has
    initialised CUDA.

    ## Why is this bad?
    It works today only because nothing has touched CUDA yet. The CUDA driver reads the variable once,
    at initialisation; the day an import or call moves above the assignment, or a library starts
    initialising CUDA when it is imported (several do), the assignment is silently ignored and the
    job runs on GPUs it was meant to leave alone. See DPL201 for the broken state.

    ## Example
    ```python
    import os
    import torch

    def main():
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
        model = build_model().cuda()
    ```

    ## Use instead
    ```python
    import os

    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"  # before anything imports torch

    import torch
    ```
    or set it in the launching shell: `CUDA_VISIBLE_DEVICES=0,1 python train.py`.

    ## Known problems
    Project modules count as importing torch when they import it (or a torch-based library) at module
    level, directly or through other linted modules; a module outside the linted paths is known only
    if it is a well-known torch-based library (torchvision, transformers, lightning, …). A write
    followed, in its function, by a child process that inherits the environment (`os.system`,
    `subprocess` without `env=`, `ray.init`, a Ray actor's `.remote()`, SGLang's server, a method of
    its class that starts one) and by no CUDA use of this process is meant for that child and is not
    reported; so is a method whose every caller in its class does that after calling it, and a write
    that puts back the value its function read before.
    """

    code = "DPL202"
    name = "cuda-visible-devices-after-torch-import"
    summary = "`CUDA_VISIBLE_DEVICES` is set after torch was imported; it breaks once anything initialises CUDA first."
    severity = "warning"
    triggers = TRIGGERS

    VALID = [
        Valid(
            """
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            import torch
            """
        ),
        Valid(
            """
            import os
            import numpy as np
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            """
        ),
        Valid(
            """
            import os
            import subprocess
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="1")
            subprocess.run(["python", "worker.py"], env=env)
            """
        ),
        Valid(
            """
            import os
            import ray
            import torch

            def start_engines(devices, count):
                saved = os.environ.get("CUDA_VISIBLE_DEVICES")
                os.environ["CUDA_VISIBLE_DEVICES"] = devices  # read by the Ray actors started below
                engines = [Engine.remote() for _ in range(count)]
                os.environ["CUDA_VISIBLE_DEVICES"] = saved  # the value it had, put back
                return engines
            """
        ),
        Valid(
            """
            import os
            import subprocess
            import torch

            class Rollout:
                def __init__(self, devices):
                    self._set_devices(devices)
                    self._launch_server()  # the child started here reads the variable afresh

                def _set_devices(self, devices):
                    os.environ["CUDA_VISIBLE_DEVICES"] = devices

                def _launch_server(self):
                    self.server = subprocess.Popen(["python", "-m", "server"])
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import os
            import torch
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            """,
            line=3,
        ),
        Invalid(
            """
            import os
            from torchvision import models

            def main(args):
                os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus
                model = models.resnet18()

            if __name__ == "__main__":
                main(parse_args())
            """,
            line=5,
        ),
        Invalid(
            """
            import os
            import torch.nn as nn
            os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
            """,
            line=3,
        ),
        Invalid(
            """
            import os
            import torch

            if args.gpu == "all":
                args.gpu = ",".join(str(i) for i in range(torch.cuda.device_count()))
            os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu  # too late on the "all" path only
            """,
            line=6,
        ),
        Invalid(
            """
            import os
            import subprocess
            import torch

            class Rollout:
                def __init__(self, devices):
                    self._set_devices(devices)
                    self.model = load_model().cuda()  # this process uses the devices too
                    self._launch_server()

                def _set_devices(self, devices):
                    os.environ["CUDA_VISIBLE_DEVICES"] = devices

                def _launch_server(self):
                    self.server = subprocess.Popen(["python", "-m", "server"])
            """,
            line=12,
        ),
        Invalid(
            """
            import os
            import subprocess
            import torch

            class Rollout:
                def __init__(self, devices, env):
                    self._set_devices(devices)
                    self._launch_server(env)

                def _set_devices(self, devices):
                    os.environ["CUDA_VISIBLE_DEVICES"] = devices

                def _launch_server(self, env):
                    subprocess.run(["python", "-m", "server"], env=env)  # its own environment, not this one
            """,
            line=11,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for assignment in _assignments(ctx, self.code):
            cause = assignment.cause
            yield Report(
                node=assignment.node,
                message=f"`{VARIABLE}` may be set too late, after {cause.describe(ctx)}.",
                help=f"Move this above {cause.text}, or run `{VARIABLE}=0,1 python …`.",
                statement=assignment.statement,
            )
