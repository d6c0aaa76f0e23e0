"""Project-level facts, collected from every linted file before any rule runs.

Some pitfalls span files: `train.py` wraps in DataParallel the class that `models/crnn.py` defines,
and `import models` imports torch when `models/__init__.py` does. The first pass reads each file
cheaply (a regex for imports, Python's own `ast` only where DataParallel or `forward` appears) and
the facts are merged into one `ProjectFacts` that the rules of the second pass consult.
"""

from __future__ import annotations

import ast
import bisect
import builtins
import hashlib
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cache, cached_property, partial
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from dplint.analysis import tensor_api
from dplint.analysis.modules import ModuleIndex, absolute_module
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.saved_files import SavedFiles, io_call_lines, scan_saved_files
from dplint.analysis.torch_api import ATTRIBUTE_WRAPPERS, DATA_PARALLEL, DISTRIBUTED_DATA_PARALLEL, call_returns_tensor

if TYPE_CHECKING:
    from dplint.analysis.execution import ExecutionModel, ExecutionSummary

# Third-party packages that import torch when imported; importing one counts as importing torch.
TORCH_LIBRARIES = frozenset(
    """torch torchvision torchaudio torchtext torchdata torchmetrics pytorch_lightning lightning
    lightning_fabric accelerate timm deepspeed torch_geometric torch_scatter torch_sparse fairseq
    detectron2 mmcv mmdet mmengine apex diffusers peft transformers sentence_transformers kornia
    monai fastai ignite xformers flash_attn vllm bitsandbytes ultralytics trl dgl""".split()
)

# `data_parallel(module, inputs, device_ids, output_device, dim=0)`: one wrapped call, scattered and gathered alike.
FUNCTIONAL_DATA_PARALLEL = frozenset({"torch.nn.parallel.data_parallel", "torch.nn.parallel.data_parallel.data_parallel"})
# Methods that return the module they are called on, so `DataParallel(Net().cuda())` still wraps a Net.
MODULE_RETURNING_METHODS = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval"})

# Searched in "\n" + text, like the patterns below that open with a newline: the regex engine jumps between lines.
_IMPORT_LINE = re.compile(
    r"\n(?:import[ \t]+(?P<names>[\w. \t,]+)|from[ \t]+(?P<dots>\.*)(?P<module>[\w.]*)[ \t]+import[ \t]+\(?(?P<imported>[\w. \t,]*))"
)
# The same, indented: imports inside a function (`def main(): from pkg import distrib`).
_INDENTED_IMPORT_LINE = re.compile(
    r"\n[ \t]+(?:import[ \t]+(?P<names>[\w. \t,]+)|from[ \t]+(?P<dots>\.*)(?P<module>[\w.]*)[ \t]+import[ \t]+\(?(?P<imported>[\w. \t,]*))"
)


def is_torch_module(name: str) -> bool:
    return name.split(".")[0] in TORCH_LIBRARIES


def _may_be_project(module: str) -> bool:
    """Whether an imported module may be one of the project's: neither torch's nor the standard library's."""
    return bool(module) and not is_torch_module(module) and module.split(".")[0] not in sys.stdlib_module_names


@dataclass(frozen=True)
class Wrap:
    """`nn.DataParallel(ClassName(...), dim=dim)` at path:line (dim None when not a literal), or a
    `DistributedDataParallel(ClassName(...))` (`distributed`: its `forward` runs once per rank, on the
    rank's own GPU, and nothing is scattered or gathered)."""

    class_name: str
    dim: Optional[int]
    path: str
    line: int
    # The module the wrapping file takes the class from ("" for a class of the wrapping file itself;
    # None: not resolvable from the text, e.g. a star import), and the wrapping file.
    module: Optional[str] = None
    filename: str = ""
    # The project file that defines the wrapped class, found by `ProjectFacts.build` the way Python
    # would import it; None when that is unknown.
    defined_in: Optional[str] = None
    distributed: bool = False
    # Whether the wrapping file takes the mean (or sum) of what a call returned before using it
    # (`loss = loss.mean()`): how DataParallel's callers turn the per-GPU values it gathers back into one.
    output_reduced: bool = False

    def can_mean(self, module_name: str, filename: str) -> bool:
        """Whether the wrapped class can be the one of that name defined in `filename`.

        A wrap whose module resolves to no project file (an outside package, or a same-named module of
        a sibling program) means no class of this project.
        """
        if self.module is None:
            return True
        return self.defined_in == filename


@dataclass(frozen=True)
class AttributeWrap:
    """`self.<attribute> = DataParallel(...)` (or DDP) in a method of `class_name`, at path:line, under
    the branch conditions (source text, which branch) that lead there."""

    class_name: str
    attribute: str
    wrapper: str
    path: str
    line: int
    conditions: Tuple[Tuple[str, bool], ...] = ()
    method: str = ""
    # Whether the method can return with the wrapper still there (no `self.model = self.model.module`
    # after it, under the same conditions), and the methods it calls on `self` while it holds it.
    leaves: bool = True
    during: Tuple[str, ...] = ()
    # For a wrap in `__init__`: its parameters that the conditions test for truth, with the truth each
    # must have for the wrap to run (`if is_inference:` → `("is_inference", True)`); a subclass that
    # passes the base a constant for one of them may rule the wrap out.
    parameter_tests: Tuple[Tuple[str, bool], ...] = ()

    def ruled_out_by(self, literals: Mapping[str, object]) -> bool:
        """Whether these constants, passed for the method's parameters, make a condition of the wrap fail."""
        return any(name in literals and bool(literals[name]) != holds for name, holds in self.parameter_tests)


@dataclass(frozen=True)
class ReturnedWrap:
    """A top-level `def function(...)` that returns a DataParallel/DDP wrapper (on some path): the
    wrap at path:line, under the branch conditions that lead there."""

    function: str
    wrapper: str
    path: str
    line: int
    conditions: Tuple[Tuple[str, bool], ...] = ()


@dataclass(frozen=True)
class CheckpointLoad:
    """`model.load_state_dict(...)` in a function that reads a checkpoint file, at path:line. `model`: the
    class (or the function) the model it loads into is built by ("" unknown); `into_wrapper`: the model is a DataParallel/DDP wrapper
    there on every path (wrapped before it, unconditionally); `handles_prefix`: the function strips the
    `module.` prefix, or retries after wrapping, so either kind of checkpoint loads."""

    path: str
    line: int
    model: str
    into_wrapper: bool
    handles_prefix: bool
    # The functions the loaded state passes through (`load_state_dict(remove_prefix(state))`), by name:
    # one of the project's that strips the prefix copes too.
    through: Tuple[str, ...] = ()


# Which argument of a call (a position, or a keyword's name) receives a wrapper, which wrapper, and
# the line and branch conditions of its wrap in the calling file.
WrappedSlot = Tuple[Union[int, str], str, int, Tuple[Tuple[str, bool], ...]]
# Which argument receives a tensor, and the project names (`utils.make_anchors()`, `config.priors`)
# that must hold or return tensors for it to be one (none: a torch call shows it alone).
TensorSlot = Tuple[Union[int, str], Tuple[str, ...]]


@dataclass(frozen=True)
class ProjectCall:
    """A call of a function or class that may be the project's, passing it a DataParallel/DDP wrapper
    (`train(nn.DataParallel(net), loader)`, `engine.train(model)` after `model = DDP(model)`) or a
    tensor (`Loss(anchors)` after `anchors = make_anchors()`): the callee as the calling file names it
    (`engine.train`, or `train` for its own), at path:line."""

    function: str
    path: str
    line: int
    slots: Tuple[WrappedSlot, ...] = ()
    tensors: Tuple[TensorSlot, ...] = ()
    # How many positional arguments the call passes and the names of its keywords; None when a
    # `*args` or `**kwargs` hides which parameters it gives.
    passed: Optional[Tuple[int, Tuple[str, ...]]] = None


@dataclass(frozen=True)
class ParallelHelper:
    """A top-level function that hands two of its parameters, unchanged, to the functional
    `torch.nn.parallel.data_parallel` as the module and its input (`def data_parallel(model, input,
    ngpu): ... nn.parallel.data_parallel(model, input, range(ngpu))`): each parameter's position and
    name, the dim it scatters along (None: not a literal), and the line of that call."""

    function: str
    module: Tuple[int, str]
    inputs: Tuple[int, str]
    dim: Optional[int]
    path: str
    line: int


@dataclass(frozen=True)
class ClassInfo:
    name: str
    bases: Tuple[str, ...]
    defines_forward: bool
    # The literal keywords its `__init__` passes to its base's (`super().__init__(is_inference=False)`):
    # the base's `__init__` runs with them bound, whatever their defaults.
    base_init_literals: Tuple[Tuple[str, object], ...] = ()


@dataclass(frozen=True)
class FileFacts:
    module_name: str
    filename: str = ""
    imports: Tuple[str, ...] = ()
    classes: Tuple[ClassInfo, ...] = ()
    wraps: Tuple[Wrap, ...] = ()
    # This module's names that hold a tensor (`priors`) or return one when called (`make_priors()`),
    # each with the project calls that must return a tensor for it to hold.
    tensor_values: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    distributed: Optional["DistributedFileFacts"] = None
    attribute_wraps: Tuple[AttributeWrap, ...] = ()
    returned_wraps: Tuple[ReturnedWrap, ...] = ()
    # The calls that pass a wrapper or a tensor to a function or class that may be the project's.
    project_calls: Tuple[ProjectCall, ...] = ()
    # The names of functions and classes (as qualified above; `module.*` for a star import) this file
    # uses other than in `project_calls`; None where the file was not read for them (it wraps
    # nothing, and does not name torch or is a torch library's own module).
    other_references: Optional[Tuple[str, ...]] = None
    # For a file not read for calls: the modules its functions import (`def main(): from loss import
    # Loss`), which may use a project function in a way nobody read.
    nested_imports: Tuple[str, ...] = ()
    parallel_helpers: Tuple[ParallelHelper, ...] = ()
    # Its functions, calls and assignments, for where each statement of a distributed program runs.
    # Left out of `repr`: the project's digest takes it apart (see `ProjectFacts.digest_for`).
    execution: Optional[ExecutionSummary] = field(default=None, repr=False)
    # Whether CPython parses it, as far as this pass parsed it (None: it did not need to).
    parses: Optional[bool] = None
    checkpoint_loads: Tuple[CheckpointLoad, ...] = ()
    # Its functions that strip the `module.` prefix from a state dict (by name).
    prefix_helpers: Tuple[str, ...] = ()
    # The names of the folders it puts on `sys.path` (`sys.path.insert(0, "subtools/pytorch")`: `pytorch`).
    sys_path_names: Tuple[str, ...] = ()
    # Attributes its classes name `module` or `*module` (`self.submodule = ...`): a state dict key holds
    # `module.` further in, which a `replace("module.", "")` rewrites.
    module_attributes: Tuple[str, ...] = ()
    # The checkpoint files it writes and reads, by name, and whether what it writes holds CUDA tensors.
    saved_files: SavedFiles = SavedFiles()

    @property
    def imports_torch_directly(self) -> bool:
        return any(is_torch_module(name) for name in self.imports)

    @property
    def class_names(self) -> Tuple[str, ...]:
        return tuple(info.name for info in self.classes)


def _reduces_call_results(tree: ast.Module) -> bool:
    """Whether the file, read in line order, reduces a value a call returned, by name, before using it:
    `loss, logits = model(x, y)` (or `outputs = model(x)`; `loss = outputs[0]`) then `loss = loss.mean()`.
    One pass over the whole file: a function's own assignments are among them, in the same order."""
    from_calls: Set[str] = set()
    for assignment in sorted((node for node in ast.walk(tree) if isinstance(node, ast.Assign)), key=lambda node: node.lineno):
        value = assignment.value
        names = [element.id for target in assignment.targets for element in ast.walk(target) if isinstance(element, ast.Name)]
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in ("mean", "sum")
            and not value.args
            and isinstance(value.func.value, ast.Name)
            and value.func.value.id in from_calls
            and names == [value.func.value.id]
        ):
            return True
        base = value
        while isinstance(base, (ast.Subscript, ast.Attribute)):
            base = base.value
        if isinstance(value, ast.Call) or (isinstance(base, ast.Name) and base.id in from_calls and base is not value):
            from_calls.update(names)
    return False


def module_identity(path: "os.PathLike[str] | str", packages: Optional[Dict[str, str]] = None) -> Tuple[str, str]:
    """The dotted module name of a file, and the package its relative imports start from.

    `packages` remembers each folder's dotted package name, for a run that names thousands of files.
    """
    packages = {} if packages is None else packages
    directory, base = os.path.split(os.fspath(path))
    stem = os.path.splitext(base)[0]
    package = _package_name(directory, packages)
    if stem == "__init__":
        return package or stem, package or stem
    return (f"{package}.{stem}" if package else stem), package


def _package_name(directory: str, names: Dict[str, str]) -> str:
    """`a.b` for a folder `a/b` where both hold an `__init__.py`; "" for a folder that is no package."""
    if directory not in names:
        if os.path.isfile(os.path.join(directory, "__init__.py")):
            parent, folder = os.path.split(directory)
            outer = _package_name(parent, names) if parent != directory else ""
            names[directory] = f"{outer}.{folder}" if outer else folder
        else:
            names[directory] = ""
    return names[directory]


def scan_imports(text: str, package: str, pattern: "re.Pattern[str]" = _IMPORT_LINE, submodules: bool = False) -> Tuple[str, ...]:
    """Modules imported by unindented (module-level) import statements (by `pattern`); with `submodules`,
    `from pkg import name` also names `pkg.name`, in case it is a module."""
    found: List[str] = []
    for match in pattern.finditer("\n" + text):
        if match.group("names") is not None:
            for item in match.group("names").split(","):
                words = item.split()
                if words:
                    found.append(words[0])
            continue
        base = absolute_module(package, len(match.group("dots")), match.group("module"))
        if base:
            found.append(base)
        if match.group("dots") or not match.group("module") or submodules:
            # `from . import crnn` imports the submodule `pkg.crnn`.
            for item in match.group("imported").split(","):
                words = item.split()
                if words:
                    found.append(f"{base}.{words[0]}" if base else words[0])
    return tuple(dict.fromkeys(found))


