"""After the run: compare what the ranks published and turn it into findings."""

from __future__ import annotations

import ast
import linecache
import os
import tokenize
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dplint.finding import Finding
from dplint.runtime.findings import runtime_finding

Events = Dict[int, List[Dict[str, Any]]]
_SAMPLER_SETTINGS = ("seed", "length", "num_replicas", "shuffle", "drop_last")


def findings(events: Events, per_node: Optional[int] = None) -> List[Finding]:
    """The findings of a run whose nodes hold `per_node` ranks each (None: one node)."""
    found = _reported(events)
    if len(events) > 1:
        per_node = per_node or len(events)
        found += _samplers(events) + _first_batches(events) + _divergence(events) + _saves(events, per_node)
        found += _shared_gpus(events, per_node)
    return found


def _by(events: Events, kind: str) -> Dict[int, List[Dict[str, Any]]]:
    return {rank: [e for e in rank_events if e["kind"] == kind] for rank, rank_events in events.items()}


def _ranks(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def _opening(text: str) -> str:
    """A message's first words, capitalised as the static rules' messages are."""
    return text[:1].upper() + text[1:]


def _reported(events: Events) -> List[Finding]:
    seen: Dict[Tuple[str, str, str], List[int]] = defaultdict(list)
    for rank, rank_events in sorted(_by(events, "finding").items()):
        for event in rank_events:
            seen[(event["code"], event["message"], event["where"])].append(rank)
    # Seen by each rank on its own, so the message says which ranks saw it (when there are several).
    return [
        runtime_finding(code, f"{message.rstrip('.')} ({_ranks(ranks)})." if len(events) > 1 else message, where, tuple(ranks))
        for (code, message, where), ranks in seen.items()
    ]


def _characters(filename: str, line: int, offset: int) -> int:
    """The column, in characters, of Python's byte `offset` on a line of the file."""
    return len(linecache.getline(filename, line).encode("utf-8")[:offset].decode("utf-8", "replace"))


def _argument(spot: str, keyword: str, position: int) -> str:
    """The spot (`file:line:column`) of an argument of the call that starts at `spot`, passed as `keyword=`
    or as the `position`-th: where the static rule puts its finding. `spot` itself where the source does
    not show it (a `**kwargs`, a file that changed)."""
    site, _, column = spot.rpartition(":")
    path, _, line = site.rpartition(":")
    if not (column.isdigit() and line.isdigit()):
        return spot
    filename = os.path.abspath(path)
    try:
        with tokenize.open(filename) as source:
            tree = ast.parse(source.read())
    except (OSError, SyntaxError, ValueError):
        return spot
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno == int(line) and _characters(filename, node.lineno, node.col_offset) == int(column) - 1:
            named = [given.value for given in node.keywords if given.arg == keyword]
            positional = node.args[: position + 1]
            if named:
                value = named[0]
            elif len(positional) > position and not any(isinstance(given, ast.Starred) for given in positional):
                value = positional[position]
            else:
                return spot
            return f"{path}:{value.lineno}:{_characters(filename, value.lineno, value.col_offset) + 1}"
    return spot


def _indexed(events: Events, kind: str) -> Dict[int, Dict[int, Dict[str, Any]]]:
    """kind's events by their per-rank ordinal `index`, then by rank: the k-th sampler of every rank."""
    table: Dict[int, Dict[int, Dict[str, Any]]] = defaultdict(dict)
    for rank, rank_events in _by(events, kind).items():
        for event in rank_events:
            table[event["index"]].setdefault(rank, event)
    return table


def _samplers(events: Events) -> List[Finding]:
    found = []
    for ranks in _indexed(events, "sampler").values():
        if len(ranks) < 2:
            continue
        where = ranks[min(ranks)]["where"]
        for setting in _SAMPLER_SETTINGS:
            values = {rank: event[setting] for rank, event in ranks.items()}
            if len(set(values.values())) > 1:
                listed = ", ".join(f"{values[rank]} on rank {rank}" for rank in sorted(values))
                if setting == "seed":  # at the seed's expression, as the static rule reports it
                    message = f"This `DistributedSampler` seed differs between ranks ({listed}): ranks shuffle differently and overlap."
                    found.append(runtime_finding("DPL513", message, _argument(where, "seed", 4), tuple(sorted(ranks))))
                else:
                    message = f"This `DistributedSampler`'s `{setting}` differs between ranks ({listed}): the shards overlap or miss samples."
                    found.append(runtime_finding("DPL503", message, where, tuple(sorted(ranks))))
                break
        else:
            shards: Dict[Any, List[int]] = defaultdict(list)
            for rank, event in ranks.items():
                shards[event["rank"]].append(rank)
            for shard, readers in shards.items():
                if len(readers) > 1:
                    found.append(runtime_finding(
                        "DPL503",
                        f"{_opening(_ranks(readers))} all read shard {shard} of this `DistributedSampler`: they iterate the same data.",
                        where, tuple(sorted(readers)), help="Pass each process's own rank, or leave `rank=` unset.",
                    ))  # fmt: skip
    return found


def _first_batches(events: Events) -> List[Finding]:
    found = []
    for ranks in _indexed(events, "batch").values():
        if len(ranks) < 2:
            continue
        where = ranks[min(ranks)]["where"]
        if all("indices" in event for event in ranks.values()):
            samples = {rank: event["indices"] for rank, event in ranks.items()}
            if all(samples.values()) and len({tuple(s) for s in samples.values()}) == 1:
                preview = ", ".join(map(str, samples[min(samples)][:4]))
                found.append(runtime_finding(
                    "DPL503",
                    f"This training `DataLoader` gives every rank the same first batch (samples {preview}, ...): "
                    "every DDP rank iterates the same data.",
                    where, tuple(sorted(ranks)),
                ))  # fmt: skip
                continue
            padding = max(event["padding"] for event in ranks.values())
            ordered = sorted(samples)
            for i, first in enumerate(ordered):
                for second in ordered[i + 1:]:
                    shared = set(samples[first]) & set(samples[second])
                    if len(shared) > padding:
                        found.append(runtime_finding(
                            "DPL503",
                            f"This training `DataLoader` gives ranks {first} and {second} first batches that share "
                            f"{len(shared)} sample{'s' * (len(shared) != 1)}: the shards overlap.",
                            where, (first, second),
                        ))  # fmt: skip
                        break
                else:
                    continue
                break
        elif all("digest" in event for event in ranks.values()):
            digests = {repr(event["digest"]) for event in ranks.values()}
            if len(digests) == 1 and ranks[min(ranks)]["digest"]:
                found.append(runtime_finding(
                    "DPL503",
                    "This training `DataLoader` gives every rank the same first batch: every DDP rank iterates the same data.",
                    where, tuple(sorted(ranks)),
                ))  # fmt: skip
    return found


def _differ(a: float, b: float) -> bool:
    return abs(a - b) > 1e-5 * max(abs(a), abs(b)) + 1e-8


def _divergence(events: Events) -> List[Finding]:
    found = []
    models = _indexed(_renamed(events, "model"), "model")
    steps: Dict[Tuple[int, int], Dict[int, List[float]]] = defaultdict(dict)
    for rank, rank_events in _by(events, "params").items():
        for event in rank_events:
            steps[(event["model"], event["step"])][rank] = event["norms"]
    diverged: Dict[int, Tuple[int, List[str]]] = {}
    for (model, step), norms in sorted(steps.items()):
        if model in diverged or len(norms) < 2 or model not in models:
            continue
        names = models[model][min(models[model])]["names"]
        reference = norms[min(norms)]
        differing = [
            names[i] for i in range(min(len(names), len(reference)))
            if any(i < len(other) and _differ(reference[i], other[i]) for other in norms.values())
        ]  # fmt: skip
        if differing:
            diverged[model] = (step, differing)
    for model, (step, differing) in sorted(diverged.items()):
        listed = ", ".join(f"`{name}`" for name in differing[:3]) + (f" and {len(differing) - 3} more" if len(differing) > 3 else "")
        differ = f"{listed} differ{'s' * (len(differing) == 1)} between the replicas after optimizer step {step}"
        bypasses = [(rank, e) for rank, es in _by(events, "bypass").items() for e in es if e["model"] == model]
        changes = [(rank, e) for rank, es in _by(events, "changed").items() for e in es if e["model"] == model]
        if bypasses:
            where = bypasses[0][1]["where"]
            found.append(runtime_finding("DPL504", f"This forward through `.module` skips DDP's forward: gradients are not averaged ({differ}).",
                                 where, tuple(sorted({rank for rank, _ in bypasses}))))  # fmt: skip
        elif changes:
            rank, change = changes[0]
            changed_on = sorted({r for r, e in changes if e["where"] == change["where"]})
            only = f" on {_ranks(changed_on)} only" if len(changed_on) < len(events) else ""
            found.append(runtime_finding("DPL511", f"{change['what']}{only} after the DDP wrap: ranks keep different weights ({differ}).",
                                 change["where"], tuple(changed_on)))  # fmt: skip
        else:
            where = models[model][min(models[model])]["where"]
            found.append(runtime_finding("DPL520", f"{differ}: their gradients were not averaged, or they changed outside DDP.",
                                 where, tuple(sorted(events))))  # fmt: skip
    return found


def _renamed(events: Events, kind: str) -> Events:
    """`model` events carry `model` as their ordinal; index them like the others."""
    return {rank: [dict(e, index=e["model"]) for e in es if e["kind"] == kind] for rank, es in events.items()}


def _saves(events: Events, per_node: int) -> List[Finding]:
    writers: Dict[str, Dict[int, str]] = defaultdict(dict)
    for rank, rank_events in sorted(_by(events, "save").items()):
        for event in rank_events:
            writers[event["path"]].setdefault(rank, event["where"])
    found = []
    for path, ranks in writers.items():
        if len(ranks) > 1:
            name = path.rsplit("/", 1)[-1]
            nodes = {rank // per_node for rank in ranks}
            per_node_writer = len(nodes) == len(ranks)  # a race where the nodes share the filesystem
            if per_node_writer:
                said = f"one on each of {len(nodes)} nodes, all save `{name}` here: on a filesystem the nodes share, the writes race"
            else:
                said = f"all save `{name}` here: the writes race and can corrupt the file"
            found.append(runtime_finding("DPL526" if per_node_writer else "DPL505", f"{_opening(_ranks(list(ranks)))}{',' * per_node_writer} {said}.",
                                         ranks[min(ranks)], tuple(sorted(ranks))))  # fmt: skip
    return found


_PLACED = {"model": "put this model on", "tensor": "put this tensor on", "DDP": "wrap this DDP model on", "set_device": "select"}


def _shared_gpus(events: Events, per_node: int) -> List[Finding]:
    """DPL506/DPL508: the first call site where two or more ranks of a node placed onto the same emulated GPU."""
    found = []
    for code, kinds in (("DPL506", {"load"}), ("DPL508", set(_PLACED))):
        sites: Dict[str, Dict[int, Dict[str, Any]]] = defaultdict(dict)  # in order of first appearance, lowest rank first
        for rank, rank_events in sorted(_by(events, "gpu").items()):
            for event in rank_events:
                if event["what"] in kinds:
                    sites[event["where"]].setdefault(rank, event)
        for where, ranks in sites.items():
            sharing: Dict[Tuple[int, int], List[int]] = defaultdict(list)  # (node, GPU) -> the ranks placing onto it
            for rank, event in sorted(ranks.items()):
                sharing[(rank // per_node, event["index"])].append(rank)
            (_, index), on_it = max(sharing.items(), key=lambda item: len(item[1]))
            if len(on_it) < 2:
                continue
            if code == "DPL506":
                message = f"{_opening(_ranks(on_it))} all load this checkpoint onto `cuda:{index}`: they share one GPU."
            else:
                what = ranks[on_it[0]]["what"]
                message = f"{_opening(_ranks(on_it))} all {_PLACED[what]} `cuda:{index}`: they share one GPU."
            found.append(runtime_finding(code, message, where, tuple(on_it)))
            break
    return found
