"""Project-level facts, collected from every linted file before any rule runs.

Some pitfalls span files: `train.py` wraps in DataParallel the class that `models/crnn.py` defines,
and `import models` imports torch when `models/__init__.py` does. The first pass reads each file
cheaply (a regex for imports, Python's own `ast` only where DataParallel or `forward` appears) and
the facts are merged into one `ProjectFacts` that the rules of the second pass consult.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import (
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

# Third-party packages that import torch when imported; importing one counts as importing torch.
TORCH_LIBRARIES = frozenset(
    """torch torchvision torchaudio torchtext torchdata torchmetrics pytorch_lightning lightning
    lightning_fabric accelerate timm deepspeed torch_geometric torch_scatter torch_sparse fairseq
    detectron2 mmcv mmdet mmengine apex diffusers peft transformers sentence_transformers kornia
    monai fastai ignite xformers flash_attn vllm bitsandbytes ultralytics trl dgl""".split()
)

DATA_PARALLEL = frozenset(
    {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"}
)
# Methods that return the module they are called on, so `DataParallel(Net().cuda())` still wraps a Net.
MODULE_RETURNING_METHODS = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval"})

_IMPORT_LINE = re.compile(
    r"^(?:import[ \t]+(?P<names>[\w. \t,]+)|from[ \t]+(?P<dots>\.*)(?P<module>[\w.]*)[ \t]+import[ \t]+\(?(?P<imported>[\w. \t,]*))",
    re.M,
)


def is_torch_module(name: str) -> bool:
    return name.split(".")[0] in TORCH_LIBRARIES


@dataclass(frozen=True)
class Wrap:
    """`nn.DataParallel(ClassName(...), dim=dim)` at path:line (dim None when not a literal)."""

    class_name: str
    dim: Optional[int]
    path: str
    line: int
    # The module the wrapping file takes the class from (None: not resolvable), and that file's folder.
    module: Optional[str] = None
    directory: str = ""

    def can_mean(self, module_name: str, filename: str) -> bool:
        """Whether the wrapped class can be the one of that name defined in `module_name` (at `filename`).

        Package roots differ between how the tree is linted and how it runs, so either dotted name may
        be a suffix of the other; `from models import CRNN` may re-export `models.crnn.CRNN`. Two
        top-level script modules are the same only side by side: Python finds `model.py` beside the script.
        """
        if self.module is None:
            return True
        wrapped, defined = self.module.split("."), module_name.split(".")
        if len(wrapped) == 1 and len(defined) == 1:
            return wrapped == defined and os.path.dirname(os.path.abspath(filename)) == self.directory
        shorter = min(len(wrapped), len(defined))
        return wrapped[-shorter:] == defined[-shorter:] or defined[: len(wrapped)] == wrapped


@dataclass(frozen=True)
class ClassInfo:
    name: str
    bases: Tuple[str, ...]
    defines_forward: bool


@dataclass(frozen=True)
class FileFacts:
    module_name: str
    imports: Tuple[str, ...] = ()
    classes: Tuple[ClassInfo, ...] = ()
    wraps: Tuple[Wrap, ...] = ()
    distributed: Optional["DistributedFileFacts"] = None
    directory: str = ""  # the file's folder: tells apart same-named top-level scripts of two projects

    @property
    def imports_torch_directly(self) -> bool:
        return any(is_torch_module(name) for name in self.imports)

    @property
    def class_names(self) -> Tuple[str, ...]:
        return tuple(info.name for info in self.classes)


@lru_cache(maxsize=None)
def _is_package(directory: Path) -> bool:
    return (directory / "__init__.py").is_file()


def module_identity(path: Path) -> Tuple[str, str]:
    """The dotted module name of a file, and the package its relative imports start from."""
    is_package = path.stem == "__init__"
    parts = [] if is_package else [path.stem]
    directory = path.parent
    while _is_package(directory):
        parts.insert(0, directory.name)
        if directory.parent == directory:
            break
        directory = directory.parent
    name = ".".join(parts) or path.stem
    return name, name if is_package else name.rpartition(".")[0]


def absolute_module(package: str, level: int, module: str) -> str:
    """The module `from <level dots><module> import …` names, seen from `package`."""
    if not level:
        return module
    parts = package.split(".") if package else []
    parts = parts[: max(0, len(parts) - (level - 1))]
    return ".".join(p for p in (*parts, module) if p)


def scan_imports(text: str, package: str) -> Tuple[str, ...]:
    """Modules imported by unindented (module-level) import statements."""
    found: List[str] = []
    for match in _IMPORT_LINE.finditer(text):
        if match.group("names") is not None:
            for item in match.group("names").split(","):
                words = item.split()
                if words:
                    found.append(words[0])
            continue
        base = absolute_module(package, len(match.group("dots")), match.group("module"))
        if base:
            found.append(base)
        if match.group("dots") or not match.group("module"):
            # `from . import crnn` imports the submodule `pkg.crnn`.
            for item in match.group("imported").split(","):
                words = item.split()
                if words:
                    found.append(f"{base}.{words[0]}" if base else words[0])
    return tuple(dict.fromkeys(found))


def collect_file_facts(text: str, module_name: str, package: str, path: str) -> FileFacts:
    imports = scan_imports(text, package)
    distributed = scan_distributed(text)
    directory = os.path.dirname(os.path.abspath(path))
    if "DataParallel" not in text and "def forward" not in text:
        return FileFacts(module_name, imports, distributed=distributed, directory=directory)
    classes = scan_classes(text)
    if "DataParallel" not in text:
        return FileFacts(module_name, imports, classes, distributed=distributed, directory=directory)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return FileFacts(module_name, imports, classes, distributed=distributed, directory=directory)
    visitor = _WrapVisitor(path, module_name, package, {info.name for info in classes})
    visitor.visit(tree)
    return FileFacts(module_name, imports, classes, tuple(visitor.wraps), distributed, directory)


_CLASS_OR_FORWARD = re.compile(
    r"^(?P<indent>[ \t]*)(?:class[ \t]+(?P<name>\w+)[ \t]*(?:\((?P<bases>[^)]*)\))?[ \t]*:|(?:async[ \t]+)?def[ \t]+forward\b)",
    re.M,
)


def scan_classes(text: str) -> Tuple[ClassInfo, ...]:
    """Classes with their base names and whether they define `forward`, read from the text by indentation.

    A regex over the lines is ~20x cheaper than a parse, and every file needs this pass.
    """
    found: List[List] = []  # [name, bases, defines_forward, indent]
    open_classes: List[List] = []
    for match in _CLASS_OR_FORWARD.finditer(text):
        indent = len(match.group("indent").expandtabs())
        while open_classes and open_classes[-1][3] >= indent:
            open_classes.pop()
        if match.group("name") is None:
            if open_classes:
                open_classes[-1][2] = True
            continue
        bases = tuple(
            base.strip().rpartition(".")[2]
            for base in (match.group("bases") or "").split(",")
            if base.strip() and "=" not in base and re.fullmatch(r"[\w.]+", base.strip())
        )
        entry = [match.group("name"), bases, False, indent]
        found.append(entry)
        open_classes.append(entry)
    return tuple(ClassInfo(name, bases, forward) for name, bases, forward, _ in found)


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

    def __init__(self, path: str, module_name: str, package: str, local_classes: Set[str]) -> None:
        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))
        self.module_name = module_name
        self.package = package
        self.local_classes = local_classes
        self.aliases: Dict[str, str] = {}
        self.wraps: List[Wrap] = []
        # Per open scope: its assignments, and the wrap calls to resolve once the whole scope is read.
        self.scopes: List[Tuple[Dict[str, List[ast.AST]], List[ast.Call]]] = []

    def qualify(self, node: ast.AST) -> Optional[str]:
        name = _ast_dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        target = self.aliases.get(head, head)
        return f"{target}.{rest}" if rest else target

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
            for class_name, module in self._wrapped_classes(call.args[0], depth=0):
                self.wraps.append(Wrap(class_name, self._dim(call), self.path, call.lineno, module, self.directory))
        self.scopes.pop()

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = _visit_scope

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.scopes[-1][0].setdefault(node.targets[0].id, []).append(node.value)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if node.args and self.qualify(node.func) in DATA_PARALLEL:
            self.scopes[-1][1].append(node)
        self.generic_visit(node)

    @staticmethod
    def _dim(node: ast.Call) -> Optional[int]:
        for keyword in node.keywords:
            if keyword.arg == "dim":
                return _int_literal(keyword.value)
        if len(node.args) > 3:
            return _int_literal(node.args[3])
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
                    module = self.module_name if func.id in self.local_classes else ""
                yield name, module or None
        elif isinstance(node, ast.Name):
            for scope, _ in reversed(self.scopes):
                if node.id in scope:
                    for value in scope[node.id]:
                        yield from self._wrapped_classes(value, depth + 1)
                    return


@dataclass(frozen=True)
class ProjectFacts:
    # Class whose `forward` runs under DataParallel → the wraps that run it.
    wrapped: Mapping[str, Tuple[Wrap, ...]] = field(default_factory=dict)
    # Project modules that import torch when imported (directly or through other project modules).
    torch_modules: FrozenSet[str] = frozenset()
    # What the DDP/torchrun rules (DPL5xx) need to know about the programs that start a process group.
    distributed: "DistributedProject" = field(default_factory=lambda: DistributedProject())

    @classmethod
    def build(cls, files: Sequence[FileFacts]) -> "ProjectFacts":
        classes: Dict[str, List[ClassInfo]] = {}
        for facts in files:
            for info in facts.classes:
                classes.setdefault(info.name, []).append(info)
        wrapped: Dict[str, List[Wrap]] = {}
        for facts in files:
            for wrap in facts.wraps:
                for owner in _forward_owners(wrap.class_name, classes):
                    wrapped.setdefault(owner, []).append(wrap)
        return cls(
            wrapped={name: tuple(wraps) for name, wraps in sorted(wrapped.items())},
            torch_modules=_torch_importers(files),
            distributed=distributed_project(files),
        )

    def wraps_any(self, class_names: Iterable[str]) -> bool:
        """Whether DataParallel runs the `forward` of any of these classes (by name: a cheap prefilter)."""
        return any(name in self.wrapped for name in class_names)

    def imports_torch(self, module: str) -> bool:
        """Whether `import module` imports torch (importing `a.b` runs `a/__init__.py` and `a/b.py`)."""
        return is_torch_module(module) or any(prefix in self.torch_modules for prefix in _prefixes(module))

    @cached_property
    def digest(self) -> str:
        text = repr((sorted((k, v) for k, v in self.wrapped.items()), sorted(self.torch_modules), self.distributed.key()))
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


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


def _prefixes(module: str) -> Iterable[str]:
    parts = module.split(".")
    return (".".join(parts[: i + 1]) for i in range(len(parts)))


def _torch_importers(files: Sequence[FileFacts]) -> FrozenSet[str]:
    project = {facts.module_name for facts in files}
    importers_of: Dict[str, Set[str]] = {}
    for facts in files:
        for imported in facts.imports:
            for prefix in _prefixes(imported):
                if prefix in project and prefix != facts.module_name:
                    importers_of.setdefault(prefix, set()).add(facts.module_name)
    found = {facts.module_name for facts in files if facts.imports_torch_directly}
    pending = list(found)
    while pending:
        for importer in importers_of.get(pending.pop(), ()):
            if importer not in found:
                found.add(importer)
                pending.append(importer)
    return frozenset(found)


# ----- distributed programs (DDP, torchrun) ------------------------------------------------------------

_STARTS_PROCESS_GROUP = re.compile(r"(?<!def )\binit_process_group[ \t]*\(")
_WRAPS_DISTRIBUTED = re.compile(r"\b(?:DistributedDataParallel|DDP|FullyShardedDataParallel|FSDP|fully_shard)[ \t]*\(")
_SETS_EPOCH = re.compile(r"\.set_epoch[ \t]*\(|\bdef[ \t]+set_epoch\b")
_EPOCH_LOOP = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:for|while)\b[^\n#]*epoch", re.M | re.I)
# `torch.cuda.set_device(local_rank)`, `init_process_group(device_id=...)`, `f"cuda:{local_rank}"`,
# `torch.device("cuda", rank)`, `.cuda(local_rank)`, `.to(rank)`: the rank's own GPU is chosen somewhere.
_SELECTS_DEVICE = re.compile(
    r"set_device[ \t]*\(|\bdevice_id[ \t]*=|cuda:\{|cuda:%|[\"']cuda:[\"'][ \t]*\+|"
    r"device\([ \t]*[\"']cuda[\"'][ \t]*,|\.(?:cuda|to)\([ \t]*[\w.]*rank\b|device_ids[ \t]*=[ \t]*\[[ \t]*[\w.]*rank\b"
)
_READS_LOCAL_RANK_ENV = re.compile(r"[\"']LOCAL_RANK[\"']")
_SHARDS_EVALUATION = re.compile(r"DistributedSampler\((?:[^()]|\([^()]*\))*\bshuffle[ \t]*=[ \t]*False")
_USES_CUDA = re.compile(r"\.cuda\(|[\"']cuda\b|\bnccl\b")
_DISTRIBUTED_WORDS = ("istributed", "DDP", "FSDP", "fully_shard", "epoch", "LOCAL_RANK", "cuda", "set_device")
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
    shards_evaluation: bool = False  # a DistributedSampler with shuffle=False: evaluation is sharded
    uses_cuda: bool = False


def scan_distributed(text: str) -> Optional[DistributedFileFacts]:
    if not any(word in text for word in _DISTRIBUTED_WORDS):
        return None
    facts = DistributedFileFacts(
        starts_process_group="init_process_group" in text and _STARTS_PROCESS_GROUP.search(text) is not None,
        wraps_model=_WRAPS_DISTRIBUTED.search(text) is not None,
        sets_epoch="set_epoch" in text and _SETS_EPOCH.search(text) is not None,
        epoch_loop="poch" in text and _EPOCH_LOOP.search(text) is not None,
        selects_device=_SELECTS_DEVICE.search(text) is not None,
        reads_local_rank_env="LOCAL_RANK" in text and _READS_LOCAL_RANK_ENV.search(text) is not None,
        shards_evaluation="DistributedSampler" in text and _SHARDS_EVALUATION.search(text) is not None,
        uses_cuda=_USES_CUDA.search(text) is not None,
    )
    return facts if facts != DistributedFileFacts() else None


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

    @classmethod
    def merge(cls, files: Iterable[FileFacts]) -> "DistributedProgram":
        files = list(files)
        facts = [f.distributed for f in files if f.distributed is not None]
        return cls(
            sets_epoch=any(f.sets_epoch for f in facts),
            selects_device=any(f.selects_device for f in facts),
            reads_local_rank_env=any(f.reads_local_rank_env for f in facts),
            trainer_framework=any(name.split(".")[0] in TRAINER_FRAMEWORKS for f in files for name in f.imports),
            epoch_loop=any(f.epoch_loop for f in facts),
            wraps_model=any(f.wraps_model for f in facts),
            shards_evaluation=any(f.shards_evaluation for f in facts),
            uses_cuda=any(f.uses_cuda for f in facts),
        )


FileKey = Tuple[str, str]  # (folder, module name)


@dataclass(frozen=True)
class DistributedProject:
    """The distributed programs of the project.

    A program that starts a process group (or wraps a model in DDP/FSDP) spans the script, what it
    imports, and what imports it (`train.py` imports the trainer module that starts the group). Seeds
    in one folder make one program; two projects linted together stay two programs.
    """

    programs: Tuple[DistributedProgram, ...] = ()
    membership: Mapping[FileKey, Tuple[int, ...]] = field(default_factory=dict)

    def program_of(self, module: str, filename: str) -> Optional[DistributedProgram]:
        """The merged facts of the programs this file belongs to; None when it belongs to none."""
        indexes = self.membership.get((os.path.dirname(os.path.abspath(filename)), module))
        if not indexes:
            return None
        programs = [self.programs[i] for i in indexes]
        return DistributedProgram(*(any(getattr(p, name) for p in programs) for name in DistributedProgram.__dataclass_fields__))

    def key(self) -> tuple:
        return (self.programs, sorted(self.membership.items()))


def distributed_project(files: Sequence[FileFacts]) -> DistributedProject:
    keyed = {(f.directory, f.module_name): f for f in files}
    seeds_by_folder: Dict[str, Set[FileKey]] = {}
    for key, facts in keyed.items():
        if facts.distributed is not None and (facts.distributed.starts_process_group or facts.distributed.wraps_model):
            seeds_by_folder.setdefault(key[0], set()).add(key)
    if not seeds_by_folder:
        return DistributedProject()
    imported_by, imports_of = _import_graph(keyed)
    programs: List[DistributedProgram] = []
    membership: Dict[FileKey, List[int]] = {}
    for folder in sorted(seeds_by_folder):
        members = _reachable(_reachable(seeds_by_folder[folder], imported_by), imports_of)
        for key in members:
            membership.setdefault(key, []).append(len(programs))
        programs.append(DistributedProgram.merge(keyed[key] for key in members))
    return DistributedProject(tuple(programs), {key: tuple(value) for key, value in membership.items()})


def _import_graph(keyed: Mapping[FileKey, FileFacts]) -> Tuple[Dict[FileKey, Set[FileKey]], Dict[FileKey, Set[FileKey]]]:
    """Import edges between files. A top-level name resolves to the module beside the importing file
    when there is one (Python finds `model.py` beside the script), else to every module of that name."""
    by_name: Dict[str, List[FileKey]] = {}
    for key in keyed:
        by_name.setdefault(key[1], []).append(key)
    imported_by: Dict[FileKey, Set[FileKey]] = {}
    imports_of: Dict[FileKey, Set[FileKey]] = {}
    for key, facts in keyed.items():
        for imported in facts.imports:
            for prefix in _prefixes(imported):
                candidates = by_name.get(prefix, ())
                beside = [c for c in candidates if c[0] == key[0]]
                for target in beside or candidates:
                    if target != key:
                        imported_by.setdefault(target, set()).add(key)
                        imports_of.setdefault(key, set()).add(target)
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
