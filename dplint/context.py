"""What a rule sees of one file: its tree, its imports, the project's facts, and lazily its positions."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, TypeVar

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from dplint.analysis.facts import ProjectFacts
from dplint.analysis.names import ImportMap

T = TypeVar("T")


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


class FileContext:
    def __init__(
        self, *, path: str, filename: str, source: str, module: cst.Module, project: ProjectFacts, module_name: str, package: str
    ) -> None:
        self.path = path
        self.filename = filename
        self.module_name = module_name
        self.source = source
        self.module = module
        self.project = project
        self.package = package
        self._imports: Optional[ImportMap] = None
        self._positions: Optional[Any] = None
        self._memo: Dict[str, Any] = {}

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

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """Share one analysis between the rules of a module (DPL201 and DPL202 walk the same flow)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]
