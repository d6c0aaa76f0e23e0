"""dplint's own frames, hidden from the tracebacks of what leaves its runtime checks.

A finding (a PitfallError) or the user's own exception passes through a dozen frames of dplint's
machinery on its way out: the patched `DataParallel.forward`, the simulated steps, the checks. They
say nothing about the user's code, so they are unlinked from the traceback (`tb_next` is writable)
where the exception leaves dplint's code; torch's frames and the user's stay.

Exceptions of dplint itself keep every frame: an error whose innermost frame is dplint's, other than
a finding or an error that the simulation raises in torch's place (`simulation.py` stands for torch's
own code), is a dplint bug, and its frames are what a bug report needs.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Iterable, List, Optional, Set

from dplint.runtime.origins import dplint_code

# The simulation of DataParallel's steps does what torch's code does; its errors are torch's.
SIMULATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "simulation.py")


def without_own_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """The traceback with dplint's entries unlinked (in place): its first kept entry, or None."""
    kept: List[TracebackType] = []
    while tb is not None:
        if not dplint_code(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    for entry, following in zip(kept, kept[1:]):
        entry.tb_next = following
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None


def raised_by_dplint(error: BaseException, findings: Iterable[type]) -> bool:
    """Whether dplint itself failed: its innermost frame is dplint's (the simulation's aside), and it is
    no finding."""
    tb = error.__traceback__
    if tb is None or isinstance(error, tuple(findings)):
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return dplint_code(filename) and filename != SIMULATION


def hide_own_frames(error: BaseException, findings: Iterable[type]) -> None:
    """Unlink dplint's frames from the traceback of `error` and of the exceptions chained to it, unless
    dplint itself failed (see the module's docstring)."""
    findings = tuple(findings)
    if raised_by_dplint(error, findings):
        return
    seen: Set[int] = set()
    pending: List[Optional[BaseException]] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = without_own_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]
