"""A pitfall seen while the user's code ran, as the linter's `Finding`: one type, one set of reporters."""

from __future__ import annotations

import linecache
import os
from typing import Sequence

from dplint.finding import Finding, Location

# What to write instead, the `help` line, for the findings of DDP's ranks (DataParallel's checks give their own).
RUNTIME_HELP = {
    "DPL501": "call `sampler.set_epoch(epoch)` at the start of every epoch",
    "DPL503": "give each rank its own shard: `DistributedSampler(dataset)` with the process group's rank",
    "DPL504": "call the DDP wrapper itself in training, not its `.module`",
    "DPL505": "save on one rank only: `if dist.get_rank() == 0:`",
    "DPL506": "load onto each rank's own GPU (`map_location=f\"cuda:{local_rank}\"`) or the CPU",
    "DPL507": "make the same collectives, in the same order, on every rank",
    "DPL508": "give each rank its own GPU: `torch.cuda.set_device(local_rank)`, `cuda:{local_rank}`",
    "DPL511": "make the change before wrapping in DDP, on every rank",
    "DPL512": "keep the tensor: collectives work in place and return None unless `async_op=True`",
    "DPL513": "seed the DistributedSampler alike on every rank",
    "DPL520": "change the parameters only through the optimizer, after DDP's gradient sync",
    "DPL521": "use every parameter in each forward, or pass `find_unused_parameters=True`",
}


def runtime_finding(code: str, message: str, where: str, ranks: Sequence[int] = (), help: str = "") -> Finding:
    """The finding for `code` at `where` (`path:line`, the path as shown, relative to the current folder)."""
    from dplint.rules import BY_CODE

    path, _, line = where.rpartition(":")
    row = int(line) if line.isdigit() else 0
    if not path:
        path = where
    filename = os.path.abspath(path)
    text = linecache.getline(filename, row).rstrip() if row else ""
    start = len(text) - len(text.lstrip()) + 1
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
