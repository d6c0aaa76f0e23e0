"""What the project's checkpoint files hold, followed from the code that writes them to the code that reads them.

A file is known by the literal name its path ends in: `os.path.join(run_dir, "model_args.pth")`,
`f"{ckpt_dir}/consolidated.pth"`, `"{0}/nan.batch".format(model_dir)`, `ckpt_dir / CONSOLIDATED` with
`CONSOLIDATED = "consolidated.pth"`, a variable the function assigns one of these, or the file object of
`with open(path, "wb") as f:`. A path whose name is computed (`f"epoch_{n}.pth"`) names no file.

What a write holds is built on the CPU where it is an argparse `Namespace` (`torch.save(args, ...)`),
numbers and strings, a tensor moved there (`x.cpu()`, `{k: v.cpu() for ...}`), a model's `state_dict()`
after the model was moved there (`net.cpu()`), the random number generators' states, or a file that
`dcp_to_torch_save` writes (it builds every tensor on the CPU). Anything else may hold CUDA tensors.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

SAVE = "torch.save"
LOAD = "torch.load"
_DCP_TO_TORCH_SAVE = frozenset({"torch.distributed.checkpoint.format_utils.dcp_to_torch_save"})
# States that are CPU tensors (or plain Python objects) whatever device the model is on.
_CPU_STATES = frozenset(
    {
        "torch.get_rng_state", "torch.random.get_rng_state", "torch.cuda.get_rng_state", "torch.cuda.get_rng_state_all",
        "torch.cuda.random.get_rng_state", "torch.cuda.random.get_rng_state_all", "numpy.random.get_state", "random.getstate",
        "argparse.Namespace",
    }
)  # fmt: skip
_PATH_JOINS = frozenset({"os.path.join", "posixpath.join", "ntpath.join"})
_PATH_CLASSES = frozenset({"pathlib.Path", "pathlib.PurePath", "pathlib.PosixPath", "str", "os.fspath"})
# Methods whose result is on the CPU, or no tensor at all.
_ON_CPU = frozenset({"cpu", "numpy", "tolist", "item", "parse_args", "parse_known_args"})
# Methods that keep a tensor where it is.
_IN_PLACE = frozenset({"detach", "clone", "contiguous", "float", "half", "double", "bfloat16", "int", "long", "squeeze", "unsqueeze", "view", "reshape"})
_MOVES = frozenset({"cuda", "to"})
_FILE_NAME = re.compile(r"[\w.+-]*\w\.\w+")
# A call that may write or read a checkpoint file (`torch.save(`, `load(`, `dcp_to_torch_save(`): one
# pattern each, since a literal start is what lets the regex engine skip ahead.
_IO_CALLS = (re.compile(r"save[ \t]*\("), re.compile(r"load[ \t]*\("))


@dataclass(frozen=True)
class SavedFiles:
    """The checkpoint files one module writes and reads, by name."""

    writes: Tuple[Tuple[str, bool], ...] = ()  # (file name, what is written holds no CUDA tensor)
    reads: Tuple[Tuple[int, str], ...] = ()  # (line of a `torch.load`, file name)
    # Its module-level names that hold a file name (`CONSOLIDATED = "consolidated.pth"`), which other
    # modules import: a name above may be `=<qualified name>`, one of these in another module.
    names: Tuple[Tuple[str, str], ...] = ()


def io_call_lines(text: str) -> List[int]:
    """The lines of the text that may call `torch.save`, `torch.load` or `dcp_to_torch_save`."""
    starts = sorted(match.start() for pattern in _IO_CALLS for match in pattern.finditer(text))
    lines, line, counted = [], 1, 0
    for start in starts:
        line += text.count("\n", counted, start)
        counted = start
        lines.append(line)
    return lines


def scan_saved_files(tree: ast.Module, qualifier: Callable[[], Callable[[ast.AST], Optional[str]]], calls: Sequence[int]) -> SavedFiles:
    """The files the module writes and reads through calls on the lines `calls` (`io_call_lines`), and
    the file names its top level holds (`NAME = "consolidated.pth"`, assigned once). `qualifier()` gives
    the function that qualifies a name through the module's imports (made only where a call needs it;
    `torch.save` needs none, an alias such as `from torch import save` one at the module's top level)."""
    assigned: Dict[str, List[ast.AST]] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(statement.value)
    names = []
    for name, values in assigned.items():
        value = values[0]
        if len(values) == 1 and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found = _literal_file_name(value.value, whole=True)
            if found is not None:
                names.append((name, found))
    if not calls:
        return SavedFiles(names=tuple(sorted(names)))
    qualify = qualifier()
    constants = _Lazy(lambda: _Assignments(tree.body, None))
    writes: List[Tuple[str, bool]] = []
    reads: List[Tuple[int, str]] = []
    scopes: Dict[int, _Scope] = {}
    parsed_options = _ParsedOptions(tree)
    for function, call in _file_calls(tree, calls):
        called = qualify(call.func)
        if called not in (SAVE, LOAD) and called not in _DCP_TO_TORCH_SAVE:
            continue
        if id(function) not in scopes:
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = function.args
                parameters = tuple(a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs))
                body = function.body
                scopes[id(function)] = _Scope(_Lazy(lambda body=body: _Assignments(body, constants.value)), parameters, parsed_options, qualify)
            else:
                scopes[id(function)] = _Scope(constants, (), parsed_options, qualify)
        scope = scopes[id(function)]
        if called == LOAD:
            name = scope.file_name(call.args[0], whole=True) if call.args else None
            if name is not None:
                reads.append((call.lineno, name))
        elif len(call.args) >= 2:
            name = scope.file_name(call.args[1], whole=True)
            if name is not None:
                writes.append((name, called != SAVE or scope.on_cpu(call.args[0], call.lineno)))
    return SavedFiles(tuple(sorted(set(writes))), tuple(sorted(set(reads))), tuple(sorted(names)))