def collect_file_facts(text: str, module_name: str, package: str, path: str, filename: str) -> FileFacts:
    """The facts of one file: `path` as it is shown, `filename` absolute."""
    imports = scan_imports(text, package, submodules=True)
    tensor_values = scan_tensor_values(text, module_name, package)
    parse = cache(partial(_parse, text))
    # A torch library's own module starts no program's group, reads no `--local_rank` and takes no part in
    # a program's calls: its functions are called from outside (nor is it parsed for that: most of the
    # cost of linting torch's sources).
    library = is_torch_module(module_name)
    distributed = scan_distributed(text, _unparsed if library else parse)
    # A stub (`.pyi`) declares, it runs nothing.
    execution = None if library or filename.endswith(".pyi") else _execution_summary(text, module_name, package, parse)
    # Nor does it load a project's checkpoints, or build a project's models.
    loads, prefix_helpers = ((), ()) if library else scan_checkpoint_loads(text, path, parse)
    module_attributes = () if library else _module_attributes(text, parse)
    saved_files = SavedFiles() if library else _saved_files(text, package, parse)
    sys_path_names = _sys_path_names(text)
    parses = parse() is not None if parse.cache_info().currsize else None  # type: ignore[attr-defined]
    if distributed is not None and (distributed.entry or distributed.run_calls):
        # A script's own imports made inside its functions belong to its program too.
        distributed = replace(distributed, lazy_imports=scan_imports(text, package, _INDENTED_IMPORT_LINE, submodules=True))
    # Classes are read wherever one may subclass a base trainer that wraps `self.<attr>` (`class X(Base):`).
    read_classes = "DataParallel" in text or "data_parallel" in text or "def forward" in text or _SUBCLASS.search(text)
    classes = scan_classes(text) if read_classes else ()
    wrapping = bool(read_classes) and _WRAPPER_CALL_OR_ALIAS.search(text) is not None
    # A file that may pass a tensor to a function of another of the project's modules is read for its
    # calls: one that names torch and imports some module neither torch's nor the standard library's.
    # A torch library's own module never is: its functions are called from outside.
    tensors = "torch" in text and not is_torch_module(module_name) and any(_may_be_project(module) for module in imports)

    def unread() -> FileFacts:
        # The modules its functions import, unless it is a torch library's own module (which calls no
        # function of a project that imports it).
        nested = "import" in text and not is_torch_module(module_name)
        return FileFacts(
            module_name,
            filename,
            imports,
            classes,
            tensor_values=tensor_values,
            distributed=distributed,
            nested_imports=scan_imports(text, package, _INDENTED_IMPORT_LINE, submodules=True) if nested else (),
            execution=execution,
            checkpoint_loads=loads,
            prefix_helpers=prefix_helpers,
            module_attributes=module_attributes,
            sys_path_names=sys_path_names,
            parses=parses,
            saved_files=saved_files,
        )

    if not (wrapping or tensors):
        return unread()
    tree = parse()
    if tree is None:
        return unread()
    try:
        if wrapping:
            visitor = _WrapVisitor(path, filename, module_name, package, {info.name for info in classes})
            visitor.visit(tree)
            names: _Names = visitor
            wraps, helpers = tuple(visitor.wraps), scan_parallel_helpers(tree, visitor.qualify, path)
            if wraps and _reduces_call_results(tree):
                wraps = tuple(replace(wrap, output_reduced=True) for wrap in wraps)
            attribute_wraps = scan_attribute_wraps(tree, text, visitor.qualify, path)
            returned_wraps = scan_returned_wraps(tree, text, visitor.qualify, path)
        else:
            names = _Names.of(tree, package)
            wraps, helpers, attribute_wraps, returned_wraps = (), (), (), ()
        evidence = _ArgumentEvidence(tree, names.aliases, module_name, _ScopeBindings(package)) if tensors else None
        project_calls, other_references = scan_project_calls(tree, text, names, path, evidence, wrapping)
    except RecursionError:  # the file's own check reports it as DPL000 "too deeply nested"
        return unread()
    return FileFacts(
        module_name,
        filename,
        imports,
        classes,
        wraps,
        tensor_values,
        distributed,
        attribute_wraps,
        returned_wraps,
        project_calls,
        other_references,
        parallel_helpers=helpers,
        execution=execution,
        checkpoint_loads=loads,
        prefix_helpers=prefix_helpers,
        module_attributes=module_attributes,
        sys_path_names=sys_path_names,
        parses=parses,
        saved_files=saved_files,
    )

# A wrap is a call of `DataParallel`/`data_parallel` (or `DistributedDataParallel`), by name or by an
# alias that an import gives it: without one of these, a file that names them (in docs) has no wrap.
_WRAPPER_CALL_OR_ALIAS = GuardedPattern(
    r"(?:DataParallel|data_parallel)\s*\(|(?:DataParallel|data_parallel)\s+as\b", ["DataParallel", "data_parallel"]
)

# Patterns that start with a newline let the regex engine jump between lines; the text gets one in front.
_TOP_LEVEL_DEF = re.compile(r"\ndef[ \t]+(\w+)[ \t]*\(")
_TOP_LEVEL_CALL_ASSIGNMENT = re.compile(r"\n(\w+)[ \t]*=[ \t]*([A-Za-z_][\w.]*[ \t]*\(.*)")
_BLOCK_END = re.compile(r"\n(?=[^\s#])")
_SIGNATURE_END = re.compile(r":[ \t]*(?:#[^\n]*)?\n")
_RETURN = re.compile(r"\n([ \t]+)return\b(.*)")
_LOCAL_ASSIGNMENT = re.compile(r"\n[ \t]+(\w+)[ \t]*=(?!=)[ \t]*(.*)")
_OTHER_BINDING = re.compile(r"\bfor[ \t]+([\w \t,()]+?)[ \t]+in\b|\bas[ \t]+(\w+)|(\w+)[ \t]*:=|\n[ \t]+([\w \t]*,[\w \t,]*)=(?!=)")
_WORD = re.compile(r"\w+")


def scan_tensor_values(text: str, module_name: str, package: str) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """Top-level functions whose every `return` gives a tensor, and top-level names assigned a call of one.

    Read from the text: each `return` line and the assignments of the name it returns are parsed on
    their own. A torch library's names are its API, never the project's, so its files are skipped.
    """
    if is_torch_module(module_name):
        return ()
    text = "\n" + text
    functions = set(_TOP_LEVEL_DEF.findall(text)) if "return" in text and "torch" in text else set()
    assignments = _TOP_LEVEL_CALL_ASSIGNMENT.findall(text)
    if not functions and not assignments:
        return ()
    found: List[Tuple[str, Tuple[str, ...]]] = []
    evidence = _TensorEvidence(_import_aliases(text, package), module_name, functions)
    if functions:
        for match in _TOP_LEVEL_DEF.finditer(text):
            deps = evidence.function(text, match)
            if deps is not None:
                found.append((f"{module_name}.{match.group(1)}()", tuple(sorted(deps))))
    counts = Counter(name for name, _ in assignments)
    for name, value in assignments:
        deps = evidence.expression(value, None) if counts[name] == 1 and name not in functions else None
        if deps:  # a call of a project function (a torch factory at module level is rare and cheap to miss)
            found.append((f"{module_name}.{name}", tuple(sorted(deps))))
    return tuple(found)


def _import_aliases(text: str, package: str) -> Dict[str, str]:
    aliases: Dict[str, str] = {}
    for match in _IMPORT_LINE.finditer("\n" + text):
        if match.group("names") is not None:
            for item in match.group("names").split(","):
                words = item.split()
                if len(words) == 3 and words[1] == "as":
                    aliases[words[2]] = words[0]
                elif words:
                    aliases[words[0].split(".")[0]] = words[0].split(".")[0]
            continue
        base = absolute_module(package, len(match.group("dots")), match.group("module"))
        for item in match.group("imported").split(","):
            words = item.split()
            if words:
                local = words[2] if len(words) == 3 and words[1] == "as" else words[0]
                aliases[local] = f"{base}.{words[0]}" if base else words[0]
    return aliases


# A function's local name → the values it is assigned (None: bound some other way too).
Assignments = Callable[[str], Optional[List[str]]]


