"""A pitfall seen while the user's code ran, as the linter's `Finding`: one type, one set of reporters."""

from __future__ import annotations

import linecache
import os
from typing import Sequence

from dplint.finding import Finding, Location

# What to write instead, the `help` line, for the findings of DDP's ranks (DataParallel's checks give their own):
# the static rule's help where the advice is the same.
RUNTIME_HELP = {
    "DPL501": "Call `sampler.set_epoch(epoch)` (or `loader.sampler.set_epoch(epoch)`) at the start of each epoch.",
    "DPL503": "Give each rank its own shard: `sampler=DistributedSampler(dataset)`, with the process group's rank and size.",
    "DPL504": "Call the DDP model itself, not its `.module`, so DDP syncs the gradients.",
    "DPL505": "Save on one rank: `if dist.get_rank() == 0: ...`.",
    "DPL506": 'Pass `map_location="cpu"` (or `f"cuda:{local_rank}"`).',
    "DPL507": "Make the same collectives, in the same order, on every rank.",
    "DPL508": "Give each rank its own GPU: `torch.cuda.set_device(local_rank)`, `cuda:{local_rank}`.",
    "DPL511": "Make the change before wrapping in DDP, on every rank.",
    "DPL512": "Call the collective as a statement and use the tensor you passed to it.",
    "DPL513": "Pass the same seed on every rank (e.g. `seed=args.seed`); seed augmentation per rank elsewhere.",
    "DPL519": 'Pass the global rank: `int(os.environ["RANK"])`, or `node_rank * nproc_per_node + local_rank`.',
    "DPL520": "Change the parameters only through the optimizer, after DDP's gradient sync.",
    "DPL521": "Use every parameter in each forward, or pass `find_unused_parameters=True`.",
}


def runtime_finding(code: str, message: str, where: str, ranks: Sequence[int] = (), help: str = "") -> Finding:
    """The finding for `code` at `where`: `path:line:column`, the start of the expression it is about, as
    the static rules place theirs, or `path:line` (then the line's first non-blank column); the path as
    shown, relative to the current folder."""
    from dplint.rules import BY_CODE

    path, _, line = where.rpartition(":")
    column = None
    head, _, before = path.rpartition(":")
    if head and before.isdigit() and line.isdigit():
        path, line, column = head, before, int(line)
    row = int(line) if line.isdigit() else 0
    if not path:
        path = where
    filename = os.path.abspath(path)
    text = linecache.getline(filename, row).rstrip() if row else ""
    start = column or len(text) - len(text.lstrip()) + 1
    rule = BY_CODE.get(code)
    return Finding(
        code=code,
        name=rule.name if rule else code,
        severity=rule.severity if rule else "error",
        message=message,
        help=help or RUNTIME_HELP.get(code, ""),
        path=path,
        filename=filename,
        location=Location(max(row, 1), start),
        end_location=Location(max(row, 1), max(len(text) + 1, start)),
        ranks=tuple(ranks),
    )
