"""DPL304 at runtime: what a replica's `forward` changed that DataParallel throws away.

A replica is a shallow copy made for one call: its `__dict__`, `_parameters`, `_buffers` and
`_modules` are its own, so rebinding any of them (`self.steps += 1`, `self.ema = 0.9 * self.ema`,
`self.head = nn.Linear(...)`) is lost with it, and an in-place change of a shared container or plain
tensor attribute (`self.cache[k] = v`, `self.total += x`) races between replicas. In-place updates of
registered buffers (BatchNorm's statistics) are the supported way and are not reported.

Left alone is what torch itself maintains: modules whose class is torch's own, the attributes that
torch's base classes use (a user `class MyLSTM(nn.LSTM)` refreshes `_flat_weights`), and the
attributes that torch's reparametrisation hooks recompute in every forward (`spectral_norm`,
`weight_norm`, pruning).
"""

from __future__ import annotations

import functools
import types
from typing import Any, Dict, FrozenSet, Iterator, List, Sequence, Tuple

import torch
from torch import nn

# Set by nn.Module itself, or by replication: bookkeeping, not user state.
_MODULE_INTERNALS = frozenset(nn.Module().__dict__) | {"_former_parameters", "_is_replica", "training"}
_GENERATED_MODULE = "torch.nn.utils.parametrize"  # register_parametrization's per-module subclasses

Snapshot = List[Dict[str, Dict[str, Any]]]


def _own_class(module: nn.Module) -> type:
    """The module's class, seen through the subclass that `register_parametrization` generates."""
    for cls in type(module).__mro__:
        if cls.__module__ != _GENERATED_MODULE:
            return cls
    return type(module)


def _is_torch_class(cls: type) -> bool:
    return cls.__module__ == "torch" or cls.__module__.startswith("torch.")


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_names(constant)


@functools.lru_cache(maxsize=None)
def _torch_base_names(cls: type) -> FrozenSet[str]:
    """Attribute names used by the code of torch's classes that `cls` derives from (nn.Module excepted)."""
    names = set()
    for base in cls.__mro__:
        if base is nn.Module or not _is_torch_class(base):
            continue
        for value in vars(base).values():
            function = getattr(value, "__func__", value)
            if isinstance(function, types.FunctionType):
                names.update(_code_names(function.__code__))
    return frozenset(names)


def _hook_owned_names(module: nn.Module) -> FrozenSet[str]:
    """Attributes that torch's forward pre-hooks recompute: spectral_norm and weight_norm name them
    `name`, pruning methods `_tensor_name`."""
    names = set()
    for hook in module._forward_pre_hooks.values():
        if _is_torch_class(type(hook)):
            for attribute in ("name", "_tensor_name"):
                value = getattr(hook, attribute, None)
                if isinstance(value, str):
                    names.add(value)
    return frozenset(names)


def _fingerprint(value: Any) -> Tuple[Any, ...]:
    if isinstance(value, torch.Tensor):
        return (id(value), value._version)
    if isinstance(value, dict):
        return (id(value), tuple((id(k), id(v)) for k, v in value.items()))
    if isinstance(value, list):
        return (id(value), tuple(map(id, value)))
    if isinstance(value, set):
        return (id(value), frozenset(map(id, value)))
    return (id(value),)


def _checked(module: nn.Module) -> bool:
    return not _is_torch_class(_own_class(module))


def snapshot(replica: nn.Module) -> Snapshot:
    """Per submodule of the replica: the identities (and versions, contents) of its state."""
    states = []
    for submodule in replica.modules():
        if not _checked(submodule):
            states.append({})
            continue
        states.append(
            {
                "attribute": {key: _fingerprint(value) for key, value in submodule.__dict__.items()},
                "parameter": {key: (id(value),) for key, value in submodule._parameters.items()},
                "buffer": {key: (id(value),) for key, value in submodule._buffers.items()},
                "module": {key: (id(value),) for key, value in submodule._modules.items()},
            }
        )
    return states


def _differences(before: Dict[str, Tuple[Any, ...]], after: Dict[str, Tuple[Any, ...]]) -> Iterator[Tuple[str, str]]:
    for key in dict.fromkeys([*before, *after]):
        if key not in before:
            yield key, "sets"
        elif key not in after:
            yield key, "deletes"
        elif before[key][0] != after[key][0]:
            yield key, "rebinds"
        elif before[key] != after[key]:
            yield key, "changes"


_KINDS = {"attribute": "", "parameter": "the parameter ", "buffer": "the buffer ", "module": "the submodule "}


def changes(before: Snapshot, replica: nn.Module, originals: Sequence[nn.Module]) -> List[str]:
    """What `forward` changed on this replica, compared with `snapshot` taken before it ran."""
    found: List[str] = []
    now = snapshot(replica)
    for state, after, submodule, original in zip(before, now, replica.modules(), originals):
        if not state:
            continue
        prefix = "" if original is originals[0] else f"{type(original).__name__}: "
        ignored = _MODULE_INTERNALS | _torch_base_names(_own_class(original)) | _hook_owned_names(submodule)
        for kind, label in _KINDS.items():
            for key, verb in _differences(state[kind], after[kind]):
                if kind == "attribute" and (key in ignored or key in original._parameters or key in original._buffers):
                    continue  # parameters live in a replica's __dict__; their in-place updates are torch's
                if kind == "attribute" and verb == "changes":
                    found.append(f"{prefix}changes `self.{key}` in place")
                else:
                    found.append(f"{prefix}{verb} {label}`self.{key}`")
    return list(dict.fromkeys(found))