class _TensorEvidence:
    """Whether an expression is shown to be a tensor, and on which project calls that depends (None: not shown)."""

    def __init__(self, aliases: Dict[str, str], module_name: str, functions: Set[str]) -> None:
        self.aliases = aliases
        self.module_name = module_name
        self.functions = functions

    def function(self, text: str, match: "re.Match[str]") -> Optional[FrozenSet[str]]:
        end = _BLOCK_END.search(text, match.end())
        block = text[match.start() : end.start() if end else len(text)]
        if text.startswith("@", text.rfind("\n", 0, match.start()) + 1) or ("yield" in block and re.search(r"\byield\b", block)):
            return None  # a decorator may change what it returns; a generator returns a generator
        returns = list(_RETURN.finditer(block))
        signature = _SIGNATURE_END.search(block)
        if not returns or signature is None:
            return None
        first = len(block) - len(block[signature.end() :].lstrip(" \t\n"))  # the first statement of the body
        body_indent = first - block.rfind("\n", 0, first) - 1
        last = returns[-1]
        if not block.rstrip().endswith(last.group(0).rstrip()) or len(last.group(1)) != body_indent:
            return None  # it may fall off its end and return None
        assignments = self._assignments(block, block[: signature.end()])
        deps: Set[str] = set()
        for returned in returns:
            found = self.expression(returned.group(2), assignments)
            if found is None:
                return None
            deps |= found
        return frozenset(deps)

    @staticmethod
    def _assignments(block: str, signature: str) -> Assignments:
        """The values a local name is assigned in the block (None when it is bound any other way)."""
        assigned: Dict[str, List[str]] = {}
        for match in _LOCAL_ASSIGNMENT.finditer(block):
            assigned.setdefault(match.group(1), []).append(match.group(2))
        unknown = set(_WORD.findall(signature))
        for match in _OTHER_BINDING.finditer(block):
            unknown.update(_WORD.findall("".join(group for group in match.groups() if group)))
        return lambda name: None if name in unknown else assigned.get(name)

    def expression(self, source: str, assignments: Optional[Assignments], visiting: FrozenSet[str] = frozenset()) -> Optional[FrozenSet[str]]:
        try:
            node = ast.parse(source.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        return self._evident(node, assignments, visiting)

    def _evident(self, node: ast.AST, assignments: Optional[Assignments], visiting: FrozenSet[str]) -> Optional[FrozenSet[str]]:
        """`visiting`: the local names whose values are being read (`x = x.clamp(0, 1)` reads its own)."""
        if isinstance(node, ast.Call):
            qualified = self._qualify(node.func, assignments)
            if qualified is not None:
                if call_returns_tensor(qualified):
                    return frozenset()
                foreign = is_torch_module(qualified) or qualified.split(".")[0] in sys.stdlib_module_names
                return None if foreign or "." not in qualified else frozenset({qualified + "()"})
            if isinstance(node.func, ast.Attribute) and node.func.attr in tensor_api.TENSOR_METHODS:
                return self._evident(node.func.value, assignments, visiting)
            return None
        if isinstance(node, ast.Name):
            return self._name(node, assignments, visiting)
        if isinstance(node, ast.BinOp):
            left, right = self._evident(node.left, assignments, visiting), self._evident(node.right, assignments, visiting)
            if left is not None and right is not None:
                return left | right
            other = node.right if left is not None else node.left
            number = isinstance(other, ast.Constant) and type(other.value) in (int, float)
            return (left if left is not None else right) if number else None
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
            return self._evident(node.operand, assignments, visiting)
        if isinstance(node, ast.Subscript):
            return self._evident(node.value, assignments, visiting)
        if isinstance(node, ast.Attribute):
            if node.attr in tensor_api.TENSOR_ATTRIBUTES:
                return self._evident(node.value, assignments, visiting)
            # `config.priors` through `import config`: a module-level name of the project.
            qualified = self._qualify(node, assignments)
            return None if qualified is None else self.project_name(qualified)
        return None

    def project_name(self, qualified: str) -> Optional[FrozenSet[str]]:
        """A name of another module that holds a tensor if the project's facts show it (never torch's or the standard library's)."""
        if "." not in qualified or is_torch_module(qualified) or qualified.split(".")[0] in sys.stdlib_module_names:
            return None
        return frozenset({qualified})

    def _name(self, node: ast.Name, assignments: Optional[Assignments], visiting: FrozenSet[str]) -> Optional[FrozenSet[str]]:
        if assignments is not None:
            if node.id in visiting:
                return frozenset()  # what its other assignments show
            values = assignments(node.id) if len(visiting) < 4 else None
            if values is None:
                return None
            deps: Set[str] = set()
            for value in values:
                found = self.expression(value, assignments, visiting | {node.id})
                if found is None:
                    return None
                deps |= found
            return frozenset(deps)
        return None

    def _qualify(self, node: ast.AST, assignments: object = None) -> Optional[str]:
        """The qualified name a call or attribute names through the imports (`assignments`: where it is read)."""

        name = _ast_dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        target = self.aliases.get(head)
        if target is None:
            if head not in self.functions or rest:
                return None
            target = f"{self.module_name}.{head}"
        return f"{target}.{rest}" if rest else target


@dataclass(frozen=True)
class _Imported:
    """A name bound by an import: the qualified name it stands for (`module`: a module, no tensor)."""

    qualified: str
    module: bool = False


class _Defined:
    """A name bound by a `def` or `class` statement: a function or class, no tensor."""


_DEFINED = _Defined()
# What one scope binds each of its names to: the values of its plain assignments, imports and
# definitions, in any order (a read may see any of them), or None where the name is bound some other
# way too.
Bound = Dict[str, Optional[List[Union[ast.expr, _Imported, _Defined]]]]


class _ScopeBindings:
    """What each function of a file (and its module) binds its names to, recorded as one walk passes
    each node with the function it stands in (`see`).

    Read without the order of the statements: a name holds one of its bindings wherever it is read
    (a local read before any binding raises). Every way of binding a name is seen: a `Name` stored
    anywhere but as a plain assignment's target (a loop, `with ... as`, unpacking, a comprehension's
    or a walrus' target), a parameter (of the function, or of a lambda in it), `except ... as`, a
    match capture, `global`: the name is then unknown.
    """

    def __init__(self, package: str) -> None:
        self.package = package
        self.bound: Dict[int, Bound] = {}
        self.parents: Dict[int, ast.AST] = {}  # function → the function or module it reads names from
        self.star = False  # a star import at module level
        self.shared: Set[str] = set()  # names a `global` or `nonlocal` statement lets other code rebind
        self._plain: Set[int] = set()  # the ids of the `Name` targets of plain assignments

    def _unknown(self, scope: ast.AST, name: str) -> None:
        self.bound.setdefault(id(scope), {})[name] = None

    def _add(self, scope: ast.AST, name: str, value: Union[ast.expr, _Imported, _Defined]) -> None:
        values = self.bound.setdefault(id(scope), {}).setdefault(name, [])
        if values is not None:
            values.append(value)

    def _parameters(self, scope: ast.AST, arguments: ast.arguments) -> None:
        for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg):
            if argument is not None:
                self._unknown(scope, argument.arg)

    def enter(self, function: ast.AST, outer: ast.AST) -> None:
        """A function's body starts: its parameters are its own names, read from `outer` where it binds none."""
        self.parents[id(function)] = outer
        self._parameters(function, function.args)  # type: ignore[attr-defined]

    def see(self, node: ast.AST, scope: Optional[ast.AST]) -> None:
        if scope is None:  # a class body binds class attributes, which its methods never read by name
            return
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load) and id(node) not in self._plain:
                self._unknown(scope, node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self._add(scope, node.name, _DEFINED)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self._plain.add(id(target))
                    self._add(scope, target.id, node.value)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None and isinstance(node.target, ast.Name):
                self._plain.add(id(node.target))
                self._add(scope, node.target.id, node.value)
        elif isinstance(node, ast.Lambda):
            self._parameters(scope, node.args)  # its own, but a call in its body is read with this scope's names
        elif isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                self._add(scope, local, _Imported(alias.name if alias.asname else local, module=True))
        elif isinstance(node, ast.ImportFrom):
            module = absolute_module(self.package, node.level, node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    self.star = True
                else:  # `from pkg import sub` may import a module: only its use tells
                    self._add(scope, alias.asname or alias.name, _Imported(f"{module}.{alias.name}" if module else alias.name))
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            self.shared.update(node.names)
            for name in node.names:
                self._unknown(scope, name)
        elif isinstance(node, ast.ExceptHandler):
            if node.name:
                self._unknown(scope, node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)):
            if node.name:
                self._unknown(scope, node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            self._unknown(scope, node.rest)


class _ArgumentEvidence(_TensorEvidence):
    """Whether an argument of a call is shown to be a tensor, read in the scope of the call: a name
    through every binding of it in the function that binds it (the call's own, an enclosing one, or
    the module), never a name that other code may rebind (`global`, `nonlocal`, a star import)."""

    def __init__(self, tree: ast.Module, aliases: Dict[str, str], module_name: str, scopes: _ScopeBindings) -> None:
        functions = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        super().__init__(aliases, module_name, functions)
        self.tree = tree
        self.scopes = scopes

    def argument(self, value: ast.expr, scope: ast.AST) -> Optional[FrozenSet[str]]:
        return self._evident(value, scope, frozenset())  # type: ignore[arg-type]

    def _lookup(self, name: str, scope: object) -> Tuple[Optional[ast.AST], Optional[List[Union[ast.expr, _Imported, _Defined]]]]:
        """The scope that binds `name` where `scope` reads it and the values it binds it to: (None,
        None) where nothing binds it (a builtin), (scope, None) where it is bound some other way."""
        scopes = self.scopes
        current = scope if isinstance(scope, ast.AST) else None
        while current is not None:
            bound = scopes.bound.get(id(current))
            if bound is not None and name in bound:
                return current, None if name in scopes.shared else bound[name]
            if current is self.tree:
                return (current, None) if scopes.star else (None, None)  # a star import may bind it
            current = scopes.parents.get(id(current))
        return None, None

    def _name(self, node: ast.Name, assignments: object, visiting: FrozenSet[str]) -> Optional[FrozenSet[str]]:
        owner, values = self._lookup(node.id, assignments)
        if owner is None or values is None:
            return None
        key = f"{id(owner)}:{node.id}"
        if key in visiting:
            return frozenset()  # what its other assignments show
        if len(visiting) >= 4:
            return None
        deps: Set[str] = set()
        for value in values:
            if isinstance(value, _Defined) or (isinstance(value, _Imported) and value.module):
                return None
            shown = self.project_name(value.qualified) if isinstance(value, _Imported) else self._evident(value, owner, visiting | {key})
            if shown is None:
                return None
            deps |= shown
        return frozenset(deps)

    def _qualify(self, node: ast.AST, assignments: object = None) -> Optional[str]:
        """Through the imports, or a top-level function of the file, where nothing else binds the head name (a parameter `torch`)."""
        name = _ast_dotted(node)
        if name is None:
            return None
        head = name.partition(".")[0]
        owner, values = self._lookup(head, assignments)
        if owner is None or values is None:
            return None
        if all(isinstance(value, _Imported) for value in values) and len({value.qualified for value in values}) == 1:  # type: ignore[union-attr]
            value = values[0]
            target, rest = value.qualified, name.partition(".")[2]  # type: ignore[union-attr]
            return f"{target}.{rest}" if rest else target
        if owner is self.tree and values == [_DEFINED] and head in self.functions and "." not in name:
            return f"{self.module_name}.{head}"
        return None


class _Names:
    """A file's import aliases, read from its import statements alone (a file that wraps nothing)."""

    def __init__(self, aliases: Dict[str, str], package: str) -> None:
        self.aliases = aliases
        self.package = package

    @classmethod
    def of(cls, tree: ast.Module, package: str, module_level: bool = False) -> "_Names":
        """The aliases of the file's imports; with `module_level`, only of those outside its functions and classes."""
        aliases: Dict[str, str] = {}
        pending: List[ast.AST] = list(tree.body)
        while pending:
            node = pending.pop()
            if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        aliases[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = absolute_module(package, node.level, node.module or "")
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name
            elif isinstance(node, ast.stmt):
                for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                    pending.extend(getattr(node, name, ()))
            elif isinstance(node, (ast.excepthandler, ast.match_case)):
                pending.extend(node.body)
        return cls(aliases, package)

    def qualify(self, node: ast.AST) -> Optional[str]:
        return _qualified(node, self.aliases)


def _qualified(node: ast.AST, aliases: Mapping[str, str]) -> Optional[str]:
    """The dotted name of `node` with its first part resolved through the file's imports (`nn.Linear` → `torch.nn.Linear`)."""
    name = _ast_dotted(node)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    target = aliases.get(head, head)
    return f"{target}.{rest}" if rest else target


_SUBCLASS = GuardedPattern(r"^[ \t]*class[ \t]+\w+[ \t]*\([ \t]*[\w.]", ["class"], re.M, one_line=True)
# Searched in "\n" + text: a pattern that opens with a newline lets the regex engine jump between lines.
_CLASS_FORWARD_OR_BASE_INIT = re.compile(
    r"\n(?P<indent>[ \t]*)(?:class[ \t]+(?P<name>\w+)[ \t]*(?:\((?P<bases>[^)]*)\))?[ \t]*:|(?:async[ \t]+)?def[ \t]+forward\b"
    r"|(?P<base_init>super[ \t]*\([^)\n]*\)[ \t]*\.[ \t]*__init__[ \t]*\())"
)
_HEADER = re.compile(r"[ \t]*(?:async[ \t]+)?(def|class)[ \t]+(\w+)")


def scan_classes(text: str) -> Tuple[ClassInfo, ...]:
    """Classes with their base names, whether they define `forward`, and the literal keywords their
    `__init__` passes to `super().__init__`, read from the text by indentation.

    A regex over the lines is ~20x cheaper than a parse, and every file needs this pass.
    """
    found: List[List] = []  # [name, bases, defines_forward, indent, base init calls]
    open_classes: List[List] = []
    source = "\n" + text
    for match in _CLASS_FORWARD_OR_BASE_INIT.finditer(source):
        indent = len(match.group("indent").expandtabs())
        while open_classes and open_classes[-1][3] >= indent:
            open_classes.pop()
        if match.group("base_init") is not None:
            if open_classes and _enclosing_headers(source, match.start(), indent, 2) == [("def", "__init__"), ("class", open_classes[-1][0])]:
                open_classes[-1][4].append(_literal_keywords(source, match.start("base_init")))
            continue
        if match.group("name") is None:
            if open_classes:
                open_classes[-1][2] = True
            continue
        bases = tuple(
            base.strip().rpartition(".")[2]
            for base in (match.group("bases") or "").split(",")
            if base.strip() and "=" not in base and re.fullmatch(r"[\w.]+", base.strip())
        )
        entry = [match.group("name"), bases, False, indent, []]
        found.append(entry)
        open_classes.append(entry)
    # One call to the base's `__init__` binds its keywords; with several (one per branch) none is known.
    return tuple(
        ClassInfo(name, bases, forward, calls[0] if len(calls) == 1 else ()) for name, bases, forward, _, calls in found
    )


def _enclosing_headers(source: str, position: int, limit: int, count: int) -> List[Tuple[str, str]]:
    """The `def`/`class` headers around the line indented by `limit` that follows `position` (innermost
    first, at most `count`): each is the nearest line above with less indentation (blank lines,
    comments and closing brackets aside)."""
    headers: List[Tuple[str, str]] = []
    for line in reversed(source[:position].split("\n")):
        stripped = line.strip()
        if not stripped or stripped[0] in "#)]}":  # a closing bracket ends a signature or a call, no block
            continue
        indent = len(line.expandtabs()) - len(line.expandtabs().lstrip())
        if indent >= limit:
            continue
        limit = indent
        header = _HEADER.match(line)
        if header is not None:
            headers.append((header.group(1), header.group(2)))
            if len(headers) == count:
                break
        if indent == 0:
            break
    return headers


def _literal_keywords(source: str, start: int) -> Tuple[Tuple[str, object], ...]:
    """The keywords given a constant in the call that opens at `start` (it may span lines)."""
    depth, end = 0, start
    for end in range(source.index("(", source.index("__init__", start)), len(source)):
        character = source[end]
        if character in "([{":
            depth += 1
        elif character in ")]}":
            depth -= 1
            if depth == 0:
                break
    try:
        call = ast.parse(source[start : end + 1], mode="eval").body
    except (SyntaxError, ValueError):  # a bracket inside a string: unknown, so nothing is bound
        return ()
    if not isinstance(call, ast.Call):
        return ()
    return tuple(
        (keyword.arg, keyword.value.value)
        for keyword in call.keywords
        if keyword.arg is not None and isinstance(keyword.value, ast.Constant)
    )


def _int_literal(node: ast.AST) -> Optional[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_literal(node.operand)
        return None if inner is None else -inner
    return None


def _ast_dotted(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _ast_dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


class _WrapVisitor(ast.NodeVisitor):
    """Finds `DataParallel(X(...))` and, through the assignments of the enclosing scope, `DataParallel(x)`."""

    def __init__(self, path: str, filename: str, module_name: str, package: str, local_classes: Set[str]) -> None:
        self.path = path
        self.filename = filename
        self.module_name = module_name
        self.package = package
        self.local_classes = local_classes
        self.aliases: Dict[str, str] = {}
        self.wraps: List[Wrap] = []
        # Per open scope: its assignments, and the wrap calls to resolve once the whole scope is read.
        self.scopes: List[Tuple[Dict[str, List[ast.AST]], List[ast.Call]]] = []

    def qualify(self, node: ast.AST) -> Optional[str]:
        return _qualified(node, self.aliases)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = absolute_module(self.package, node.level, node.module or "")
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name

    def _visit_scope(self, node: ast.AST) -> None:
        self.scopes.append(({}, []))
        self.generic_visit(node)
        # Resolved at the end of the scope, so a wrap may name a model assigned after it.
        for call in self.scopes[-1][1]:
            distributed = self.qualify(call.func) in DISTRIBUTED_DATA_PARALLEL
            for class_name, module in self._wrapped_classes(call.args[0], depth=0):
                dim = None if distributed else self._dim(call)
                self.wraps.append(Wrap(class_name, dim, self.path, call.lineno, module, self.filename, distributed=distributed))
        self.scopes.pop()

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = _visit_scope

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.scopes[-1][0].setdefault(node.targets[0].id, []).append(node.value)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if node.args and self.qualify(node.func) in DATA_PARALLEL | FUNCTIONAL_DATA_PARALLEL | DISTRIBUTED_DATA_PARALLEL:
            self.scopes[-1][1].append(node)
        self.generic_visit(node)

    def _dim(self, node: ast.Call) -> Optional[int]:
        for keyword in node.keywords:
            if keyword.arg == "dim":
                return _int_literal(keyword.value)
        position = 4 if self.qualify(node.func) in FUNCTIONAL_DATA_PARALLEL else 3
        if len(node.args) > position:
            return _int_literal(node.args[position])
        return 0

    def _wrapped_classes(self, node: ast.AST, depth: int) -> Iterable[Tuple[str, Optional[str]]]:
        """(class name, the module it comes from) for each class `node` may be an instance of."""
        if depth > 3:
            return
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in MODULE_RETURNING_METHODS:
                yield from self._wrapped_classes(func.value, depth + 1)
                return
            qualified = self.qualify(func)
            if qualified and not is_torch_module(qualified):
                module, _, name = qualified.rpartition(".")
                if isinstance(func, ast.Name) and func.id not in self.aliases:
                    yield name, "" if func.id in self.local_classes else None
                    return
                yield name, module or None
        elif isinstance(node, ast.Name):
            for scope, _ in reversed(self.scopes):
                if node.id in scope:
                    for value in scope[node.id]:
                        yield from self._wrapped_classes(value, depth + 1)
                    return


def functional_dim(call: ast.Call) -> Optional[int]:
    """The dim a call of the functional `data_parallel(module, inputs, device_ids, output_device, dim)`
    scatters along: 0 by default, None when it is not a literal."""
    for keyword in call.keywords:
        if keyword.arg == "dim":
            return _int_literal(keyword.value)
        if keyword.arg is None:
            return None
    if any(isinstance(arg, ast.Starred) for arg in call.args):
        return None
    return _int_literal(call.args[4]) if len(call.args) > 4 else 0


def scan_parallel_helpers(tree: ast.Module, qualify: Callable[[ast.AST], Optional[str]], path: str) -> Tuple[ParallelHelper, ...]:
    """The file's top-level functions that forward a module and its input to the functional
    `data_parallel` (on some path: `if ngpu > 1:`), each parameter passed as it came."""
    found: List[ParallelHelper] = []
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef) or function.decorator_list:
            continue
        positional = [argument.arg for argument in (*function.args.posonlyargs, *function.args.args)]
        stored = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        calls = [n for n in ast.walk(function) if isinstance(n, ast.Call) and qualify(n.func) in FUNCTIONAL_DATA_PARALLEL]
        forwarded: Set[Optional[Tuple[Tuple[str, str], Optional[int]]]] = set()
        for call in calls:
            given = {k.arg: k.value for k in call.keywords if k.arg in ("module", "inputs")}
            module = call.args[0] if call.args else given.get("module")
            inputs = call.args[1] if len(call.args) > 1 else given.get("inputs")
            names = [n.id if isinstance(n, ast.Name) else "" for n in (module, inputs)]
            if any(name not in positional or name in stored for name in names):
                forwarded.add(None)
            else:
                forwarded.add(((names[0], names[1]), functional_dim(call)))
        if len(forwarded) == 1 and None not in forwarded:
            (module_name, input_name), dim = forwarded.pop()  # type: ignore[misc]
            line = min(call.lineno for call in calls)
            module_at, input_at = positional.index(module_name), positional.index(input_name)
            found.append(ParallelHelper(function.name, (module_at, module_name), (input_at, input_name), dim, path, line))
    return tuple(found)


# Wrappers whose `state_dict()` keys gain `module.` and that do not forward attribute reads (not FSDP).
# The keyword arguments each wrapper's constructor takes (torch 2.13).
WRAPPER_KEYWORDS: Mapping[str, FrozenSet[str]] = {
    "DataParallel": frozenset({"module", "device_ids", "output_device", "dim"}),
    "DistributedDataParallel": frozenset(
        {
            "module", "device_ids", "output_device", "dim", "broadcast_buffers", "init_sync", "process_group",
            "bucket_cap_mb", "find_unused_parameters", "check_reduction", "gradient_as_bucket_view", "static_graph",
            "delay_all_reduce_named_params", "param_to_hook_all_reduce", "mixed_precision", "device_mesh",
            "skip_all_reduce_unused_params",
        }
    ),
}  # fmt: skip


def _ast_wrapper_of(value: ast.AST, qualify) -> Optional[str]:
    """The wrapper class `value` builds (through `.cuda()`, `.to(device)` chained on it), else None."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in MODULE_RETURNING_METHODS:
        value = value.func.value
    if not isinstance(value, ast.Call):
        return None
    wrapper = ATTRIBUTE_WRAPPERS.get(qualify(value.func) or "")
    if wrapper is not None and not {keyword.arg for keyword in value.keywords if keyword.arg} <= WRAPPER_KEYWORDS[wrapper]:
        return None  # `DataParallel(net, output_dim=1)` raises TypeError: no wrapper is ever made
    return wrapper


def _ast_wrap_in(value: ast.AST, qualify) -> Optional[Tuple[str, tuple]]:
    """The wrapper `value` builds, and the conditional-expression tests that lead to it
    (`DataParallel(net) if ngpu > 1 else net`), else None."""
    if isinstance(value, ast.IfExp):
        for branch, holds in ((value.body, True), (value.orelse, False)):
            found = _ast_wrap_in(branch, qualify)
            if found is not None:
                return found[0], ((value.test, holds), *found[1])
        return None
    wrapper = _ast_wrapper_of(value, qualify)
    return (wrapper, ()) if wrapper is not None else None


def _walk_conditions(statements, conditions, visit) -> None:
    """`visit(statement, conditions)` for each simple statement of a body, with the branch tests that lead there."""
    for statement in statements:
        if isinstance(statement, ast.If):
            _walk_conditions(statement.body, (*conditions, (statement.test, True)), visit)
            _walk_conditions(statement.orelse, (*conditions, (statement.test, False)), visit)
        elif isinstance(statement, (ast.For, ast.While, ast.With, ast.Try)):
            for block in (statement.body, getattr(statement, "orelse", []), getattr(statement, "finalbody", [])):
                _walk_conditions(block, conditions, visit)
            for handler in getattr(statement, "handlers", []):
                _walk_conditions(handler.body, conditions, visit)
        elif not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            visit(statement, conditions)


def _condition_texts(text: str, conditions) -> Tuple[Tuple[str, bool], ...]:
    # The test's text only where a wrap needs it: get_source_segment splits the whole file.
    return tuple((" ".join((ast.get_source_segment(text, test) or "").split()), holds) for test, holds in conditions)


def scan_attribute_wraps(tree: ast.AST, text: str, qualify, path: str) -> Tuple[AttributeWrap, ...]:
    """`self.model = DataParallel(self.model)` in the methods of each class: a base trainer's wrap,
    which its subclasses (possibly in other files) inherit."""
    found: List[AttributeWrap] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for method in node.body:
            if not (isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.args.args):
                continue
            self_name = method.args.args[0].arg
            # (line, attribute, conditions, wrapper or None) of each assignment to `self.<attr>`
            assignments: List[Tuple[int, str, tuple, Optional[Tuple[str, tuple]]]] = []

            def visit(statement, conditions, self_name=self_name) -> None:
                if isinstance(statement, ast.Assign):
                    wrap = _ast_wrap_in(statement.value, qualify)
                    for target in statement.targets:
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == self_name:
                            assignments.append((statement.lineno, target.attr, conditions, wrap))

            _walk_conditions(method.body, (), visit)
            calls = [
                (call.lineno, call.func.attr)
                for call in ast.walk(method)
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name) and call.func.value.id == self_name
            ]
            for line, attribute, conditions, wrap in assignments:
                if wrap is None:
                    continue
                # Undone before the method returns: a later plain assignment under the same conditions.
                tested = {(ast.dump(test), holds) for test, holds in conditions}
                undone = [
                    later
                    for later, other, inner, plain in assignments
                    if other == attribute and later > line and plain is None and {(ast.dump(test), holds) for test, holds in inner} <= tested
                ]
                end = min(undone) if undone else None
                during = tuple(sorted({name for at, name in calls if at > line and (end is None or at < end)}))
                tests = _condition_texts(text, (*conditions, *wrap[1]))
                parameters = _tested_parameters(method, (*conditions, *wrap[1])) if method.name == "__init__" else ()
                found.append(AttributeWrap(node.name, attribute, wrap[0], path, line, tests, method.name, end is None, during, parameters))
    return tuple(found)


def _tested_parameters(method: ast.FunctionDef, conditions) -> Tuple[Tuple[str, bool], ...]:
    """The parameters of `method` that `conditions` test for truth (`if flag:`, `if not flag:`, one
    side of an `and`), with the truth each must have; only those the method never rebinds."""
    arguments = method.args
    names = {arg.arg for arg in (*arguments.posonlyargs, *arguments.args[1:], *arguments.kwonlyargs)}
    names -= {node.id for node in ast.walk(method) if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)}
    found: List[Tuple[str, bool]] = []
    pending = list(conditions)
    while pending:
        test, holds = pending.pop()
        if isinstance(test, ast.Name) and test.id in names:
            found.append((test.id, holds))
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            pending.append((test.operand, not holds))
        elif isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And if holds else ast.Or):
            pending.extend((value, holds) for value in test.values)
    return tuple(sorted(found))


def scan_returned_wraps(tree: ast.Module, text: str, qualify, path: str) -> Tuple[ReturnedWrap, ...]:
    """Top-level functions that return a wrapper: `return nn.DataParallel(model)`, or a name wrapped
    on some path and returned (`if ngpu > 1: model = DataParallel(model)` ... `return model`). A function
    that looks at the name's `.module` (or tests it with `hasattr`/`isinstance`/`getattr`) handles
    both cases, and is left out."""
    found: List[ReturnedWrap] = []
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef):
            continue
        wraps: Dict[str, Tuple[str, int, tuple]] = {}  # name → (wrapper, line, conditions) of its first wrap
        returns: List[Tuple[ast.Return, tuple]] = []

        def visit(statement, conditions) -> None:
            if isinstance(statement, ast.Return) and statement.value is not None:
                returns.append((statement, conditions))
            elif isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
                wrapper = _ast_wrapper_of(statement.value, qualify)
                if wrapper is not None:
                    wraps.setdefault(statement.targets[0].id, (wrapper, statement.lineno, conditions))

        _walk_conditions(function.body, (), visit)
        handled = _names_told_apart(function)
        arguments = function.args
        parameters = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
        for statement, conditions in returns:
            value = statement.value
            wrap = _ast_wrap_in(value, qualify)
            if wrap is not None:
                wrapper, line, wrapped_under = wrap[0], value.lineno, (*conditions, *wrap[1])
            else:
                while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in MODULE_RETURNING_METHODS:
                    value = value.func.value  # `return model.cuda()`: the same object
                if not (isinstance(value, ast.Name) and value.id in wraps and value.id not in handled):
                    continue
                wrapper, line, wrapped_under = wraps[value.id]
            # `if opt.isTrain:` decides per call, on what each caller passes, which is not followed: unknown.
            if not any(isinstance(node, ast.Name) and node.id in parameters for test, _ in wrapped_under for node in ast.walk(test)):
                found.append(ReturnedWrap(function.name, wrapper, path, line, _condition_texts(text, wrapped_under)))
            break
    return tuple(found)


def _names_told_apart(function: ast.FunctionDef) -> Set[str]:
    """Names whose wrapped and plain cases the function tells apart: `m.module`, `hasattr(m, ...)`."""
    names: Set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and node.attr == "module" and isinstance(node.value, ast.Name):
            names.add(node.value.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "isinstance", "getattr"):
            if node.args and isinstance(node.args[0], ast.Name):
                names.add(node.args[0].id)
    return names


def scan_project_calls(
    tree: ast.Module, text: str, names: "_Names", path: str, evidence: Optional["_ArgumentEvidence"], wrapping: bool
) -> Tuple[Tuple[ProjectCall, ...], Tuple[str, ...]]:
    """Calls that pass a wrapper or a tensor to a function or class that may be the project's
    (imported by name or through its module, or defined at this file's top level), and every other use
    of such a callee: a call passing neither, a reference (`spawn(train)`, `class Focal(Loss)`), a
    star import, its module handed on as a value (`getattr(losses, name)`).

    An argument is a wrapper when it is a wrap call, or a name whose latest assignment in its scope
    before the call is one, on a path the call's own branch does not exclude (a call in a compound
    statement's header passes none); a name the scope tells apart (`m.module`, `hasattr(m, ...)`) is
    not. An argument is a tensor (with `evidence`: the file may pass one) when `_ArgumentEvidence`
    shows it is one, read in the function the call is made in (a call in a class body shows none)."""
    own = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    aliases = names.aliases

    def function_named(node: ast.AST) -> Optional[str]:
        head = node
        while isinstance(head, ast.Attribute):
            head = head.value
        if not (isinstance(head, ast.Name) and (head.id in aliases or head.id in own)):
            return None
        name = _ast_dotted(node)
        if name is None:
            return None
        if name.partition(".")[0] not in aliases:
            return name if name in own else None
        qualified = names.qualify(node) or ""
        if "." not in qualified or is_torch_module(qualified) or qualified.split(".")[0] in sys.stdlib_module_names:
            return None
        return qualified

    uses: List[Tuple[int, str]] = []  # (node id, function) of every use
    calls: List[Tuple[ast.Call, str, Optional[ast.AST]]] = []  # each call of a callee, with the scope it is made in
    wrap_lines: List[int] = []
    functions: List[ast.AST] = []
    others: Set[str] = set()
    imported: Set[str] = set()
    bases: Set[int] = set()  # the ids of the names that stand before an attribute (`loss` in `loss.Loss`)
    bindings = evidence.scopes if evidence is not None else None
    fields = _CHILD_FIELDS
    if not own and not any(_may_be_project(target) for target in aliases.values()):
        return (), ()  # nothing here may name a function of the project
    # One walk, each node with the function (or module) whose names it reads (None in a class body),
    # and the one a function defined there reads its free names from.
    pending: List[Tuple[ast.AST, Optional[ast.AST], ast.AST]] = [(node, tree, tree) for node in tree.body]
    while pending:
        node, scope, outer = pending.pop()
        if bindings is not None and type(node) in _BINDING_NODES and (type(node) is not ast.Name or type(node.ctx) is not ast.Load):
            bindings.see(node, scope)
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = function_named(node)
            if name is not None:
                uses.append((id(node), name))
            if isinstance(node, ast.Attribute):
                if node.attr != "__dict__":  # `loss.__dict__[name]`: any of its names
                    bases.add(id(node.value))
            elif id(node) not in bases and node.id in aliases:
                # An imported module handed on as a value (`getattr(losses, cfg.name)`, `vars(losses)`)
                # gives any of its functions to code not read here.
                module = aliases[node.id]
                if not is_torch_module(module) and module.split(".")[0] not in sys.stdlib_module_names:
                    others.add(f"{module}.*")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # Decorators, defaults and bases are read where the statement stands; the body in its own scope.
            if not isinstance(node, ast.ClassDef):
                functions.append(node)
            heads = [*node.decorator_list, *getattr(node, "bases", ()), *getattr(node, "keywords", ())]
            if isinstance(node, ast.ClassDef):
                pending.extend((child, None, outer) for child in node.body)
            else:
                heads += [node.args, *([node.returns] if node.returns else [])]
                if bindings is not None:
                    bindings.enter(node, outer)
                pending.extend((child, node, node) for child in node.body)
            pending.extend((child, scope, outer) for child in heads)
            continue
        elif isinstance(node, ast.Call):
            if wrapping and names.qualify(node.func) in ATTRIBUTE_WRAPPERS:
                wrap_lines.append(node.lineno)
            function = function_named(node.func)
            if function is not None:
                calls.append((node, function, scope))
        elif isinstance(node, ast.ImportFrom):
            module = absolute_module(names.package, node.level, node.module or "")
            # A star import, or one the file never uses (a package's `__init__` re-exporting the
            # function), hands it to code not read here.
            if module and not is_torch_module(module) and module.split(".")[0] not in sys.stdlib_module_names:
                imported.update(f"{module}.{alias.name}" for alias in node.names)
        names_of = fields.get(type(node))
        if names_of is None:
            names_of = fields[type(node)] = tuple(name for name in node._fields if name not in ("ctx", "type_comment"))
        for name in names_of:
            value = getattr(node, name, None)
            if isinstance(value, list):
                pending.extend((child, scope, outer) for child in value if isinstance(child, ast.AST))
            elif isinstance(value, ast.AST):
                pending.append((value, scope, outer))
    used = {name for _, name in uses}
    others.update(name for name in imported if name.endswith(".*") or name not in used)
    if not uses:
        return (), tuple(sorted(others))
    wrapped = _wrapper_slots(tree, text, names, functions, wrap_lines, {id(call) for call, _, _ in calls}) if wrapping and wrap_lines else {}
    found: List[Tuple[Tuple[int, int], ProjectCall]] = []
    passing: Set[int] = set()  # the `func` of each call recorded
    for call, function, scope in calls:
        arguments = [(i, arg) for i, arg in enumerate(call.args)]
        starred = next((i for i, arg in arguments if isinstance(arg, ast.Starred)), len(arguments))
        keywords = [(k.arg, k.value) for k in call.keywords if k.arg is not None]
        splat = starred < len(arguments) or len(keywords) < len(call.keywords)
        tensors: List[TensorSlot] = []
        # A splat hides which parameter an argument meets: no tensor is recorded.
        if evidence is not None and scope is not None and not splat:
            for slot, value in (*arguments, *keywords):
                deps = evidence.argument(value, scope)
                if deps is not None:
                    tensors.append((slot, tuple(sorted(deps))))
        slots = wrapped.get(id(call), ())
        if slots or tensors:
            passing.add(id(call.func))
            passed = None if splat else (len(arguments), tuple(name for name, _ in keywords))
            found.append(((call.lineno, call.col_offset), ProjectCall(function, path, call.lineno, tuple(slots), tuple(tensors), passed)))
    others.update(name for node, name in uses if node not in passing)
    return tuple(call for _, call in sorted(found, key=lambda item: item[0])), tuple(sorted(others))


def _wrapper_slots(
    tree: ast.Module, text: str, names: "_Names", functions: List[ast.AST], wrap_lines: List[int], callees: Set[int]
) -> Dict[int, Tuple[WrappedSlot, ...]]:
    """The wrappers that each call of `callees` (by id) passes: in the module and in the functions that
    hold a wrap, statement by statement, a name holding the wrap of its latest assignment."""
    found: Dict[int, Tuple[WrappedSlot, ...]] = {}
    lines = sorted(wrap_lines)
    # Only a scope that holds a wrap can pass one (the walks below cost a tenth of the facts of torch's own tests).
    for scope in (tree, *(f for f in functions if _holds_a_line(f, lines))):
        told: List[Set[str]] = []  # the names the scope tells apart, found when first needed

        def told_apart(name: str, scope: ast.AST = scope, told: List[Set[str]] = told) -> bool:
            if not told:
                told.append(_names_told_apart(scope))
            return name in told[0]

        latest: Dict[str, Optional[Tuple[str, int, tuple]]] = {}  # name → its latest assignment's wrap

        def wrap_of(value: ast.AST, conditions: tuple, latest: Dict = latest, told_apart=told_apart) -> Optional[Tuple[str, int, tuple]]:
            wrap = _ast_wrap_in(value, names.qualify)
            if wrap is not None:
                return wrap[0], value.lineno, (*conditions, *wrap[1])
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in MODULE_RETURNING_METHODS:
                value = value.func.value  # `model.cuda()`: the same object
            if isinstance(value, ast.Name) and latest.get(value.id) is not None and not told_apart(value.id):
                return latest[value.id]
            return None

        def visit(statement: ast.stmt, conditions: tuple, latest: Dict = latest, wrap_of=wrap_of) -> None:
            for call in ast.walk(statement):
                if id(call) not in callees:
                    continue
                slots: List[WrappedSlot] = []
                arguments = [(i, arg) for i, arg in enumerate(call.args)]
                starred = next((i for i, arg in arguments if isinstance(arg, ast.Starred)), len(arguments))
                # After a `*args`, positions are unknown; a `**kwargs` hides no explicit keyword.
                for slot, value in (*arguments[:starred], *((k.arg, k.value) for k in call.keywords if k.arg is not None)):
                    wrap = wrap_of(value, conditions)
                    if wrap is not None and not _excluded(wrap[2], conditions):
                        slots.append((slot, wrap[0], wrap[1], _condition_texts(text, wrap[2])))
                if slots:
                    found[id(call)] = tuple(slots)
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        latest[target.id] = wrap_of(statement.value, conditions)
                    else:  # `model, opt, _, _ = deepspeed.initialize(model=model)`: what the call returned
                        latest.update((name.id, None) for name in ast.walk(target) if isinstance(name, ast.Name))

        _walk_conditions(scope.body, (), visit)
    return found


# Each `ast` node class's fields that may hold nodes (a name's `ctx` never matters here).
_CHILD_FIELDS: Dict[type, Tuple[str, ...]] = {}
# The nodes that may bind a name (`_ScopeBindings.see`).
_BINDING_NODES = frozenset(
    {
        ast.Name, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.Lambda, ast.Import,
        ast.ImportFrom, ast.Global, ast.Nonlocal, ast.ExceptHandler, ast.MatchAs, ast.MatchStar, ast.MatchMapping,
    }
)


def _holds_a_line(function: ast.AST, lines: Sequence[int]) -> bool:
    """Whether one of the sorted `lines` lies within the function."""
    at = bisect.bisect_left(lines, function.lineno)
    return at < len(lines) and lines[at] <= (function.end_lineno or function.lineno)


def _excluded(needed: tuple, taken: tuple) -> bool:
    """Whether the path taken is the other branch of a test the wrap needed."""
    return any(holds != other_holds and ast.dump(test) == ast.dump(other) for test, holds in needed for other, other_holds in taken)


class ProjectFacts:
    """What the whole project says, for the rules of any one file.

    Imports are resolved lazily, per question: a pre-commit run over one staged file of a
    2,000-file project asks about a handful of modules, not about every import of every file.
    """

    def __init__(self, files: Sequence[FileFacts] = (), root: Optional[str] = None, fact_digests: Optional[Mapping[str, str]] = None) -> None:
        """`fact_digests`: each file's `fact_digest`, where already known (the cache keeps them)."""
        self.files: Dict[str, FileFacts] = {facts.filename: facts for facts in files}
        self._fact_digests = fact_digests or {}
        path_names: Dict[str, Set[str]] = {}
        for facts in files:
            if facts.sys_path_names:
                path_names.setdefault(os.path.dirname(facts.filename), set()).update(facts.sys_path_names)
        self.index = ModuleIndex(self.files, root or _common_folder(self.files), {folder: frozenset(names) for folder, names in path_names.items()})
        classes: Dict[str, List[ClassInfo]] = {}
        for facts in files:
            for info in facts.classes:
                classes.setdefault(info.name, []).append(info)
        wrapped: Dict[str, List[Wrap]] = {}
        distributed: Dict[str, List[Wrap]] = {}
        for facts in files:
            for wrap in facts.wraps:
                resolved = replace(wrap, defined_in=self._defining_file(wrap))
                for owner in _forward_owners(wrap.class_name, classes):
                    (distributed if wrap.distributed else wrapped).setdefault(owner, []).append(resolved)
        # Class whose `forward` runs under DataParallel → the wraps that run it.
        self.wrapped: Mapping[str, Tuple[Wrap, ...]] = {name: tuple(wraps) for name, wraps in sorted(wrapped.items())}
        # The same for DistributedDataParallel, kept apart: the DataParallel rules (scatter, gather,
        # replicas) say nothing about it.
        self.distributed_wrapped: Mapping[str, Tuple[Wrap, ...]] = {name: tuple(w) for name, w in sorted(distributed.items())}
        self._classes = classes
        self._imports_torch: Dict[str, bool] = {}

    @classmethod
    def build(cls, files: Sequence[FileFacts], root: Optional[str] = None, fact_digests: Optional[Mapping[str, str]] = None) -> "ProjectFacts":
        return cls(files, root, fact_digests)

    @cached_property
    def rank_predicates(self) -> FrozenSet[str]:
        """The names of the project's functions that tell whether this process is a given rank."""
        return frozenset(name for facts in self.files.values() if facts.distributed for name in facts.distributed.rank_predicates)

    @cached_property
    def uses_accelerate(self) -> bool:
        """Whether a file of the project imports Hugging Face Accelerate (at its top level, or indented:
        in a function, or under an `if`/`try` of its top level)."""
        return any(name.split(".")[0] == "accelerate" for facts in self.files.values() for name in (*facts.imports, *facts.nested_imports))

    def wraps_any(self, class_names: Iterable[str]) -> bool:
        """Whether DataParallel runs the `forward` of any of these classes (by name: a cheap prefilter)."""
        return any(name in self.wrapped for name in class_names)

    def imports_torch(self, module: str, from_file: str) -> bool:
        """Whether `import module` in `from_file` imports torch (`a.b` runs `a/__init__.py` and `a/b.py`)."""
        return is_torch_module(module) or any(self._file_imports_torch(f) for f in self.index.resolve_chain(module, from_file))

    def _file_imports_torch(self, filename: str) -> bool:
        """Whether importing this project file imports torch, directly or through project modules."""
        if filename in self._imports_torch:
            return self._imports_torch[filename]
        self._imports_torch[filename] = False  # an import cycle adds nothing
        facts = self.files.get(filename)
        found = facts is not None and (
            facts.imports_torch_directly
            or any(self._file_imports_torch(f) for module in facts.imports for f in self.index.resolve_chain(module, filename))
        )
        self._imports_torch[filename] = found
        return found

    def _defining_file(self, wrap: Wrap, depth: int = 0) -> Optional[str]:
        """The file that defines the wrapped class, following re-exports (`from .crnn import CRNN`)."""
        if wrap.module == "":
            return wrap.filename
        if wrap.module is None or depth > 4:
            return None
        filename = self.index.resolve(wrap.module, wrap.filename)
        facts = self.files.get(filename) if filename else None
        if facts is None:
            return None
        if wrap.class_name in facts.class_names:
            return filename
        source = next((m for m in facts.imports if m.rpartition(".")[2] == wrap.class_name), None)
        if source is None:
            return None
        return self._defining_file(replace(wrap, module=source.rpartition(".")[0], filename=filename), depth + 1)

    # Derived facts are computed on first use: a run answered from the cache never asks for them.

    @cached_property
    def tensor_values(self) -> FrozenSet[str]:
        """Qualified names known to hold a tensor (`config.priors`) or to return one when called (`utils.make_priors()`)."""
        return _tensor_values(list(self.files.values()))

    @cached_property
    def distributed(self) -> "DistributedProject":
        """What the DDP/torchrun rules (DPL5xx) need to know about the programs that start a process group."""
        return distributed_project(self.files, self.index)

    @cached_property
    def checkpoint_loads(self) -> Tuple[Tuple[str, CheckpointLoad], ...]:
        """(file, load) for every checkpoint load of the project."""
        return tuple((name, load) for name, facts in sorted(self.files.items()) for load in facts.checkpoint_loads)

    @cached_property
    def files_on_cpu(self) -> FrozenSet[str]:
        """The names of the checkpoint files the project writes only with tensors on the CPU (or none)."""
        written: Dict[str, bool] = {}
        for facts in self.files.values():
            for name, on_cpu in facts.saved_files.writes:
                resolved = self._file_name(name)
                if resolved is not None:
                    written[resolved] = written.get(resolved, True) and on_cpu
        return frozenset(name for name, on_cpu in written.items() if on_cpu)

    def file_read(self, filename: str, line: int) -> Optional[str]:
        """The name of the checkpoint file the `torch.load` of the file's line reads, where its path names one."""
        facts = self.files.get(filename)
        found = next((name for at, name in facts.saved_files.reads if at == line), None) if facts is not None else None
        return self._file_name(found) if found is not None else None

    def _file_name(self, name: str) -> Optional[str]:
        """A file name, or for `=<qualified name>` the file name a module's name holds (None where unknown)."""
        return self._file_name_constants.get(name[1:]) if name.startswith("=") else name

    @cached_property
    def _file_name_constants(self) -> Dict[str, str]:
        return {f"{facts.module_name}.{name}": value for facts in self.files.values() for name, value in facts.saved_files.names}

    @cached_property
    def prefix_helpers(self) -> FrozenSet[str]:
        """The names of the project's functions that strip the `module.` prefix."""
        return frozenset(name for facts in self.files.values() for name in facts.prefix_helpers)

    @cached_property
    def module_attributes(self) -> FrozenSet[str]:
        """Attributes some class of the project names `module` or `*module`."""
        return frozenset(name for facts in self.files.values() for name in facts.module_attributes)

    @cached_property
    def execution(self) -> "ExecutionModel":
        """Where the functions of the project's programs run (the DDP rules' one question)."""
        from dplint.analysis.execution import ExecutionModel  # the rules' pass only: a warm run never needs it

        summaries = {name: facts.execution for name, facts in self.files.items() if facts.execution is not None}
        imported = {
            target
            for name, facts in self.files.items()
            for module in (*facts.imports, *facts.nested_imports)
            if not is_torch_module(module)
            for target in self.index.resolve_chain(module, name)
            if target != name
        }
        return ExecutionModel(summaries, self.index.resolve, frozenset(imported))

    @cached_property
    def attribute_wraps(self) -> Mapping[str, Tuple[AttributeWrap, ...]]:
        """Class → its `self.<attr>` wraps, its own and those of its bases (by class name, across the project)."""
        return _inherited_attribute_wraps(list(self.files.values()), self._classes)

    def is_tensor(self, qualified: str) -> bool:
        """Whether a project name holds a tensor (`config.priors`) or a call of it returns one (`utils.make()`)."""
        return _find_project_name(qualified, self._tensor_values_by_last_name) is not None

    @cached_property
    def _tensor_values_by_last_name(self) -> Mapping[str, Tuple[str, ...]]:
        return _by_last_name(self.tensor_values)

    @cached_property
    def wrap_makers(self) -> FrozenSet[str]:
        """Names whose call makes a wrapper: functions that return one, classes that wrap `self.<attr>`
        in `__init__` (a file that calls none of them and wraps nothing has no wrapper to check)."""
        functions = {wrap.function for facts in self.files.values() for wrap in facts.returned_wraps}
        classes = {name for name, wraps in self.attribute_wraps.items() if any(wrap.method == "__init__" for wrap in wraps)}
        return frozenset(functions | classes)

    def returned_wrap(self, qualified: str, from_file: str) -> Optional[ReturnedWrap]:
        """The wrapper returned by a call of the project function `qualified` (`utils.build_model`, or
        a bare name for a function of `from_file` itself), None when it returns none or is unknown."""
        module, _, function = qualified.rpartition(".")
        filename = self.index.resolve(module, from_file) if module else from_file
        facts = self.files.get(filename) if filename else None
        return next((wrap for wrap in facts.returned_wraps if wrap.function == function), None) if facts else None

    @cached_property
    def _project_calls(self) -> Mapping[Tuple[str, str], Tuple[Tuple[str, ProjectCall], ...]]:
        """(defining file, function or class) → the calls that pass it a wrapper or a tensor, each with its file."""
        found: Dict[Tuple[str, str], List[Tuple[str, ProjectCall]]] = {}
        for facts in self.files.values():
            for call in facts.project_calls:
                target = self._function_target(call.function, facts.filename)
                if target is not None:
                    found.setdefault(target, []).append((facts.filename, call))
        return {target: tuple(calls) for target, calls in found.items()}

    def _function_target(self, qualified: str, from_file: str) -> Optional[Tuple[str, str]]:
        module, _, function = qualified.rpartition(".")
        filename = self.index.resolve(module, from_file) if module else from_file
        return (filename, function) if filename else None

    @cached_property
    def imported_packages(self) -> FrozenSet[str]:
        """The top-level packages some project file imports, at any depth (`import torch_npu` inside a function too)."""
        found: Set[str] = set()
        for facts in self.files.values():
            lazy = facts.distributed.lazy_imports if facts.distributed is not None else ()
            found.update(module.split(".")[0] for module in (*facts.imports, *facts.nested_imports, *lazy))
        return frozenset(found)

    @cached_property
    def wrapper_receivers(self) -> FrozenSet[str]:
        """Names of project functions that some call passes a wrapper to (a cheap prefilter)."""
        return frozenset(function for (_, function), calls in self._project_calls.items() if any(call.slots for _, call in calls))

    def wrapper_arguments_of(self, filename: str, function: str) -> Tuple[ProjectCall, ...]:
        """The calls of the top-level `function` of `filename` when some pass it a wrapper and nothing
        else in the project may use it: no other use in a file read for calls, and no import of its
        module by a file not read for them. The defining file itself, when not read, is its caller's
        to check. Empty when there is no such call or another use may exist: a function called with a
        plain model, or from code we cannot read, takes both."""
        calls = tuple(call for _, call in self._project_calls.get((filename, function), ()))
        if not any(call.slots for call in calls):
            return ()
        for other, facts in self.files.items():
            if facts.other_references is not None:
                for name in facts.other_references:
                    module, _, last = name.rpartition(".")
                    if last in (function, "*") and (self.index.resolve(module, other) if module else other) == filename:
                        return ()
            elif other != filename and self._may_import(facts, filename):
                return ()
        return calls

    def calls_from_other_files(self, filename: str, name: str) -> Optional[Tuple[ProjectCall, ...]]:
        """The calls that other files make of the top-level function or class `name` of `filename`,
        each passing it a tensor or a wrapper; None when another file may use it some other way (a
        call that passes neither, a call hidden in a statement's header, a reference, a star import,
        a re-export) or may use it unread (a file not read for calls that imports its module)."""
        for other, module in self._references_by_name.get(name, ()) + self._references_by_name.get("*", ()):
            if other != filename and (self.index.resolve(module, other) if module else other) == filename:
                return None
        stem = os.path.splitext(os.path.basename(filename))[0]
        folder = os.path.basename(os.path.dirname(filename))
        for key in {stem, folder}:
            for facts in self._unread_importers.get(key, ()):
                if facts.filename != filename and self._may_import(facts, filename):
                    return None
        return tuple(call for caller, call in self._project_calls.get((filename, name), ()) if caller != filename)

    @cached_property
    def _references_by_name(self) -> Mapping[str, Tuple[Tuple[str, str], ...]]:
        """Last name (`*` for a star import) → (file, module) of every other use that files read for calls make."""
        found: Dict[str, List[Tuple[str, str]]] = {}
        for facts in self.files.values():
            for name in facts.other_references or ():
                module, _, last = name.rpartition(".")
                found.setdefault(last, []).append((facts.filename, module))
        return {last: tuple(entries) for last, entries in found.items()}

    @cached_property
    def _unread_importers(self) -> Mapping[str, Tuple[FileFacts, ...]]:
        """The files not read for calls, by the last part of each module they import."""
        found: Dict[str, List[FileFacts]] = {}
        for facts in self.files.values():
            if facts.other_references is None:
                lazy = facts.distributed.lazy_imports if facts.distributed is not None else ()
                for module in {*facts.imports, *facts.nested_imports, *lazy}:
                    found.setdefault(module.rpartition(".")[2], []).append(facts)
        return {key: tuple(dict.fromkeys(entries)) for key, entries in found.items()}

    def tensors_known(self, names: Iterable[str]) -> bool:
        """Whether every one of these project names (`utils.make()`, `config.priors`) holds or returns a tensor."""
        return all(self.is_tensor(name) for name in names)

    @cached_property
    def parallel_helper_names(self) -> FrozenSet[str]:
        """The names of the project's functions that forward to the functional `data_parallel` (a cheap prefilter)."""
        return frozenset(helper.function for facts in self.files.values() for helper in facts.parallel_helpers)

    def parallel_helper(self, qualified: str, from_file: str) -> Optional[Tuple[str, ParallelHelper]]:
        """The project function `qualified` (a bare name for one of `from_file`), with its file, when it
        forwards a module and its input to the functional `data_parallel`."""
        if qualified.rpartition(".")[2] not in self.parallel_helper_names:
            return None
        target = self._function_target(qualified, from_file)
        facts = self.files.get(target[0]) if target else None
        if facts is None or target is None:
            return None
        found = next((helper for helper in facts.parallel_helpers if helper.function == target[1]), None)
        return (facts.filename, found) if found is not None else None

    def _may_import(self, facts: FileFacts, filename: str) -> bool:
        """Whether `facts`' file imports the module `filename`, or its package (`from pkg import engine`),
        at its top or inside its functions."""
        stem = os.path.splitext(os.path.basename(filename))[0]
        folder = os.path.basename(os.path.dirname(filename))
        lazy = facts.distributed.lazy_imports if facts.distributed is not None else ()
        for module in dict.fromkeys((*facts.imports, *facts.nested_imports, *lazy)):
            if module.rpartition(".")[2] in (stem, folder) and filename in (
                self.index.resolve(module, facts.filename),
                self.index.resolve(f"{module}.{stem}", facts.filename),
            ):
                return True
        return False

    def ruled_out_base_wraps(self, class_name: str, base: str) -> FrozenSet[Tuple[str, int]]:
        """The `__init__` wraps of `base` (path, line) that never run for `class_name`: it passes
        `base.__init__` a constant that fails their test (see `base_init_literals`)."""
        literals = base_init_literals(self._classes, class_name, base)
        if not literals:
            return frozenset()
        return frozenset(
            (wrap.path, wrap.line)
            for wrap in self.attribute_wraps.get(base, ())
            if wrap.class_name == base and wrap.method == "__init__" and wrap.ruled_out_by(literals)
        )

    def inherited_attribute_wraps(self, class_name: str) -> Dict[str, Tuple[AttributeWrap, ...]]:
        """`self.<attr>` wraps a method of `class_name` may see: attribute → wraps (own and inherited)."""
        found: Dict[str, Tuple[AttributeWrap, ...]] = {}
        for wrap in self.attribute_wraps.get(class_name, ()):
            found[wrap.attribute] = (*found.get(wrap.attribute, ()), wrap)
        return found

    @cached_property
    def digest(self) -> str:
        """Changes whenever a fact that any file's rules may read changes, execution summaries aside (a
        summary changes with nearly every edit; `digest_for` adds those a file depends on)."""
        digests = sorted((name, self._fact_digests.get(name) or fact_digest(facts)) for name, facts in self.files.items())
        return hashlib.blake2b(repr(digests).encode(), digest_size=16).hexdigest()

    def digest_for(self, filename: str) -> str:
        """The key of a file's cached check: `digest`, and the execution summaries of the files its
        import graph connects it to (where a program's calls can reach it, or it reach them)."""
        component = self._import_components.get(filename, "")
        return hashlib.blake2b(f"{self.digest} {component}".encode(), digest_size=16).hexdigest()

    def import_connected(self, first: str, second: str) -> bool:
        """Whether the project's imports connect the two files (directly or through other project files)."""
        component = self._import_components.get(first)
        return component is not None and component == self._import_components.get(second)

    @cached_property
    def _import_components(self) -> Dict[str, str]:
        """Each file with a summary → the digest of the summaries of its import graph's connected part
        (a file without one, a torch library's own module, has its part in no program's calls)."""
        summarised = {name: facts for name, facts in self.files.items() if facts.execution is not None}
        imported_by, _ = _import_graph(summarised, self.index)
        parent = {name: name for name in summarised}

        def root(name: str) -> str:
            while parent[name] != name:
                parent[name] = parent[parent[name]]
                name = parent[name]
            return name

        for target, importers in imported_by.items():
            for importer in importers:
                if target in parent and importer in parent:
                    parent[root(importer)] = root(target)
        members: Dict[str, List[str]] = {}
        for name in summarised:
            members.setdefault(root(name), []).append(name)
        found: Dict[str, str] = {}
        for names in members.values():
            text = repr(sorted((name, self.files[name].execution) for name in names))
            digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
            found.update((name, digest) for name in names)
        return found


def fact_digest(facts: FileFacts) -> str:
    """What a file's facts say, as a digest (the execution summary aside: it is left out of the repr)."""
    return hashlib.blake2b(repr(facts).encode(), digest_size=16).hexdigest()


def _common_folder(filenames: Iterable[str]) -> Optional[str]:
    folders = {os.path.dirname(f) for f in filenames}
    return os.path.commonpath(list(folders)) if folders else None


def _by_last_name(names: Iterable[str]) -> Dict[str, Tuple[str, ...]]:
    index: Dict[str, List[str]] = {}
    for name in names:
        index.setdefault(name.rpartition(".")[2], []).append(name)
    return {last: tuple(found) for last, found in index.items()}


def _find_project_name(qualified: str, index: Mapping[str, Tuple[str, ...]]) -> Optional[str]:
    """The one project name that `qualified` can mean (package roots differ: either may be a suffix of the
    other); None when there is none or more than one."""
    parts = qualified.split(".")
    matches = []
    for candidate in index.get(parts[-1], ()):
        other = candidate.split(".")
        shorter = min(len(parts), len(other))
        if parts[-shorter:] == other[-shorter:]:
            matches.append(candidate)
    return matches[0] if len(matches) == 1 else None


def _tensor_values(files: Sequence[FileFacts]) -> FrozenSet[str]:
    """The project names shown to be tensors, through chains of calls between the project's functions."""
    candidates: Dict[str, Tuple[str, ...]] = {}
    for facts in files:
        candidates.update(facts.tensor_values)
    index = _by_last_name(candidates)
    known: Set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, deps in candidates.items():
            if name not in known and all(_find_project_name(dep, index) in known for dep in deps):
                known.add(name)
                changed = True
    return frozenset(known)


def _forward_owners(class_name: str, classes: Mapping[str, List[ClassInfo]]) -> List[str]:
    """The classes whose `forward` runs when `class_name` is called: itself, or the base that defines it."""
    owners: List[str] = []
    pending, seen = [class_name], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        infos = classes.get(name, [])
        if not infos or any(info.defines_forward for info in infos):
            owners.append(name)
            continue
        for info in infos:
            pending.extend(info.bases)
    return owners


def _inherited_attribute_wraps(
    files: Sequence[FileFacts], classes: Mapping[str, List[ClassInfo]]
) -> Dict[str, Tuple[AttributeWrap, ...]]:
    """Each class with the `self.<attr>` wraps made in it or in any of its bases, but for a base's
    `__init__` wraps that the constants its subclass passes there rule out."""
    own: Dict[str, List[AttributeWrap]] = {}
    for facts in files:
        for wrap in facts.attribute_wraps:
            own.setdefault(wrap.class_name, []).append(wrap)
    if not own:
        return {}
    result: Dict[str, Tuple[AttributeWrap, ...]] = {}
    for name in sorted(classes):
        found: List[AttributeWrap] = []
        pending: List[Tuple[str, Mapping[str, object]]] = [(name, {})]
        seen = set()
        while pending:
            current, literals = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            found.extend(wrap for wrap in own.get(current, ()) if not (wrap.method == "__init__" and wrap.ruled_out_by(literals)))
            for info in classes.get(current, ()):
                pending.extend((base, base_init_literals(classes, current, base)) for base in info.bases)
        if found:
            result[name] = tuple(found)
    return result


def base_init_literals(classes: Mapping[str, List[ClassInfo]], name: str, base: str) -> Mapping[str, object]:
    """The constants the class `name` passes to `base.__init__` by keyword: its `super().__init__` call
    goes to its first base. Nothing where the project has several classes of that name."""
    infos = classes.get(name, ())
    if len(infos) != 1 or not infos[0].bases or infos[0].bases[0] != base:
        return {}
    return dict(infos[0].base_init_literals)


def _prefixes(module: str) -> Iterable[str]:
    parts = module.split(".")
    return (".".join(parts[: i + 1]) for i in range(len(parts)))


# ----- distributed programs (DDP, torchrun) ------------------------------------------------------------

_STARTS_PROCESS_GROUP = GuardedPattern(r"(?<!def )\binit_process_group[ \t]*\(", ["init_process_group"], one_line=True)
_WRAPS_DISTRIBUTED = GuardedPattern(
    r"\b(?:DistributedDataParallel|DDP|FullyShardedDataParallel|FSDP|fully_shard)[ \t]*\(",
    ["DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "fully_shard"],
    one_line=True,
)
_SETS_EPOCH = GuardedPattern(r"\.set_epoch[ \t]*\(|\bdef[ \t]+set_epoch\b", ["set_epoch"])
_EPOCH_LOOP = GuardedPattern(r"^[ \t]*(?:async[ \t]+)?(?:for|while)\b[^\n#]*epoch", ["poch"], re.M | re.I, one_line=True)
# `torch.cuda.set_device(local_rank)`, `init_process_group(device_id=...)`, `f"cuda:{local_rank}"`,
# `torch.device("cuda", rank)`, `.cuda(local_rank)`, `.to(rank)`: the rank's own GPU is chosen somewhere.
_SELECTS_DEVICE = GuardedPattern(
    r"set_device[ \t]*\(|device_id[ \t]*=|cuda:\{|cuda:%|[\"']cuda:[\"'][ \t]*\+|:\{[\w.]*rank\w*\}|"
    r"device\([ \t]*[\"']cuda[\"'][ \t]*,|\.(?:cuda|to)\([ \t]*[\w.]*rank\b|"
    # DDP's device_ids from a variable (`device_ids=[self.gpu_id]`): a literal would be the same GPU everywhere.
    r"device_ids[ \t]*=[ \t]*\[[ \t]*[A-Za-z_]|"
    # Each rank sees one GPU of its own (`os.environ["CUDA_VISIBLE_DEVICES"] = str(rank % 8)`).
    r"CUDA_VISIBLE_DEVICES[\"'][ \t]*\][ \t]*=[^\n]*rank",
    ["set_device", "device_id", "cuda", "rank", "device_ids", "CUDA_VISIBLE_DEVICES"],
    one_line=True,
)
_READS_LOCAL_RANK_ENV = GuardedPattern(r"[\"']LOCAL_RANK[\"']", ["LOCAL_RANK"])
# The code says it runs on several nodes: it reads a variable only a multi-node launcher sets (a node's
# rank; SLURM's or MPI's global rank), or takes a node count or a node's rank on its command line.
_NAMES_SEVERAL_NODES = GuardedPattern(
    r"[\"'](?:NODE_RANK|GROUP_RANK|SLURM_NODEID|SLURM_PROCID|SLURM_NNODES|SLURM_JOB_NUM_NODES|OMPI_COMM_WORLD_RANK|PMI_RANK)[\"']"
    r"|[\"']--(?:n_?nodes|num[_-]nodes|node[_-]rank|nr)[\"']",
    ["NODE", "SLURM", "OMPI", "PMI_RANK", "GROUP_RANK", "nodes", "node_rank", "node-rank", "--nr"],
)
_SHARDS_EVALUATION = GuardedPattern(r"DistributedSampler\((?:[^()]|\([^()]*\))*\bshuffle[ \t]*=[ \t]*False", ["DistributedSampler"])
# A tensor or module placed on a GPU by the program itself (the NCCL backend alone places nothing).
_PLACES_ON_GPU = GuardedPattern(r"\.cuda\(|[\"']cuda\b", ["cuda"], one_line=True)
_NCCL = GuardedPattern(r"nccl\b", ["nccl"], one_line=True)
_DISTRIBUTED_WORDS = (
    "istributed", "DDP", "FSDP", "fully_shard", "epoch", "LOCAL_RANK", "local_rank", "cuda", "set_device", "spawn",
    "start_processes", "deepspeed", "__main__",
)
# Frameworks that build the sampler, call `set_epoch` and own the device placement themselves.
TRAINER_FRAMEWORKS = frozenset({"pytorch_lightning", "lightning", "lightning_fabric", "accelerate"})


@dataclass(frozen=True)
class DistributedFileFacts:
    """What one file says about a distributed program (a regex scan: pass 1 runs on every file)."""

    starts_process_group: bool = False
    wraps_model: bool = False  # DDP or FSDP
    sets_epoch: bool = False
    epoch_loop: bool = False
    selects_device: bool = False
    reads_local_rank_env: bool = False
    names_several_nodes: bool = False  # see `_NAMES_SEVERAL_NODES`
    shards_evaluation: bool = False  # a DistributedSampler with shuffle=False: evaluation is sharded
    uses_cuda: bool = False
    places_on_gpu: bool = False
    # The parsed `--local_rank` is read: `args.local_rank` loaded, or `para["local_rank"]`.
    reads_local_rank_argument: bool = False
    # The local rank has a source besides `--local_rank`: see `_local_rank_uses`.
    other_local_rank_source: bool = False
    # Top-level functions that return whether this process is a given rank (`def is_primary(): return
    # get_rank() == 0`): a test on their result runs on some ranks only.
    rank_predicates: Tuple[str, ...] = ()
    # A script: `if __name__ == "__main__":`.
    entry: bool = False
    # The file's own code starts a process group or wraps a model in DDP/FSDP when it runs: at module
    # level, under its `__main__` guard, or in a function of the file called from there.
    starts_on_run: bool = False
    # Its top-level functions and classes that start a group or wrap a model when called (`setup()`).
    starter_names: Tuple[str, ...] = ()
    # For a script: the names it calls (`setup(`, `trainer.fit(`) or imports by name, to match other
    # files' starters.
    run_calls: Tuple[str, ...] = ()
    # For a script: the modules its functions import when they run.
    lazy_imports: Tuple[str, ...] = ()


def scan_distributed(text: str, parse: Optional[Callable[[], Optional[ast.Module]]] = None) -> Optional[DistributedFileFacts]:
    if not any(word in text for word in _DISTRIBUTED_WORDS):
        return None
    # One parse serves every scan: parsing torch's distributed modules is most of what they cost.
    parse = parse or cache(partial(_parse, text))
    reads_argument, other_source = _local_rank_uses(text, parse)
    starts = _STARTS_PROCESS_GROUP.search(text) is not None
    wraps = _WRAPS_DISTRIBUTED.search(text) is not None
    starts_on_run, starters = _group_starts(parse) if starts or wraps else (False, ())
    entry = _MAIN_GUARD.search(text) is not None
    places_on_gpu = _PLACES_ON_GPU.search(text) is not None
    facts = DistributedFileFacts(
        reads_local_rank_argument=reads_argument,
        other_local_rank_source=other_source,
        rank_predicates=_rank_predicates(text),
        starts_process_group=starts,
        wraps_model=wraps,
        entry=entry,
        starts_on_run=starts_on_run,
        starter_names=starters,
        run_calls=_run_calls(text) if entry or _MODULE_LEVEL_CALL.search(text) else (),
        sets_epoch=_SETS_EPOCH.search(text) is not None,
        epoch_loop=_EPOCH_LOOP.search(text) is not None,
        selects_device=_SELECTS_DEVICE.search(text) is not None,
        reads_local_rank_env=_READS_LOCAL_RANK_ENV.search(text) is not None,
        names_several_nodes=_NAMES_SEVERAL_NODES.search(text) is not None,
        shards_evaluation=_SHARDS_EVALUATION.search(text) is not None,
        uses_cuda=places_on_gpu or _NCCL.search(text) is not None,
        places_on_gpu=places_on_gpu,
    )
    return facts if facts != DistributedFileFacts() else None


_MAIN_GUARD = re.compile(r"^[ \t]*if[ \t]+__name__[ \t]*==[ \t]*[\"']__main__[\"']", re.M)
# A call statement at module level (`main()`, `utils.init_training(args)`): the file may be a script.
_MODULE_LEVEL_CALL = re.compile(r"^[A-Za-z_][\w.]*[ \t]*\(", re.M)
_CALLED_NAME = re.compile(r"(?<!def )(?<!class )\b([A-Za-z_]\w*)[ \t]*\(")
_BUILTIN_NAMES = frozenset(dir(builtins))
_GROUP_STARTS = frozenset({"init_process_group", "DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "fully_shard"})


def _run_calls(text: str) -> Tuple[str, ...]:
    """The names a script calls, and those it imports by name (`spawn(train_distributed, ...)` passes
    the function it imported rather than calling it)."""
    names = set(_CALLED_NAME.findall(text))
    for pattern in (_IMPORT_LINE, _INDENTED_IMPORT_LINE):
        for match in pattern.finditer("\n" + text):
            for item in (match.group("imported") or "").split(","):
                words = item.split()
                if words:
                    names.add(words[0])
    return tuple(sorted(names - _BUILTIN_NAMES))


# `self.submodule = nn.Linear(...)`, `self.module = Block(...)`: a submodule whose name ends in `module`.
_MODULE_ATTRIBUTE = re.compile(r"\bself\.(\w*module)[ \t]*(?::[^=\n]*)?=(?!=)[ \t]*(?:[\w.]+\.)?[A-Z]\w*\(")
_READS_CHECKPOINT = re.compile(r"\b(?:torch\.load|load_checkpoint|load_state_dict_from_url|load_url|safetensors|load_file)\b|\bload\(")
# The `module.` prefix handled by the loading function: stripped (any spelling), or the library's helper.
_HANDLES_PREFIX = re.compile(
    r"""["']module\.?["']|\[\s*7\s*:|split\(\s*["']\.["']\s*\)\s*\[\s*1\s*:|consume_prefix_in_state_dict_if_present|remove_prefix|strip_prefix"""
)
# What torch builds that has a `load_state_dict` of its own but no module keys: optimizers, schedulers, scalers.
_TORCH_STATE_CLASSES = frozenset(
    {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "LBFGS", "SparseAdam", "ASGD", "Rprop", "GradScaler"}
)
_WRAPPER_NAMES = ("DataParallel", "DistributedDataParallel", "DDP")


_SYS_PATH_CHANGE = GuardedPattern(r"sys\.path\.(?:insert|append)[ \t]*\(([^\n]*)", ["sys.path"], one_line=True)
_STRING = re.compile(r"""["']([^"'\n]+)["']""")


def _sys_path_names(text: str) -> Tuple[str, ...]:
    """The last folder names of the paths the file adds to `sys.path` (`"subtools/pytorch"`, `os.path.join(here, "..", "lib")`)."""
    found = set()
    for match in _SYS_PATH_CHANGE.finditer(text):
        parts = [part for literal in _STRING.findall(match.group(1)) for part in re.split(r"[/\\]", literal) if part not in ("", ".", "..")]
        if parts:
            found.add(parts[-1])
    return tuple(sorted(found))


def _module_attributes(text: str, parse: Callable[[], Optional[ast.Module]]) -> Tuple[str, ...]:
    """The submodules the file's classes build under a name ending in `module` (`self.submodule = nn.Linear(...)`)."""
    if _MODULE_ATTRIBUTE.search(text) is None:
        return ()
    tree = parse()
    if tree is None:
        return ()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr.endswith("module") and isinstance(target.value, ast.Name) and target.value.id == "self":
                    found.add(target.attr)
    return tuple(sorted(found))


def scan_checkpoint_loads(text: str, path: str, parse: Callable[[], Optional[ast.Module]]) -> Tuple[Tuple[CheckpointLoad, ...], Tuple[str, ...]]:
    """Each `x.load_state_dict(...)` of a function that reads a checkpoint file, with what the model
    is there (read from the function's statements in order, and for `self.x` from its class's
    `__init__`) and whether the function copes with either kind of keys; and the names of the
    functions that strip the `module.` prefix."""
    if not (_HANDLES_PREFIX.search(text) or ("load_state_dict" in text and _READS_CHECKPOINT.search(text))):
        return (), ()
    tree = parse()
    if tree is None:
        return (), ()
    lines = text.splitlines()
    found: List[CheckpointLoad] = []
    helpers: Set[str] = set()
    for function, owner in _functions_with_classes(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            source = "\n".join(lines[function.lineno - 1 : function.end_lineno])
            if _HANDLES_PREFIX.search(source):
                helpers.add(function.name)
        else:
            source = text
        if "load_state_dict" not in source or not _READS_CHECKPOINT.search(source):
            continue
        handles = _HANDLES_PREFIX.search(source) is not None if source is not text else None
        wrapped_in_init = _wrapped_in_init(owner) if owner is not None else set()
        classes: Dict[str, str] = {}
        for statement, wrapped, in_try_with_wrap in _statements_with_wraps(function.body):  # type: ignore[attr-defined]
            for name, class_name, _ in _model_assignments(statement):
                if class_name:
                    classes[name] = class_name
            for call in _own_calls(statement):
                func = call.func
                if not (isinstance(func, ast.Attribute) and func.attr == "load_state_dict"):
                    continue
                receiver = _ast_dotted(func.value) or ""
                if classes.get(receiver) in _TORCH_STATE_CLASSES or classes.get(receiver, "").endswith("LR"):
                    continue  # `optimizer.load_state_dict(checkpoint["optimizer"])`: not a model's keys
                into_wrapper = not receiver.endswith(".module") and (receiver in wrapped or receiver in wrapped_in_init)
                model = classes.get(receiver.removesuffix(".module"), "") or (_self_class_of(owner, receiver) if owner else "")
                if handles is None:  # at the top level: the statement around the load, not the whole file
                    around = next(top for top in tree.body if top.lineno <= call.lineno <= (top.end_lineno or top.lineno))
                    copes = _HANDLES_PREFIX.search("\n".join(lines[around.lineno - 1 : around.end_lineno])) is not None
                else:
                    copes = handles
                through = tuple(
                    sorted({(_ast_dotted(inner.func) or "").rpartition(".")[2] for argument in call.args for inner in ast.walk(argument) if isinstance(inner, ast.Call)} - {""})
                )
                found.append(CheckpointLoad(path, call.lineno, model, into_wrapper, copes or in_try_with_wrap, through))
    return tuple(found), tuple(sorted(helpers))


def _saved_files(text: str, package: str, parse: Callable[[], Optional[ast.Module]]) -> SavedFiles:
    # The file names its top level holds are read wherever the file is parsed anyway (for its execution
    # summary): a module of constants is imported by the one that loads.
    calls = io_call_lines(text)
    parsed = parse.cache_info().currsize > 0  # type: ignore[attr-defined]
    tree = parse() if calls or parsed else None
    return SavedFiles() if tree is None else scan_saved_files(tree, lambda: _Names.of(tree, package, module_level=True).qualify, calls)


def _functions_with_classes(tree: ast.Module) -> Iterator[Tuple[ast.AST, Optional[ast.ClassDef]]]:
    """The module's top level and every function, each with the class it is a method of."""
    yield tree, None
    pending: List[Tuple[ast.AST, Optional[ast.ClassDef]]] = [(node, None) for node in tree.body]
    while pending:
        node, owner = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, owner
            pending.extend((child, None) for child in node.body)
        elif isinstance(node, ast.ClassDef):
            pending.extend((child, node) for child in node.body)
        elif isinstance(node, ast.stmt):
            pending.extend((child, owner) for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))


def _statements_with_wraps(body: Sequence[ast.stmt], wrapped: FrozenSet[str] = frozenset(), in_try: bool = False) -> Iterator[Tuple[ast.stmt, FrozenSet[str], bool]]:
    """The statements of a block in order (not of nested functions), each with the names wrapped on
    every path to it (a wrap inside a branch holds in that branch only), and whether it is in a `try`
    whose handler wraps the model (a retry after wrapping)."""
    for statement in body:
        yield statement, wrapped, in_try
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name, _, is_wrap in _model_assignments(statement):
            wrapped = wrapped | {name} if is_wrap else wrapped - {name}
        if isinstance(statement, ast.Try) or type(statement).__name__ == "TryStar":
            wraps = any(_wrap_name(node) for handler in statement.handlers for node in ast.walk(handler))  # type: ignore[attr-defined]
            yield from _statements_with_wraps(statement.body, wrapped, in_try or wraps)  # type: ignore[attr-defined]
            for block in (*(h.body for h in statement.handlers), statement.orelse, statement.finalbody):  # type: ignore[attr-defined]
                yield from _statements_with_wraps(block, wrapped, in_try)
        else:
            for name in ("body", "orelse"):
                yield from _statements_with_wraps(getattr(statement, name, ()), wrapped, in_try)


def _own_calls(statement: ast.stmt) -> Iterator[ast.Call]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    roots = [statement.test] if isinstance(statement, (ast.If, ast.While)) else [] if hasattr(statement, "body") else [statement]
    for root in roots:
        for node in ast.walk(root):
            if isinstance(node, ast.Call):
                yield node


def _wrap_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (_ast_dotted(node.func) or "").rpartition(".")[2] in _WRAPPER_NAMES


def _model_assignments(statement: ast.stmt) -> Iterator[Tuple[str, str, bool]]:
    """(name, the class it is built from or "", whether it is a wrap) for `x = Net(...)`, `x = nn.DataParallel(x)`."""
    if not isinstance(statement, ast.Assign):
        return
    value = statement.value
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in ("cuda", "to", "cpu", "eval", "train", "half", "float"):
        value = value.func.value
    if value is not statement.value and [_ast_dotted(target) for target in statement.targets] == [_ast_dotted(value)]:
        return  # `net = net.cuda()`: a module's move returns the module, wrapped or not
    is_wrap = _wrap_name(value)
    inner = value.args[0] if is_wrap and isinstance(value, ast.Call) and value.args else value
    while isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr in ("cuda", "to", "cpu", "half", "float"):
        inner = inner.func.value
    class_name = ""  # the class, or the function, the model is built by (as the wrap facts name it)
    if isinstance(inner, ast.Call):
        last = (_ast_dotted(inner.func) or "").rpartition(".")[2]
        if last and last not in _WRAPPER_NAMES and last not in MODULE_RETURNING_METHODS:
            class_name = last
    for target in statement.targets:
        name = _ast_dotted(target)
        if name is not None:
            yield name, class_name, is_wrap


def _wrapped_in_init(owner: ast.ClassDef) -> Set[str]:
    """`self.x` that the class's `__init__` wraps on every path."""
    for member in owner.body:
        if isinstance(member, ast.FunctionDef) and member.name == "__init__":
            return {name for statement in member.body for name, _, is_wrap in _model_assignments(statement) if is_wrap}
    return set()


def _self_class_of(owner: ast.ClassDef, receiver: str) -> str:
    """The class `self.x` is built from in any method of its class."""
    for member in owner.body:
        if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for statement, _, _ in _statements_with_wraps(member.body):
                for name, class_name, _ in _model_assignments(statement):
                    if name == receiver.removesuffix(".module") and class_name:
                        return class_name
    return ""


def _execution_summary(text: str, module_name: str, package: str, parse: Callable[[], Optional[ast.Module]]) -> Optional["ExecutionSummary"]:
    """The summary of a file for the programs' calls."""
    from dplint.analysis.execution import summarize  # imported by a cold pass only: a warm run never needs it

    tree = parse()
    if tree is None:
        return None
    try:
        return summarize(tree, module_name, package)
    except RecursionError:
        return None


def _unparsed() -> Optional[ast.Module]:
    return None


def _parse(text: str) -> Optional[ast.Module]:
    """The file's `ast`, or None when it does not parse."""
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _group_starts(parse: Callable[[], Optional[ast.Module]]) -> Tuple[bool, Tuple[str, ...]]:
    """Whether the file's code, when it runs, starts a process group or wraps a model in DDP/FSDP (a
    call, not a comment or a string), and which of its top-level functions and classes do when called.
    Calls inside the file are followed by name: `main()` under the `__main__` guard calling `setup()`."""
    tree = parse()
    if tree is None:
        return False, ()

    def called(node: ast.AST) -> Set[str]:
        names = set()
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call):
                func = inner.func
                names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
        return names

    tops = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    calls = {name: called(node) for name, node in tops.items()}
    reach = {name for name, names in calls.items() if names & _GROUP_STARTS}
    changed = True
    while changed:
        grown = {name for name, names in calls.items() if name not in reach and names & reach}
        reach |= grown
        changed = bool(grown)
    run = set().union(*(called(n) for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))))
    return bool(run & (_GROUP_STARTS | reach)), tuple(sorted(reach))


# `dist.get_rank()`, and Horovod's `hvd.rank()`/`hvd.local_rank()`.
_RANK_CALLS = frozenset({"get_rank", "get_local_rank", "get_global_rank", "get_node_local_rank", "rank", "local_rank"})
# An argument-less top-level function with its body: the `def` line and the indented or blank lines after it.
_PREDICATE_DEF = re.compile(r"^def[ \t]+\w+[ \t]*\([ \t]*\)[^\n]*\n(?:[ \t]+[^\n]*\n|[ \t]*\n)*", re.M)


def _rank_predicates(text: str) -> Tuple[str, ...]:
    """Argument-less top-level functions that tell whether this process is a given rank: every
    `return` compares a rank with a constant (`return get_rank() == 0`, `return dist.get_rank() == 0 if
    dist.is_initialized() else True`), or returns True or False where one of them stands under such a
    test (`if dist.get_rank() == 0: return True` ... `return False`)."""
    if "rank" not in text:
        return ()
    found = []
    # Only the candidate functions are parsed: the whole file would cost seconds over torch's sources.
    for match in _PREDICATE_DEF.finditer(text):
        if "rank" not in match.group():
            continue
        try:
            function = ast.parse(match.group()).body[0]
        except (SyntaxError, ValueError, RecursionError, MemoryError, IndexError):
            continue
        if not isinstance(function, ast.FunctionDef) or function.args.args or function.args.posonlyargs:
            continue
        returns = [node.value for node in ast.walk(function) if isinstance(node, ast.Return) and node.value is not None]
        if returns and all(_compares_rank(value) for value in returns):
            found.append(function.name)
        elif returns and all(isinstance(value, ast.Constant) and isinstance(value.value, bool) for value in returns):
            tests = [node.test for node in ast.walk(function) if isinstance(node, ast.If)]
            if any(_compares_rank(test) for test in tests):
                found.append(function.name)
    return tuple(found)


def _compares_rank(expr: ast.expr) -> bool:
    if isinstance(expr, ast.IfExp):
        return _compares_rank(expr.body) or _compares_rank(expr.orelse)
    if not isinstance(expr, ast.Compare):
        return False
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in _RANK_CALLS:
                return True
    return False


def _copies_local_rank_argument(value: ast.expr) -> bool:
    """`args.local_rank`, `cmd.get("local_rank", 0)`: the parsed argument again, not a new source (a
    plain name `local_rank` may hold anything, `dist.get_rank() % n` as often as the argument)."""
    return any(
        (isinstance(node, ast.Attribute) and node.attr == "local_rank") or (isinstance(node, ast.Constant) and node.value == "local_rank")
        for node in ast.walk(value)
    )


def _value_assigned_to_local_rank(node: ast.Assign) -> Optional[ast.expr]:
    """What `x.local_rank = value` assigns, also as one of several targets: the matching element of a
    tuple, or a call's whole result (`args.local_rank, args.rank = get_envs()`). None where no target
    names the local rank, or the part it gets is not known (`..., opt.local_rank = x, *saved`)."""
    target, value = node.targets[0], node.value
    if _names_local_rank(target):
        return value
    if not isinstance(target, (ast.Tuple, ast.List)):
        return None
    for index, element in enumerate(target.elts):
        if _names_local_rank(element):
            if isinstance(value, ast.Call):
                return value
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                part = value.elts[index]
                return None if any(isinstance(each, ast.Starred) for each in value.elts) else part
    return None


def _names_local_rank(target: ast.expr) -> bool:
    """`x.local_rank` or `x["local_rank"]`."""
    if isinstance(target, ast.Attribute):
        return target.attr == "local_rank"
    return isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and target.slice.value == "local_rank"


# Launchers that start each rank with `--local_rank=N` on the command line, so the argument is set.
_LOCAL_RANK_PASSING_LAUNCHERS = frozenset({"deepspeed"})
_SPAWNERS = frozenset({"spawn", "start_processes"})


# What `_local_rank_uses` looks for, in text: a file with none of it is not parsed.
_LOCAL_RANK_HINT = GuardedPattern(
    r"local_rank|deepspeed|\bspawn[ \t]*\(|start_processes[ \t]*\(|%[ \t]*[\w.]*device_count[ \t]*\(",
    ["local_rank", "deepspeed", "spawn", "start_processes", "device_count"],
)


def _local_rank_uses(text: str, parse: Callable[[], Optional[ast.Module]]) -> Tuple[bool, bool]:
    """Whether the code (not its comments or strings) reads a parsed `local_rank`, and whether it has
    another source of the local rank: the attribute overwritten (`args.local_rank = dist.get_rank() %
    n`), a fallback (`args.local_rank or rank % torch.cuda.device_count()`), a rank taken modulo the
    device count, `mp.spawn`'s process index, or a launcher that passes `--local_rank` (DeepSpeed)."""
    if _LOCAL_RANK_HINT.search(text) is None:
        return False, False
    tree = parse()
    if tree is None:
        return False, False
    reads = other = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "local_rank":
            reads = reads or isinstance(node.ctx, ast.Load)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "local_rank":
            reads = reads or isinstance(node.ctx, ast.Load)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and (value := _value_assigned_to_local_rank(node)) is not None:
            # `args.local_rank = dist.get_rank() % n` replaces it; `cfg.local_rank = args.local_rank` copies it.
            other = other or not _copies_local_rank_argument(value)
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            other = other or any(isinstance(v, ast.Attribute) and v.attr == "local_rank" for v in node.values[:-1])
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            right = node.right
            other = other or (isinstance(right, ast.Call) and isinstance(right.func, ast.Attribute) and right.func.attr == "device_count")
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            other = other or name in _SPAWNERS
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            other = other or any(module.split(".")[0] in _LOCAL_RANK_PASSING_LAUNCHERS for module in modules)
    return reads, other


@dataclass(frozen=True)
class DistributedProgram:
    """What the files of one program (or of several that share files) say, merged."""

    sets_epoch: bool = False
    selects_device: bool = False
    reads_local_rank_env: bool = False
    trainer_framework: bool = False
    epoch_loop: bool = False
    wraps_model: bool = False
    shards_evaluation: bool = False
    uses_cuda: bool = False
    places_on_gpu: bool = False
    reads_local_rank_argument: bool = False
    other_local_rank_source: bool = False
    names_several_nodes: bool = False

    @classmethod
    def merge(cls, files: Iterable[FileFacts]) -> "DistributedProgram":
        files = list(files)
        facts = [f.distributed for f in files if f.distributed is not None]
        return cls(
            sets_epoch=any(f.sets_epoch for f in facts),
            selects_device=any(f.selects_device for f in facts),
            # A read of `LOCAL_RANK` that picks this rank's device or joins the group (not a download
            # guard in a checkpoint helper).
            reads_local_rank_env=any(f.reads_local_rank_env and (f.selects_device or f.starts_process_group) for f in facts),
            trainer_framework=any(name.split(".")[0] in TRAINER_FRAMEWORKS for f in files for name in f.imports),
            epoch_loop=any(f.epoch_loop for f in facts),
            wraps_model=any(f.wraps_model for f in facts),
            shards_evaluation=any(f.shards_evaluation for f in facts),
            uses_cuda=any(f.uses_cuda for f in facts),
            places_on_gpu=any(f.places_on_gpu for f in facts),
            reads_local_rank_argument=any(f.reads_local_rank_argument for f in facts),
            other_local_rank_source=any(f.other_local_rank_source for f in facts),
            names_several_nodes=any(f.names_several_nodes for f in facts),
        )


@dataclass(frozen=True)
class DistributedProject:
    """The distributed programs of the project.

    A program that starts a process group (or wraps a model in DDP/FSDP) spans the script, what it
    imports, and what imports it (`train.py` imports the trainer module that starts the group). Seeds
    in one folder make one program; two projects linted together stay two programs.
    """

    programs: Tuple[DistributedProgram, ...] = ()
    membership: Mapping[str, Tuple[int, ...]] = field(default_factory=dict)  # filename → its programs

    def companions(self, filename: str) -> Tuple[str, ...]:
        """The files of the programs this file belongs to (itself alone when it belongs to none)."""
        indexes = set(self.membership.get(filename, ()))
        if not indexes:
            return (filename,)
        return tuple(sorted(name for name, owned in self.membership.items() if indexes.intersection(owned)))

    def program_of(self, filename: str) -> Optional[DistributedProgram]:
        """The merged facts of the programs this file belongs to; None when it belongs to none."""
        indexes = self.membership.get(filename)
        if not indexes:
            return None
        programs = [self.programs[i] for i in indexes]
        return DistributedProgram(*(any(getattr(p, name) for p in programs) for name in DistributedProgram.__dataclass_fields__))


def distributed_project(files: Mapping[str, FileFacts], index: ModuleIndex) -> DistributedProject:
    """The programs that start a process group: seeded by the files whose own run starts one (at module
    level, or from their `__main__` guard through their own functions), and by the scripts that call a
    function or class of a file they import (directly or through other project modules) that starts
    one, and by a file nothing in the project imports whose functions start one (they are run from
    outside: a console script, a launcher). A module the project imports for something else (a collate
    function beside an `init_distributed_mode` no script of this program calls) starts nothing."""
    if not any(f.distributed is not None and (f.distributed.starts_on_run or f.distributed.starter_names) for f in files.values()):
        return DistributedProject()
    imported_by, imports_of = _import_graph(files, index)
    seeds_by_folder: Dict[str, Set[str]] = {}
    for filename, facts in files.items():
        own = facts.distributed
        if own is not None and _seeds_a_program(filename, own, files, imported_by, imports_of):
            seeds_by_folder.setdefault(os.path.dirname(filename), set()).add(filename)
    if not seeds_by_folder:
        return DistributedProject()
    programs: List[DistributedProgram] = []
    membership: Dict[str, List[int]] = {}
    for folder in sorted(seeds_by_folder):
        seeds = seeds_by_folder[folder]
        # A module that starts the group when imported runs in every script that imports it; a script
        # runs alone (a test runner importing every test file is not their program).
        imported = {f for f in seeds if not (files[f].distributed and files[f].distributed.entry)}
        members = _reachable(seeds | _reachable(imported, imported_by), imports_of)
        for filename in members:
            membership.setdefault(filename, []).append(len(programs))
        programs.append(DistributedProgram.merge(files[filename] for filename in members))
    return DistributedProject(tuple(programs), {filename: tuple(value) for filename, value in membership.items()})


def _seeds_a_program(
    filename: str, own: DistributedFileFacts, files: Mapping[str, FileFacts], imported_by: Mapping[str, Set[str]], imports_of: Mapping[str, Set[str]]
) -> bool:
    if own.starts_on_run:
        return True
    if own.starter_names and filename not in imported_by:
        return True  # nothing in the project imports its functions: they run from outside (a console script)
    if not (own.entry or (own.run_calls and filename not in imported_by)):
        return False  # a module imported by others, not a script
    closure = _reachable({filename}, imports_of)
    starters = {name for member in closure if (found := files[member].distributed) is not None for name in found.starter_names}
    return not starters.isdisjoint(own.run_calls)


def _import_graph(files: Mapping[str, FileFacts], index: ModuleIndex) -> Tuple[Dict[str, Set[str]], Dict[str, Set[str]]]:
    """Import edges between the project's files, each import resolved as Python would for its file."""
    imported_by: Dict[str, Set[str]] = {}
    imports_of: Dict[str, Set[str]] = {}
    for filename, facts in files.items():
        lazy = facts.distributed.lazy_imports if facts.distributed is not None else ()
        for imported in (*facts.imports, *lazy):
            if is_torch_module(imported):
                continue
            for target in index.resolve_chain(imported, filename):
                if target != filename:
                    imported_by.setdefault(target, set()).add(filename)
                    imports_of.setdefault(filename, set()).add(target)
    return imported_by, imports_of


def _reachable(start: Iterable, edges: Mapping) -> Set:
    found = set(start)
    pending = list(found)
    while pending:
        for successor in edges.get(pending.pop(), ()):
            if successor not in found:
                found.add(successor)
                pending.append(successor)
    return found
