"""The runtime checks' messages: what is wrong in this call, and what to write instead."""

from __future__ import annotations

from typing import AbstractSet, NamedTuple, Optional, Sequence, Tuple

PREFIX = "module."
SHOWN_OFFENDERS = 5


class Said(NamedTuple):
    """A finding's message, one sentence on what is wrong in this call, and its help line: what to write
    instead. Why it is wrong is in the rule's docs (`dplint --explain CODE`)."""

    message: str
    help: str


def module_off_primary_device(offenders: Sequence[Tuple[str, str]], expected: str) -> Said:
    """DPL103."""
    named = ", ".join(f"{name} on {device}" for name, device in offenders[:SHOWN_OFFENDERS])
    more = f" and {len(offenders) - SHOWN_OFFENDERS} more" if len(offenders) > SHOWN_OFFENDERS else ""
    return Said(
        f"the module must be on device_ids[0] ({expected}), which DataParallel broadcasts from: {named}{more}",
        f"call `model.to({expected!r})` after building or changing the model, before the forward",
    )


_PERMUTE_BACK = "permute back before returning, and apply the permute after the DataParallel call"


def batch_dim_moved(where: str, per_replica: Sequence[int], gathered: Sequence[int], batch: int, dim: int, moved_to: int) -> Said:
    """DPL301: a gathered output whose batch is not at the gather dim."""
    return Said(
        f"forward returned {list(per_replica)} per replica ({where}); gathered along dim {dim} this became "
        f"{list(gathered)} for a batch of {batch}, whose samples are at dim {moved_to}",
        _PERMUTE_BACK,
    )


def batch_dim_moved_uneven(where: str, per_replica: Sequence[Sequence[int]], chunks: Sequence[int], dim: int, moved_to: int) -> Said:
    """DPL301 on a batch that splits unevenly: there torch's gather fails instead of mixing samples."""
    shapes = ", ".join(str(list(shape)) for shape in per_replica)
    return Said(
        f"forward returned {shapes} per replica ({where}) for a batch split {list(chunks)}, its samples at dim "
        f"{moved_to}: on GPUs the gather along dim {dim} raises a size mismatch",
        _PERMUTE_BACK,
    )


def prefix_mismatch(expected: AbstractSet[str], given: AbstractSet[str]) -> Optional[str]:
    """DPL303: how a state_dict's keys differ from the model's by the `module.` prefix, if they do."""
    if not expected or not given or expected == given:
        return None
    if {key[len(PREFIX):] if key.startswith(PREFIX) else key for key in given} == expected:
        return "the checkpoint's keys start with `module.` and the model's do not"
    if {PREFIX + key for key in given} == expected:
        return "the model's keys start with `module.` (it is wrapped) and the checkpoint's do not"
    if all(key.startswith(PREFIX) for key in given) and not any(key.startswith(PREFIX) for key in expected):
        matching = len({key[len(PREFIX):] for key in given} & expected)
        return (
            f"the checkpoint's keys all start with `module.`, the model's do not, and only {matching} of its "
            f"{len(given)} keys match the model's {len(expected)} even without it"
        )
    return None


def wrapper_state_dict_prefix(difference: str, strict: bool) -> Said:
    """DPL303 at `load_state_dict`."""
    consequence = "strict loading fails" if strict else "`strict=False` would silently load nothing"
    return Said(
        f"load_state_dict: {difference}, so {consequence}",
        'strip the prefix with `consume_prefix_in_state_dict_if_present(state_dict, "module.")`, or load into '
        "`model.module`; save `getattr(model, \"module\", model).state_dict()` from now on",
    )


def forward_mutates_module_state(class_name: str, changes: Sequence[str]) -> Said:
    """DPL304."""
    return Said(
        f"`{class_name}.forward` {', '.join(changes)}, on DataParallel's per-call replicas: the change is lost",
        "keep the state outside the module, or update a buffer in place (`self.steps.add_(1)`): replica 0 keeps it",
    )


def scalar_output(where: str, replicas: int, chunk_sizes: Sequence[int]) -> Said:
    """DPL305."""
    uneven = f", from uneven chunks {list(chunk_sizes)}" if len(set(chunk_sizes)) > 1 else ""
    return Said(
        f"forward returned a 0-dim tensor ({where}); DataParallel gathered it into {replicas} values, one per "
        f"replica{uneven}",
        'return per-sample values (`reduction="none"`) and reduce after the call',
    )


def parameters_in_replica(source: str, error: str, replica: int) -> Said:
    """DPL311: a replica's forward took the first of its (empty) `parameters()`."""
    shown = source if len(source) <= 60 else source[:59] + "…"
    return Said(
        f"`{shown}` raised {error} in replica {replica}, whose `parameters()` is empty",
        "take the device or dtype from an input (`x.device`), a buffer, or a weight (`self.fc.weight.device`)",
    )


def uneven_batch(batch: int, devices: int, chunk_sizes: Sequence[int]) -> Said:
    """DPL306."""
    idle = devices - len(chunk_sizes)
    return Said(
        f"a batch of {batch} on {devices} devices splits into {len(chunk_sizes)} chunks {list(chunk_sizes)}, so "
        f"{idle} device{'s' * (idle != 1)} sit{'s' * (idle == 1)} idle",
        "use a batch size that is a multiple of the device count (and `drop_last=True` for the last batch)",
    )


SINGLE_DEVICE = Said(
    "DataParallel runs over a single device: no parallelism, and no multi-GPU behaviour is exercised",
    "call the module directly (`model.to(device)`), or test with `dplint.runtime.checking(devices=2)`",
)


def rows_not_independent(where: str, difference: float, cause: Said) -> Said:
    """DPL309."""
    return Said(
        f"the gathered {where} differs from one forward of the whole batch (by up to {difference:.3g}): {cause.message}",
        cause.help,
    )


CAUSE_BATCH_NORM = Said(
    "BatchNorm in training normalises each replica's chunk on its own, as on GPUs (said once per run)",
    "use `nn.SyncBatchNorm` with DistributedDataParallel, or larger per-device batches",
)
CAUSE_TIME_MAJOR = Said(
    "a `batch_first=False` layer takes [S, B, ...], so splitting dim 0 split the sequence",
    "wrap with `nn.DataParallel(model, dim=1)`, or use `batch_first=True`",
)


def cause_mixing(dim: int) -> Said:
    """DPL309's cause when nothing narrower explains it: a layer mixes the rows along the split dim."""
    return Said(
        f"the rows along the split dim {dim} are not independent samples",
        "split along the batch dim (`nn.DataParallel(model, dim=...)`), or move what mixes rows after the call",
    )


def samples_dropped(dropped: int, total: int, where: str, dim: int, replicas: int, chunk_counts: Sequence[int]) -> Said:
    """DPL310."""
    return Said(
        f"inputs split into {list(chunk_counts)} chunks along dim {dim}, so only {replicas} replicas ran and "
        f"{dropped} of the {total} rows of {where} were dropped",
        "give every per-sample input the same batch size; pass shared tensors as module attributes or buffers",
    )


def unknown_dim(class_name: str) -> str:
    return (
        f"this `{class_name}` was built before dplint's checks were installed, on a machine without GPUs, so torch "
        "kept neither its `dim` nor its `device_ids`: it runs unsimulated; build the wrapper inside "
        "`dplint.runtime.checking()` (or in the test, not in a wider-scoped fixture)."
    )
