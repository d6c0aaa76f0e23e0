"""What a rule sees of one file: its tree, its imports, the project's facts, and lazily its positions."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, TypeVar

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from dplint.analysis.facts import ProjectFacts
from dplint.analysis.names import ImportMap

T = TypeVar("T")


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
            wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
            self._positions = wrapper.resolve(PositionProvider)
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
