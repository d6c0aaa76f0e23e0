"""What a rule sees of one file: its tree, its imports, the project's facts, and lazily its positions."""

from __future__ import annotations

import ast
import re
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple, TypeVar

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from dplint.analysis.execution import DATA_LOADER, PREPARED_LOADER, FileExecution, Where
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.names import ImportMap, child_nodes

T = TypeVar("T")
# A name called in the source (`FixMatch(`, `build_model (`): which classes and functions a file calls.
_CALLED_NAME = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


class _Positions(Mapping):
    """A node's CodeRange, built when asked for from the (start, end) pairs the code generation recorded."""

    def __init__(self, recorded: Dict[cst.CSTNode, Any]) -> None:
        self._recorded = recorded

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        (start_line, start_column), (end_line, end_column) = self._recorded[node]
        return CodeRange(CodePosition(start_line, start_column), CodePosition(end_line, end_column))

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._recorded)

    def __len__(self) -> int:
        return len(self._recorded)


class _RecordingState(PositionProvidingCodegenState):
    """libcst's position-tracking code generation, recording plain tuples: a file has a few hundred
    thousand nodes and a handful of findings, so building a CodeRange for every node is most of the cost."""

    __slots__ = ()

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._stack.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._stack.pop()
        recorded = self.provider._computed
        if node not in recorded:  # a syntactic position recorded inside wins, as in libcst
            recorded[node] = (start, (self.line, self.column))

    @contextmanager
    def record_syntactic_position(
        self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None, end_node: Optional[cst.CSTNode] = None
    ) -> Iterator[None]:
        start = (self.line, self.column)
        try:
            yield
        finally:
            recorded = self.provider._computed
            end = (self.line, self.column)
            recorded[node] = (
                recorded[start_node][0] if start_node is not None else start,
                recorded[end_node][1] if end_node is not None else end,
            )


def positions_of(module: cst.Module) -> Mapping[cst.CSTNode, CodeRange]:
    """Every node's position, as `MetadataWrapper(module).resolve(PositionProvider)` gives it, in a
    third of the time: one code-generation pass, without the wrapper's extra walk over the tree.
    Falls back to the wrapper if libcst's internals change."""
    provider = PositionProvider()
    try:
        state = _RecordingState(default_indent=module.default_indent, default_newline=module.default_newline, provider=provider)
        module._codegen(state)
        return _Positions(provider._computed)
    except (AttributeError, TypeError):
        return MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)


class _StatementPositions:
    """Positions generated one top-level statement at a time, from the line its code starts on: a file
    with findings in a few statements pays for those, not for the whole file (10,000 classes and one
    finding: 1.5 s of code generation). The statement holding a node is found by a walk over the nodes
    that hold expressions (a quarter of the cost of generating them); a node that walk does not reach
    (the module's own comment lines, punctuation) is located by generating the whole module."""

    def __init__(self, module: cst.Module, first_lines: Sequence[int]) -> None:
        self._module = module
        self._first_lines = first_lines
        self._owners: Dict[int, int] = {}  # id(node) → the index of its top-level statement, as far as walked
        self._walked = 0
        self._recorded: Dict[cst.CSTNode, Any] = {}
        self._found = _Positions(self._recorded)
        self._whole: Optional[Mapping[cst.CSTNode, CodeRange]] = None

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        if node not in self._recorded:
            index = self._owner(node)
            if index is None:
                if self._whole is None:
                    self._whole = positions_of(self._module)
                return self._whole[node]
            self._generate(self._module.body[index], self._first_lines[index])
        return self._found[node]

    def _owner(self, node: cst.CSTNode) -> Optional[int]:
        body = self._module.body
        while id(node) not in self._owners and self._walked < len(body):
            pending = [body[self._walked]]
            while pending:
                current = pending.pop()
                self._owners[id(current)] = self._walked
                pending.extend(child_nodes(current))
            self._walked += 1
        return self._owners.get(id(node))

    def _generate(self, statement: cst.CSTNode, first_line: int) -> None:
        """`first_line`: where the statement's code starts (its first decorator's, if any), below its comment lines."""
        decorators = getattr(statement, "decorators", ())
        comment_lines = len(statement.leading_lines) + (len(decorators[0].leading_lines) if decorators else 0)  # type: ignore[attr-defined]
        provider = PositionProvider()
        provider._computed = self._recorded
        state = _RecordingState(
            default_indent=self._module.default_indent,
            default_newline=self._module.default_newline,
            provider=provider,
            line=first_line - comment_lines,
        )
        statement._codegen(state)


