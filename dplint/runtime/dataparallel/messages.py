"""The runtime checks' messages: what is wrong in this call, and what to write instead."""

from __future__ import annotations

from typing import AbstractSet, Optional, Sequence, Tuple

PREFIX = "module."
SHOWN_OFFENDERS = 5


def module_off_primary_device(offenders: Sequence[Tuple[str, str]], expected: str) -> str:
    """DPL103."""
    named = ", ".join(f"{name} on {device}" for name, device in offenders[:SHOWN_OFFENDERS])
    more = f" and {len(offenders) - SHOWN_OFFENDERS} more" if len(offenders) > SHOWN_OFFENDERS else ""
    return (
        f"{named}{more}, expected {expected}: DataParallel broadcasts the module from device_ids[0], so every "
        f"parameter and buffer must be there before the call; call `model.to({expected!r})` after building "
        "or changing the model, before the forward."
    )


def batch_dim_moved(where: str, per_replica: Sequence[int], gathered: Sequence[int], batch: int, dim: int, moved_to: int) -> str:
    """DPL301: a gathered output whose batch is not at the gather dim."""
    return (
        f"forward returned {list(per_replica)} per replica ({where}); gathered along dim {dim} this became "
        f"{list(gathered)} for a batch of {batch}: the batch dimension is at dim {moved_to} of the output, so "
        f"DataParallel concatenated along the wrong dimension and silently mixed up samples. A permute/transpose "
        f"in forward likely moved the batch: permute back before returning, and apply the permute after the "
        f"DataParallel call."
    )


def batch_dim_moved_uneven(where: str, per_replica: Sequence[Sequence[int]], chunks: Sequence[int], dim: int, moved_to: int) -> str:
    """DPL301 on a batch that splits unevenly: there torch's gather fails instead of mixing samples."""
    shapes = ", ".join(str(list(shape)) for shape in per_replica)
    return (
        f"forward returned {shapes} per replica ({where}) for a batch of {sum(chunks)} split {list(chunks)}: the "
        f"batch is at dim {moved_to} of the output, so on GPUs DataParallel's gather along dim {dim} raises a size "
        "mismatch on this uneven batch (and silently mixes samples on even ones); permute back before returning, "
        "and apply the permute after the DataParallel call."
    )


def prefix_mismatch(expected: AbstractSet[str], given: AbstractSet[str]) -> Optional[str]:
    """DPL303: how a state_dict's keys differ from the model's by the `module.` prefix, if they do."""
    if not expected or not given or expected == given:
        return None
    if {key[len(PREFIX):] if key.startswith(PREFIX) else key for key in given} == expected:
        return "the checkpoint's keys start with `module.` (saved from a DataParallel/DDP wrapper) and the model's do not"
    if {PREFIX + key for key in given} == expected:
        return "the model's keys start with `module.` (it is wrapped) and the checkpoint's do not"
    if all(key.startswith(PREFIX) for key in given) and not any(key.startswith(PREFIX) for key in expected):
        matching = len({key[len(PREFIX):] for key in given} & expected)
        return (
            "the checkpoint's keys all start with `module.` (saved from a DataParallel/DDP wrapper) and the model's "
            f"do not; even without the prefix only {matching} of its {len(given)} keys match the model's {len(expected)}"
        )
    return None


def wrapper_state_dict_prefix(difference: str, strict: bool) -> str:
    """DPL303 at `load_state_dict`."""
    consequence = "strict loading fails" if strict else "`strict=False` would silently load nothing"
    return (
        f"load_state_dict: {difference}, so {consequence}; strip the prefix with "
        '`consume_prefix_in_state_dict_if_present(state_dict, "module.")`, load into `model.module`, or save '
        '`getattr(model, "module", model).state_dict()` in the first place.'
    )


def forward_mutates_module_state(class_name: str, changes: Sequence[str]) -> str:
    """DPL304."""
    return (
        f"`{class_name}.forward` {', '.join(changes)}: under DataParallel, forward runs on per-call replicas, so "
        "this is lost when the call returns (or races between replicas); keep the state outside the module, "
        "or update a registered buffer in place (`self.steps.add_(1)`), which only replica 0 keeps."
    )