def _literal_file_name(text: str, whole: bool) -> Optional[str]:
    """The file name a path literal ends in; a tail (`whole` false) names one only after a `/`."""
    if not whole and "/" not in text:
        return None
    name = text.rpartition("/")[2]
    return name if _FILE_NAME.fullmatch(name) else None


def _file_calls(tree: ast.Module, lines: Sequence[int]) -> Iterator[Tuple[Optional[ast.AST], ast.Call]]:
    """Each call on one of the lines, with the function whose own code holds it (None: the module's top
    level): found by descending to the statement that holds the line, not by walking the whole tree."""
    for line in sorted(set(lines)):
        function: Optional[ast.AST] = None
        body: Sequence[ast.stmt] = tree.body
        holder: Optional[ast.AST] = None
        while holder is None:
            statement = next((s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
            if statement is None:
                break
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function = statement
            blocks = [getattr(statement, name, None) or [] for name in ("body", "orelse", "finalbody")]
            blocks += [part.body for part in (*getattr(statement, "handlers", ()), *getattr(statement, "cases", ()))]
            inner = [child for block in blocks for child in block if isinstance(child, ast.stmt)]
            if inner and any(child.lineno <= line <= (child.end_lineno or child.lineno) for child in inner):
                body = inner
            else:
                holder = statement
        if holder is None or isinstance(holder, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # a blank line, or a definition's own line (its decorators, its defaults)
        for node in _own_nodes([holder]):
            if isinstance(node, ast.Call) and node.lineno == line:
                yield function, node


def _own_nodes(body: Sequence[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes of a body, not those of the functions and classes it defines."""
    pending: List[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


def _calls(body: Sequence[ast.stmt]) -> List[ast.Call]:
    return sorted((node for node in _own_nodes(body) if isinstance(node, ast.Call)), key=lambda call: (call.lineno, call.col_offset))


class _Assignments:
    """The values a body assigns to each plain name (`x = ...`, `with open(...) as x:`), with their lines."""

    def __init__(self, body: Sequence[ast.stmt], outer: Optional["_Assignments"]) -> None:
        self.body = body
        self.outer = outer
        self.values: Dict[str, List[Tuple[int, ast.AST]]] = {}
        self.others: set = set()  # names bound otherwise (loops, unpacking, augmented): values unknown
        for node in _own_nodes(body):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.values.setdefault(target.id, []).append((node.lineno, node.value))
                    else:
                        self.others.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
                self.values.setdefault(node.optional_vars.id, []).append((node.context_expr.lineno, node.context_expr))
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
                target = node.target
                self.others.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))

    def single(self, name: str) -> Optional[ast.AST]:
        """The one value the name is assigned here, else (where nothing here binds it) the outer one."""
        if name in self.others:
            return None
        assigned = self.values.get(name)
        if assigned is None:
            return self.outer.single(name) if self.outer is not None else None
        return assigned[0][1] if len(assigned) == 1 else None

    def last(self, name: str, line: int) -> Optional[ast.AST]:
        """The value of the name's last assignment above the line (`with open(path) as f:` each time round),
        else the one value the body or the module gives it."""
        if name in self.others:
            return None
        above = self.before(name, line)
        return above[-1] if above else self.single(name)

    def before(self, name: str, line: int) -> List[ast.AST]:
        """The values assigned to the name on earlier lines of the body."""
        return [value for at, value in sorted(self.values.get(name, ()), key=lambda assigned: assigned[0]) if at < line]


class _Lazy:
    """A value computed the first time it is read: most paths are literals, whose scope's names are never needed."""

    def __init__(self, compute: Callable[[], "_Assignments"]) -> None:
        self._compute = compute
        self._value: Optional["_Assignments"] = None

    @property
    def value(self) -> "_Assignments":
        if self._value is None:
            self._value = self._compute()
        return self._value


class _ParsedOptions:
    """The names a module assigns only the options a parser parsed (`args = parser.parse_args()`), read
    from the whole module the first time a save of a parameter asks."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self._names: Optional[frozenset] = None

    def __contains__(self, name: str) -> bool:
        if self._names is None:
            found: Dict[str, bool] = {}
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            value = node.value
                            parsed = isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "parse_args"
                            found[target.id] = found.get(target.id, True) and parsed
            self._names = frozenset(name for name, parsed in found.items() if parsed)
        return name in self._names


class _Scope:
    """A function (or the module's top level) holding saves and loads: what its names hold."""

    def __init__(self, assignments: _Lazy, parameters: Tuple[str, ...], parsed_options, qualify) -> None:
        self._assignments = assignments
        self.parameters = parameters
        self.parsed_options = parsed_options
        self.qualify = qualify

    @property
    def assignments(self) -> _Assignments:
        return self._assignments.value

    def file_name(self, expr: ast.AST, whole: bool, depth: int = 0, line: Optional[int] = None) -> Optional[str]:
        """The literal file name the path (at the line) ends in; `whole`: the expression is the whole name
        (not a tail). A name is what its last assignment above the line gave it."""
        if depth > 4:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return _literal_file_name(expr.value, whole)
        if isinstance(expr, ast.JoinedStr) and expr.values:
            last = expr.values[-1]
            return self.file_name(last, whole and len(expr.values) == 1, depth + 1) if isinstance(last, ast.Constant) else None
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Div, ast.Add)):
            return self.file_name(expr.right, isinstance(expr.op, ast.Div), depth + 1)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            value = self.assignments.last(expr.id, line if line is not None else expr.lineno) if isinstance(expr, ast.Name) else None
            if value is not None:
                return self.file_name(value, whole, depth + 1)
            # `from .checkpoint import CONSOLIDATED`: a name of another module, through the file's imports
            imported = self.qualify(expr)
            return f"={imported}" if whole and imported and "." in imported and imported != ast.unparse(expr) else None
        if isinstance(expr, ast.Call):
            called = self.qualify(expr.func) or ""
            if called in _PATH_JOINS and expr.args and not expr.keywords:
                return self.file_name(expr.args[-1], True, depth + 1)
            opens = called == "open" or (isinstance(expr.func, ast.Attribute) and expr.func.attr == "open")  # `fs.open(path)` too
            if (called in _PATH_CLASSES or opens) and expr.args:
                return self.file_name(expr.args[0], whole, depth + 1)
            if isinstance(expr.func, ast.Attribute) and expr.func.attr == "format" and isinstance(expr.func.value, ast.Constant):
                return self.file_name(expr.func.value, False, depth + 1)
        return None

    def on_cpu(self, expr: ast.AST, line: int, depth: int = 0) -> bool:
        """Whether what the expression holds at the line is known to hold no CUDA tensor."""
        if depth > 4:
            return False
        if isinstance(expr, ast.Constant):
            return True
        if isinstance(expr, ast.IfExp):
            return self.on_cpu(expr.body, line, depth + 1) and self.on_cpu(expr.orelse, line, depth + 1)
        if isinstance(expr, (ast.Dict, ast.List, ast.Tuple, ast.Set)):
            items = expr.values if isinstance(expr, ast.Dict) else expr.elts
            return all(self.on_cpu(item.value if isinstance(item, ast.Starred) else item, line, depth + 1) for item in items)
        if isinstance(expr, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self.on_cpu(expr.elt, line, depth + 1)
        if isinstance(expr, ast.DictComp):
            return self.on_cpu(expr.value, line, depth + 1)
        if isinstance(expr, ast.Name):
            if expr.id in self.parameters:
                return expr.id in self.parsed_options  # `main(args)` of a module whose `args` are parsed options
            values = self.assignments.before(expr.id, line)
            return bool(values) and expr.id not in self.assignments.others and all(self.on_cpu(value, line, depth + 1) for value in values)
        if isinstance(expr, ast.Call):
            if (self.qualify(expr.func) or "") in _CPU_STATES:
                return True
            return self._call_on_cpu(expr, line, depth)
        return False

    def _call_on_cpu(self, call: ast.Call, line: int, depth: int) -> bool:
        """`x.detach().cpu()`, `net.cpu().state_dict()`, `net.state_dict()` after `net.cpu()`."""
        node: ast.AST = call
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in _ON_CPU:
                return True
            if method in _MOVES:
                return False
            if method == "state_dict":
                return self._moved_to_cpu(node.func.value, line)
            if method not in _IN_PLACE:
                return False
            node = node.func.value
        return False

    def _moved_to_cpu(self, model: ast.AST, line: int) -> bool:
        """Whether the last statement before the line that moves the model (or the object holding it:
        `net` of `net.module`) moves it to the CPU."""
        while isinstance(model, ast.Attribute) and model.attr == "module":
            model = model.value
        if isinstance(model, ast.Call) and isinstance(model.func, ast.Attribute) and model.func.attr == "cpu":
            return True
        target = ast.dump(model)
        last: Optional[str] = None
        for node in _calls(self.assignments.body):
            if node.lineno < line and isinstance(node.func, ast.Attribute) and node.func.attr in ("cpu", *_MOVES):
                if ast.dump(node.func.value) == target:
                    last = node.func.attr
        return last == "cpu"
