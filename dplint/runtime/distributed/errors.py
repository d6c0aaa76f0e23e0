"""What the distributed runtime reports: a pitfall raised inside a rank, a rank's failure, the launcher's error.

Findings are the linter's `dplint.finding.Finding` (made by `dplint.runtime.findings.runtime_finding`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from dplint.finding import Finding
from dplint.runtime.distributed.channel import site_of


def finding_line(finding: Finding) -> str:
    """`path:line: CODE message`: how a runtime finding reads in an exception's text or a warning."""
    return f"{finding.path}:{finding.location.row}: {finding.code} {finding.message}"


class DistributedPitfall(RuntimeError):
    """Raised inside a rank where going on would hang or crash (a collective mismatch, unused parameters)."""

    def __init__(self, code: str, message: str, where: str) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message
        self.where = where


class PeerFailed(RuntimeError):
    """Raised in a rank whose peer failed while it waited on it: a consequence, reported after its cause."""


class SetupError(RuntimeError):
    """The script cannot run as dplint was asked to run it: it wants another number of ranks than it was given."""


@dataclass
class RankFailure:
    rank: int
    kind: str  # the exception's type name, or "exit" for a process that died without one
    message: str
    where: str  # `file:line`, or a pitfall's `file:line:column`
    traceback: str = ""
    code: Optional[str] = None  # set for a pitfall (a DistributedPitfall, a DataParallel PitfallError); `message` is then its own
    help: str = ""  # a DataParallel pitfall's help line (a DDP pitfall's is its code's)
    time: float = 0.0

    def describe(self, alone: bool = False) -> str:
        """What happened, naming the rank (`alone`: the one process of `dplint run --devices`, "the script")."""
        who = "the script" if alone else f"rank {self.rank}"
        if self.code:
            return f"{site_of(self.where)}: {self.code} {self.message}"  # as `finding_line` names a finding's place
        if self.kind == "SetupError":
            return self.message
        if self.kind == "exit":
            return f"{who} {self.message}; it {self.where}"
        return f"{who} failed at {self.where}: {self.kind}: {self.message}"


class LaunchError(RuntimeError):
    """A distributed run failed, or finished with findings; the message says which rank, where, and what the others did.

    `.failure` is the failed rank's RankFailure (None when the run finished with findings only), `.states`
    what every rank was doing at the end, `.findings` the runtime findings, `.incomplete` (else None) why
    a run without failures proves nothing: not every rank joined the process group.
    """

    def __init__(
        self,
        failure: Optional[RankFailure],
        states: Dict[int, str],
        findings: Sequence[Finding] = (),
        incomplete: Optional[str] = None,
    ) -> None:
        self.failure = failure
        self.states = states
        self.findings = list(findings)
        self.incomplete = incomplete  # why the run proves nothing though no rank failed: the ranks did not all join
        self.code = failure.code if failure else (self.findings[0].code if self.findings else None)
        super().__init__(self._text())

    def failure_text(self, alone: bool = False) -> str:
        """Which rank failed, where, and (unless the failure names them already) what the others were doing."""
        if self.failure is None:
            return ""
        lines = [self.failure.describe(alone)]
        if not self.failure.code and self.failure.kind != "SetupError":
            lines += [f"  rank {rank} {state}" for rank, state in sorted(self.states.items()) if rank != self.failure.rank]
        return "\n".join(lines)

    def _text(self) -> str:
        lines: List[str] = [self.failure_text()] if self.failure else []
        if self.incomplete:
            lines.append(self.incomplete)
        # One finding a line, the first the headline (pytest's summary, an exception's first line).
        lines += [finding_line(finding) for finding in self.findings]
        return "\n".join(lines)