def scalar_output(where: str, replicas: int, chunk_sizes: Sequence[int]) -> str:
    """DPL305."""
    uneven = len(set(chunk_sizes)) > 1
    weighting = (
        f"and the chunks are uneven ({list(chunk_sizes)}), so averaging it weights samples unequally"
        if uneven
        else "so `backward()` needs a reduction and any average over it ignores how the batch was split"
    )
    return (
        f"forward returned a 0-dim tensor ({where}) on each replica; DataParallel gathered it into a vector of "
        f"{replicas} values, one per replica, {weighting}; return per-sample values (`reduction=\"none\"`) and "
        "reduce after the call."
    )


def parameters_in_replica(source: str, error: str, replica: int) -> str:
    """DPL311: a replica's forward took the first of its (empty) `parameters()`."""
    shown = source if len(source) <= 60 else source[:59] + "…"
    return (
        f"`{shown}` raised {error} in replica {replica}: DataParallel's replicas hold their weights as plain "
        "attributes, not parameters (since torch 1.5), so `parameters()` is empty in their forward; take the "
        "device or dtype from an input (`x.device`), a registered buffer, or a weight (`self.fc.weight.device`)."
    )


def uneven_batch(batch: int, devices: int, chunk_sizes: Sequence[int]) -> str:
    """DPL306."""
    idle = devices - len(chunk_sizes)
    return (
        f"a batch of {batch} on {devices} devices splits into {len(chunk_sizes)} chunks {list(chunk_sizes)}, so "
        f"{idle} device{'s' * (idle != 1)} sit{'s' * (idle == 1)} idle; use a batch size that is a multiple of "
        "the device count (and `drop_last=True` for the last batch)."
    )


SINGLE_DEVICE = (
    "DataParallel runs over a single device: there is no parallelism, only overhead, and none of the "
    "multi-GPU behaviour is exercised; use `model.to(device)` instead, or test with more devices "
    "(`dplint.runtime.checking(devices=2)`)."
)


def rows_not_independent(where: str, dim: int, difference: float, cause: str) -> str:
    """DPL309."""
    return (
        f"the gathered {where} differs from one forward of the whole batch (by up to {difference:.3g}): the rows "
        f"along the split dim {dim} are not independent samples; likely cause: {cause}"
    )


CAUSE_BATCH_NORM = (
    "BatchNorm in training mode normalises each replica's chunk with its own statistics, as on real GPUs: "
    "use `nn.SyncBatchNorm` with DistributedDataParallel, or larger per-device batches (said once: this holds "
    "for every BatchNorm model)."
)
CAUSE_TIME_MAJOR = (
    "a `batch_first=False` layer takes a time-major [S, B, ...] input, so dim 0 splits the sequence: wrap with "
    "`nn.DataParallel(model, dim=1)` or use `batch_first=True`."
)
CAUSE_MIXING = (
    "a layer mixes samples along it (attention, normalisation or a reduction over that dim): split along the "
    "batch dim (`nn.DataParallel(model, dim=...)`) or move the mixing after the call."
)


def samples_dropped(dropped: int, total: int, where: str, dim: int, replicas: int, chunk_counts: Sequence[int]) -> str:
    """DPL310."""
    return (
        f"inputs split into different numbers of chunks along dim {dim} ({list(chunk_counts)}), so only {replicas} "
        f"replicas ran and {dropped} of the {total} rows of {where} were silently dropped; give every "
        "per-sample input the same batch size and pass shared tensors as module attributes or buffers."
    )


def unknown_dim(class_name: str) -> str:
    return (
        f"this `{class_name}` was built before dplint's checks were installed, on a machine without GPUs, so torch "
        "kept neither its `dim` nor its `device_ids`: it runs unsimulated; build the wrapper inside "
        "`dplint.runtime.checking()` (or in the test, not in a wider-scoped fixture)."
    )