class FileContext:
    def __init__(
        self,
        *,
        path: str,
        filename: str,
        source: str,
        module: cst.Module,
        project: ProjectFacts,
        module_name: str,
        package: str,
        statement_lines: Optional[Sequence[int]] = None,
        tree: Optional[ast.Module] = None,
    ) -> None:
        """`statement_lines`: the line each top-level statement's code starts on, when known (positions
        are then generated only for the statements that hold the nodes asked for). `tree`: CPython's
        tree of the same source, when the caller has parsed it."""
        self.path = path
        self.filename = filename
        self.module_name = module_name
        self.source = source
        self.module = module
        self.project = project
        self.package = package
        self._imports: Optional[ImportMap] = None
        self._positions: Optional[Any] = None if statement_lines is None else _StatementPositions(module, statement_lines)
        self._memo: Dict[str, Any] = {}
        self._tree = tree

    @property
    def imports(self) -> ImportMap:
        if self._imports is None:
            self._imports = ImportMap(self.module, self.package)
        return self._imports

    def qualify(self, node: cst.BaseExpression) -> Optional[str]:
        return self.imports.qualify(node)

    def position(self, node: cst.CSTNode) -> CodeRange:
        # Positions cost a full extra pass over the tree, so they are computed only once a rule needs one.
        if self._positions is None:
            self._positions = positions_of(self.module)
        return self._positions[node]

    def line(self, node: cst.CSTNode) -> int:
        return self.position(node).start.line

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def short_code(self, node: cst.CSTNode, limit: int = 60) -> str:
        text = " ".join(self.code(node).split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    @property
    def tree(self) -> ast.Module:
        if self._tree is None:
            self._tree = ast.parse(self.source)
        return self._tree

    @property
    def execution(self) -> FileExecution:
        return self.memo("execution", lambda: FileExecution(self.project.execution, self.tree, self.filename, self.module_name, self.package))

    def where(self, node: cst.CSTNode) -> Optional[Where]:
        """Where the statement holding `node` runs: in one process or a process group, on which ranks;
        None where no program's entry reaches it through the calls the project resolves."""
        return self.execution.where(self.line(node))

    def left_behind(self, node: cst.CSTNode) -> bool:
        """Whether the statement holding `node` is in a helper nothing uses: a top-level function of a
        module the project imports, that no program reaches, no project function calls, and no file
        names (nor may use unread: a star import, a file not read for calls)."""
        name = self.execution.unreached_helper(self.line(node))
        if name is None or len(re.findall(rf"\b{re.escape(name)}\b", self.source)) != 1:
            return False  # its own file names it again: a callback, a table entry, an export
        return self.project.calls_from_other_files(self.filename, name) == ()

    def local_where(self, node: cst.CSTNode) -> Optional[Where]:
        """Where the statement holding `node` runs each time its function is called (its own function's
        conditions: a rank test written there)."""
        return self.execution.local_where(self.line(node))

    def splits_ranks(self, test: cst.BaseExpression) -> bool:
        """Whether the condition is known to hold on some ranks of a process group and not on others
        (`rank == 0`, `is_main_process()`, `args.gpu == 0` under `mp.spawn`)."""
        return Where(self.execution.test_truth(self.code(test), self.line(test))).on_some_ranks_only

    def varies(self, node: cst.BaseExpression) -> bool:
        """Whether the expression may hold a different value on each rank (`f"ckpt_{rank}.pt"`)."""
        return self.execution.varies(self.code(node), self.line(node))

    def reads_rank(self, node: cst.BaseExpression) -> bool:
        """Whether the expression, or a part of it, holds a rank, the world size or something computed from
        the rank (`Dataset(root, rank=rank, world_size=n)`): what is built for one rank's share."""
        return self.execution.reads_rank(self.code(node), self.line(node))

    def rank_kind(self, node: cst.BaseExpression) -> Optional[str]:
        """"global", "local" or "any" where the expression holds a rank (`int(os.environ["RANK"])`,
        `mp.spawn`'s process index, `dist.get_rank() % n`), else None."""
        value = self.execution.value(self.code(node), self.line(node))
        return value[1] if value[0] == "rank" else None

    def group_on_one_node(self, node: cst.CSTNode, size: Optional[cst.BaseExpression]) -> Optional[bool]:
        """Where the code holding `node` runs, whether the group of `size` processes is known to be on one
        node (`torch.cuda.device_count()` processes, or all of them spawned by one `mp.spawn`): True, False
        (one spawn per node: `world_size = gpus * nodes` with `nprocs=gpus`) or None (unknown)."""
        return self.execution.group_on_one_node(self.line(node), self.code(size) if size is not None else None)

    def never_a_module(self, node: cst.BaseExpression) -> bool:
        """Whether the expression holds only objects of project classes that are no `nn.Module`."""
        # Only where the file calls such a class, or a project function that returns one: the names it
        # calls say so without reading its values (what a cold run would pay for every wrap).
        called = self.memo("called-names", lambda: frozenset(_CALLED_NAME.findall(self.source)))
        if called.isdisjoint(self.project.execution.plain_object_makers):
            return False
        return self.execution.holds_plain_objects(self.code(node), self.line(node))

    def holds_modules_without_buffers(self, node: cst.BaseExpression) -> bool:
        """Whether the expression holds only modules of project classes known to hold no buffers (no batch
        norm, no `register_buffer`, nothing loaded or built by another library): a DDP forward of one
        syncs nothing."""
        return self.execution.holds_modules_without_buffers(self.code(node), self.line(node))

    def object_class(self, node: cst.BaseExpression) -> Optional[str]:
        """The class whose object the expression holds (`accelerate.Accelerator`, a torch optimizer,
        `deepspeed.DeepSpeedEngine`, `lightning.Trainer`, `lightning.Fabric`), else None."""
        value = self.execution.value(self.code(node), self.line(node))
        return value[1] if value[0] == "object" else None

    def unprepared_loader(self, node: cst.BaseExpression) -> Optional[Tuple[str, tuple]]:
        """Where the expression holds a torch `DataLoader` as one call built it, which no
        `accelerator.prepare` handed back: the file of that call and the call, symbolic (`same_call`)."""
        value = self.execution.value(self.code(node), self.line(node))
        return (value[2], value[3]) if value[:2] == ("object", DATA_LOADER) else None

    def prepared_loader(self, node: cst.BaseExpression) -> Optional[Tuple[str, tuple]]:
        """Where the expression holds what `accelerator.prepare` handed back for a torch `DataLoader` one
        call built: the file of that call and the call, symbolic (`unprepared_loader`'s form)."""
        value = self.execution.value(self.code(node), self.line(node))
        return (value[2], value[3]) if value[:2] == ("object", PREPARED_LOADER) else None

    def same_call(self, node: cst.Call, symbolic: tuple) -> bool:
        """Whether a call of this file is the one the model reads as `symbolic` (from `unprepared_loader`)."""
        return self.execution.expression(self.code(node), self.line(node)) == symbolic

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """Share one analysis between the rules of a module (DPL201 and DPL202 walk the same flow)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]
