"""The rule base class: one pitfall, one class, with its docs and examples inside it (Fixit's layout)."""

from __future__ import annotations

import inspect
import re
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterable, List, Optional, Sequence, Tuple, Union

from dplint.finding import Finding, Fix, Location

if TYPE_CHECKING:
    import libcst as cst

    from dplint.analysis.context import FileContext
    from dplint.finding import FileReference
    from dplint.noqa import NoqaDirective, Suppressions
    from dplint.analysis.facts import ProjectFacts
    from dplint.analysis.outline import Outline
    from dplint.analysis.patterns import GuardedPattern


@dataclass(frozen=True)
class Valid:
    """Code the rule must stay silent on."""

    code: str

    @property
    def source(self) -> str:
        return textwrap.dedent(self.code).lstrip("\n")


@dataclass(frozen=True)
class Invalid:
    """Code the rule must report, on `line` (1-based, counted in the dedented source)."""

    code: str
    line: int
    expected_fix: Optional[str] = None

    @property
    def source(self) -> str:
        return textwrap.dedent(self.code).lstrip("\n")

    @property
    def fixed_source(self) -> Optional[str]:
        return None if self.expected_fix is None else textwrap.dedent(self.expected_fix).lstrip("\n")


@dataclass(frozen=True)
class NodeEdit:
    """A fix edit named by a node: `content` replaces the node, or goes just before or just after it."""

    node: "cst.CSTNode"
    content: str
    insert_before: bool = False
    insert_after: bool = False


@dataclass(frozen=True)
class FixSpec:
    message: str
    edits: Tuple[NodeEdit, ...]
    applicability: str = "safe"


@dataclass
class Report:
    """What a rule says about one node; the engine turns it into a located Finding."""

    node: "cst.CSTNode"
    message: str
    help: str
    fix: Optional[FixSpec] = None
    # The statement holding the node: a noqa comment on its first line also suppresses the report.
    statement: Optional["cst.CSTNode"] = None
    # Places in files that the message names: each output format shows their paths its own way.
    references: Tuple["FileReference", ...] = ()


class Rule:
    """Base class of every rule. The class docstring is the rule's documentation, in Ruff's headings."""

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    severity: ClassVar[str] = "error"
    enabled_by_default: ClassVar[bool] = True
    # Not yet measured precise enough to be on by default: runs only with `--preview` (Ruff's tiers).
    preview: ClassVar[bool] = False
    # For a preview rule: what its measurement showed, in one or two sentences (`--explain` prints it).
    preview_reason: ClassVar[str] = ""
    # Checked only at runtime, by `dplint.runtime` (the pytest plugin); there is nothing to lint statically.
    runtime_only: ClassVar[bool] = False
    # For a runtime-only rule, which the wild sweep cannot measure: the scripts it was run on, what it
    # found there and how much of it was false, or that nothing was measured (`--explain` prints it).
    checked_on: ClassVar[str] = ""
    # A file whose text matches none of the enabled rules' triggers is never parsed by libcst.
    triggers: ClassVar[Optional[Union["re.Pattern[str]", "GuardedPattern"]]] = None
    # What the text must also show for the rule to find anything (e.g. that it uses torch.distributed).
    requires: ClassVar[Optional[Union["re.Pattern[str]", "GuardedPattern"]]] = None
    # Rules that report only in files of a program that starts a process group (project facts).
    distributed_programs_only: ClassVar[bool] = False
    # The applicabilities of the fixes the rule offers ("safe", "unsafe"; both where it depends on the
    # case): `--list-rules` and `--explain` show them, and the examples' tests check them.
    fix_applicability: ClassVar[Tuple[str, ...]] = ()
    VALID: ClassVar[Sequence[Valid]] = ()
    INVALID: ClassVar[Sequence[Invalid]] = ()

    def outside_distributed_programs(self, project: "ProjectFacts") -> bool:
        """Whether the rule checks files of no program that starts a process group, in this project."""
        return not self.distributed_programs_only

    def applies_to(self, text: str, module_classes: Sequence[str], project: "ProjectFacts") -> bool:
        if self.requires is not None and self.requires.search(text) is None:
            return False
        return self.triggers is None or self.triggers.search(text) is not None

    def applies_to_outline(self, outline: "Outline") -> bool:
        """Whether the code itself, strings and comments aside, can hold what the rule reports (asked
        after `applies_to`, before libcst parses the file)."""
        return True

    def check(self, ctx: "FileContext") -> Iterable[Report]:
        raise NotImplementedError

    @classmethod
    def docs(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")


class WrappedForwardRule(Rule):
    """A rule about the `forward` of modules DataParallel runs: a file that defines none of the
    classes the project wraps is never parsed for it."""

    def applies_to(self, text: str, module_classes: Sequence[str], project: "ProjectFacts") -> bool:
        return project.wraps_any(module_classes) and super().applies_to(text, module_classes, project)


class SuppressionRule(Rule):
    """A rule about the noqa directives themselves: it runs after every other rule of the file, on what
    the suppression pass recorded, and returns located findings rather than reports on nodes."""

    # Needs every static rule a directive names to have run (the engine runs deselected ones quietly).
    judges_use: ClassVar[bool] = False

    def check_directives(self, ctx: "FileContext", directives: List["NoqaDirective"], suppressions: "Suppressions") -> Iterable[Finding]:
        raise NotImplementedError

    def finding(self, ctx: "FileContext", row: int, columns: Tuple[int, int], message: str, help: str, fix: Optional[Fix] = None) -> Finding:
        return Finding(
            code=self.code,
            name=self.name,
            severity=self.severity,
            message=message,
            help=help,
            path=ctx.path,
            filename=ctx.filename,
            location=Location(row, columns[0]),
            end_location=Location(row, columns[1]),
            fix=fix,
        )
