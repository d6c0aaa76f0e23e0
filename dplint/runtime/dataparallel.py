"""Runtime checks around every `nn.DataParallel` forward, with N devices simulated on CPU.

    with dplint.runtime.checking(devices=2):
        model = nn.DataParallel(Net())
        model(batch)  # scattered into 2 chunks, run on 2 replicas, gathered: as on 2 GPUs

Simulation follows DataParallel's own code (torch/nn/parallel): inputs are split with
`tensor.chunk(n, dim)` (so 30 on 8 devices is [4]*7 + [2]), non-tensors are shared by every
replica, keyword arguments are padded the way `scatter_kwargs` pads them, every replica is a
`_replicate_for_data_parallel` copy (attribute assignments in forward are lost, buffers are shared
only by the first replica), and outputs are gathered recursively by concatenation along `dim`.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import warnings
import weakref
from dataclasses import dataclass
from itertools import chain
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from dplint.rules import (
    batch_dim_moved,
    forward_mutates_module_state,
    module_off_primary_device,
    scalar_output_from_forward,
    single_device_data_parallel,
    uneven_batch,
    wrapper_state_dict_prefix,
)

__all__ = ["PitfallError", "PitfallWarning", "checking", "install", "is_installed", "uninstall"]

ADVICE = frozenset({"DPL306", "DPL307"})
ACTIONS = ("raise", "warn")


class _Located:
    """What both the error and the warning carry: the code, the message and where `forward` is."""

    def _locate(self, code: str, message: str, module: Optional[nn.Module]) -> str:
        self.code = code
        self.message = message
        self.module_class = type(module).__qualname__ if module is not None else None
        self.filename, self.lineno = _forward_location(type(module)) if module is not None else (None, None)
        where = f" [{self.module_class}.forward at {self.filename}:{self.lineno}]" if self.filename else ""
        return f"{code} {message}{where}"


class PitfallError(_Located, RuntimeError):
    """A DataParallel pitfall found at runtime; `.code`, `.message`, `.module_class`, `.filename`, `.lineno`."""

    def __init__(self, code: str, message: str, module: Optional[nn.Module] = None) -> None:
        super().__init__(self._locate(code, message, module))


class PitfallWarning(_Located, UserWarning):
    """An advice-level pitfall, or any pitfall under `action="warn"`; same attributes as PitfallError."""

    def __init__(self, code: str, message: str, module: Optional[nn.Module] = None) -> None:
        super().__init__(self._locate(code, message, module))


def _forward_location(cls: type) -> Tuple[Optional[str], Optional[int]]:
    try:
        function = inspect.unwrap(cls.forward)
        return inspect.getsourcefile(function), inspect.getsourcelines(function)[1]
    except (TypeError, OSError, AttributeError):
        return None, None


@dataclass(frozen=True)
class _Settings:
    devices: Optional[int]
    action: str


_lock = threading.RLock()
_stack: List[_Settings] = []
_original_forward = nn.DataParallel.forward
_original_init = nn.DataParallel.__init__
_original_apply = nn.Module._apply
_original_load_state_dict = nn.Module.load_state_dict
_hook_handles: List[Any] = []
# Bumped whenever a parameter or buffer may have been added or moved; DPL103 re-checks only then.
_generation = [0]
_warning_registry: Dict[Any, Any] = {}  # shows each advice once per place, not once per training step
_device_checks: "weakref.WeakKeyDictionary[nn.DataParallel, Tuple[int, Optional[str]]]" = weakref.WeakKeyDictionary()


def install(*, devices: Optional[int] = None, action: str = "raise") -> None:
    """Check every DataParallel forward from now on (calls nest: each install needs one uninstall)."""
    if devices is not None and (not isinstance(devices, int) or isinstance(devices, bool) or devices < 1):
        raise ValueError(f"devices must be a positive int or None, got {devices!r}")
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
    with _lock:
        if not _stack:
            _device_checks.clear()  # moves made while uninstalled were not tracked
            nn.DataParallel.forward = _checked_forward  # type: ignore[method-assign]
            nn.DataParallel.__init__ = _recording_init  # type: ignore[method-assign]
            nn.Module._apply = _tracking_apply  # type: ignore[method-assign]
            nn.Module.load_state_dict = _checked_load_state_dict  # type: ignore[method-assign]
            registration = torch.nn.modules.module
            _hook_handles.append(registration.register_module_parameter_registration_hook(_parameters_changed))
            _hook_handles.append(registration.register_module_buffer_registration_hook(_parameters_changed))
        _stack.append(_Settings(devices, action))


def uninstall() -> None:
    """Undo the latest `install`; the last one restores `DataParallel.forward` exactly."""
    with _lock:
        if not _stack:
            return
        _stack.pop()
        if not _stack:
            nn.DataParallel.forward = _original_forward  # type: ignore[method-assign]
            nn.DataParallel.__init__ = _original_init  # type: ignore[method-assign]
            nn.Module._apply = _original_apply  # type: ignore[method-assign]
            nn.Module.load_state_dict = _original_load_state_dict  # type: ignore[method-assign]
            while _hook_handles:
                _hook_handles.pop().remove()


def is_installed() -> bool:
    return bool(_stack)


@contextlib.contextmanager
def checking(devices: Optional[int] = None, action: str = "raise") -> Iterator[None]:
    """Check every DataParallel forward inside the block."""
    install(devices=devices, action=action)
    try:
        yield
    finally:
        uninstall()


def _recording_init(self: nn.DataParallel, module: nn.Module, device_ids=None, output_device=None, dim: int = 0) -> None:
    _original_init(self, module, device_ids, output_device, dim)
    # Without CUDA, DataParallel returns from __init__ before storing `dim`; simulation needs it.
    self._dplint_dim = dim


def _parameters_changed(*args: Any) -> None:
    _generation[0] += 1


def _tracking_apply(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
    _generation[0] += 1
    return _original_apply(self, *args, **kwargs)


def _checked_load_state_dict(self: nn.Module, state_dict: Any, strict: bool = True, *args: Any, **kwargs: Any) -> Any:
    """DPL303: keys that differ from the model's only by the `module.` prefix (silent under strict=False)."""
    settings = _stack[-1] if _stack else None
    if settings is not None and hasattr(state_dict, "keys"):
        difference = wrapper_state_dict_prefix.prefix_mismatch(set(self.state_dict().keys()), set(state_dict.keys()))
        if difference is not None:
            message = wrapper_state_dict_prefix.runtime_message(difference, strict)
            if settings.action == "raise":
                raise PitfallError("DPL303", message, self)
            warnings.warn(PitfallWarning("DPL303", message, self), stacklevel=2)
    return _original_load_state_dict(self, state_dict, strict, *args, **kwargs)


def _checked_forward(self: nn.DataParallel, *inputs: Any, **kwargs: Any) -> Any:
    settings = _stack[-1] if _stack else None
    if settings is None:
        return _original_forward(self, *inputs, **kwargs)
    return _Call(self, settings).run(inputs, kwargs)


# ----- DataParallel's semantics, for simulated devices ----------------------------------------------


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def scatter(obj: Any, devices: int, dim: int) -> List[Any]:
    """`torch.nn.parallel.scatter` onto `devices` simulated devices."""
    if isinstance(obj, torch.Tensor):
        return list(obj.chunk(devices, dim))
    if _is_namedtuple(obj):
        return [type(obj)(*args) for args in zip(*(scatter(o, devices, dim) for o in obj))]
    if isinstance(obj, tuple) and len(obj) > 0:
        return list(zip(*(scatter(o, devices, dim) for o in obj)))
    if isinstance(obj, list) and len(obj) > 0:
        return [list(i) for i in zip(*(scatter(o, devices, dim) for o in obj))]
    if isinstance(obj, dict) and len(obj) > 0:
        return [type(obj)(i) for i in zip(*(scatter(o, devices, dim) for o in obj.items()))]
    return [obj for _ in range(devices)]


def scatter_kwargs(inputs: Tuple[Any, ...], kwargs: Dict[str, Any], devices: int, dim: int):
    """`torch.nn.parallel.scatter_kwargs`, including its padding (and its quirk of comparing to `inputs`)."""
    scattered_inputs = scatter(inputs, devices, dim) if inputs else []
    scattered_kwargs = scatter(kwargs, devices, dim) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
    elif len(scattered_kwargs) < len(inputs):
        scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
    return tuple(scattered_inputs), tuple(scattered_kwargs)


def replicate(module: nn.Module, copies: int) -> List[nn.Module]:
    """`torch.nn.parallel.replicate` without devices: parameters become non-leaf views (gradients
    reach the originals), the first replica shares the buffers, the others get copies."""
    modules = list(module.modules())
    index = {m: i for i, m in enumerate(modules)}
    replicas = [[m._replicate_for_data_parallel() for m in modules] for _ in range(copies)]
    for i, original in enumerate(modules):
        for j in range(copies):
            replica = replicas[j][i]
            for key, child in original._modules.items():
                if child is None:
                    replica._modules[key] = None
                else:
                    setattr(replica, key, replicas[j][index[child]])
            for key, param in original._parameters.items():
                if param is None:
                    replica._parameters[key] = None
                else:
                    setattr(replica, key, param.view_as(param))
            for key, buffer in original._buffers.items():
                if buffer is None:
                    replica._buffers[key] = None
                else:
                    setattr(replica, key, buffer if j == 0 else buffer.clone())
    return [replicas[j][0] for j in range(copies)]


def parallel_apply(replicas: Sequence[nn.Module], inputs: Sequence[Any], kwargs: Sequence[Dict[str, Any]]) -> List[Any]:
    if len(replicas) != len(inputs):
        raise AssertionError(f"The number of modules {len(replicas)} is not equal to the number of inputs {len(inputs)}")
    if len(replicas) != len(kwargs):
        raise AssertionError(f"The number of modules {len(replicas)} is not equal to the number of kwargs_tup {len(kwargs)}")
    outputs = []
    for replica, positional, keywords in zip(replicas, inputs, kwargs):
        if not isinstance(positional, (list, tuple)):
            positional = (positional,)
        outputs.append(replica(*positional, **keywords))
    return outputs


def gather(outputs: Sequence[Any], dim: int) -> Any:
    """`torch.nn.parallel.gather`: tensors concatenated along `dim`, containers recursively."""
    out = outputs[0]
    if isinstance(out, torch.Tensor):
        tensors = list(outputs)
        if all(t.dim() == 0 for t in tensors) and dim == 0:
            tensors = [t.view(1) for t in tensors]
            warnings.warn(
                "Was asked to gather along dimension 0, but all input tensors were scalars; "
                "will instead unsqueeze and return a vector.",
                stacklevel=2,
            )
        return torch.cat(tensors, dim)
    if out is None:
        return None
    if isinstance(out, dict):
        if not all(len(out) == len(d) for d in outputs):
            raise ValueError("All dicts must have the same number of keys")
        return type(out)((k, gather([d[k] for d in outputs], dim)) for k in out)
    if _is_namedtuple(out):
        return type(out)._make(gather(parts, dim) for parts in zip(*outputs))
    return type(out)(map(lambda parts: gather(parts, dim), zip(*outputs)))


# ----- the checks -----------------------------------------------------------------------------------

_TORCH_INTERNAL = frozenset(nn.Module().__dict__) | {"_former_parameters", "_is_replica", "training"}


def _snapshot(module: nn.Module) -> List[Dict[str, Tuple[int, int]]]:
    """Per submodule: attribute → (identity, size for containers), for DPL304.

    torch's own modules are left out: they refresh private caches in forward (an RNN rebinds its
    flat weights for every replica), which is bookkeeping, not state a user relies on.
    """
    snapshots = []
    for submodule in module.modules():
        state = {}
        if type(submodule).__module__.startswith("torch."):
            snapshots.append(state)
            continue
        for key, value in submodule.__dict__.items():
            if key not in _TORCH_INTERNAL:
                state[key] = (id(value), len(value) if isinstance(value, (list, dict, set)) else -1)
        snapshots.append(state)
    return snapshots


def _changes(before: List[Dict[str, Tuple[int, int]]], module: nn.Module, originals: Sequence[nn.Module]) -> List[str]:
    changes: List[str] = []
    for state, submodule, original in zip(before, module.modules(), originals):
        if type(submodule).__module__.startswith("torch."):
            continue
        prefix = "" if original is originals[0] else f"{type(original).__name__}: "
        for key, value in submodule.__dict__.items():
            if key in _TORCH_INTERNAL or key in original._parameters or key in original._buffers:
                continue
            if key not in state:
                changes.append(f"{prefix}sets `self.{key}`")
            elif state[key][0] != id(value):
                changes.append(f"{prefix}rebinds `self.{key}`")
            elif state[key][1] != (len(value) if isinstance(value, (list, dict, set)) else -1):
                changes.append(f"{prefix}changes `self.{key}` in place")
    return list(dict.fromkeys(changes))


def _leaves(outputs: Sequence[Any], where: str = "output") -> Iterator[Tuple[str, List[torch.Tensor]]]:
    """Each tensor position of the replicas' outputs, with the tensor from every replica."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if all(isinstance(o, torch.Tensor) for o in outputs):
            yield where, list(outputs)
    elif isinstance(first, dict):
        for key in first:
            if all(isinstance(o, dict) and key in o for o in outputs):
                yield from _leaves([o[key] for o in outputs], f"{where}[{key!r}]")
    elif isinstance(first, (list, tuple)):
        for index in range(len(first)):
            if all(isinstance(o, (list, tuple)) and len(o) > index for o in outputs):
                yield from _leaves([o[index] for o in outputs], f"{where}[{index}]")


def _first_tensor(obj: Any) -> Optional[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return obj
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    for value in values:
        found = _first_tensor(value)
        if found is not None:
            return found
    return None


class _Call:
    """One checked DataParallel forward."""

    def __init__(self, wrapper: nn.DataParallel, settings: _Settings) -> None:
        self.wrapper = wrapper
        self.module: nn.Module = wrapper.module
        self.settings = settings
        # A wrapper built before the hook was installed on a machine without CUDA has no record of
        # its `dim`: DataParallel's default, 0, is assumed.
        self.dim: int = getattr(wrapper, "dim", getattr(wrapper, "_dplint_dim", 0))
        self.devices = 0

    def report(self, code: str, message: str) -> None:
        if code not in ADVICE and self.settings.action == "raise":
            raise PitfallError(code, message, self.module)
        warning = PitfallWarning(code, message, self.module)
        if warning.filename is None:
            warnings.warn(warning, stacklevel=2)
        else:  # point at the module's forward, not at dplint's frames
            warnings.warn_explicit(warning, PitfallWarning, warning.filename, warning.lineno, registry=_warning_registry)

    def run(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        real = len(self.wrapper.device_ids)
        wanted = self.settings.devices
        with torch.autograd.profiler.record_function("DataParallel.forward"):
            if wanted is not None and real < wanted:
                self.devices = wanted
                return self.simulate(inputs, kwargs, wanted)
            if not real:
                return self.passthrough(inputs, kwargs)
            self.devices = real
            return self.real(inputs, kwargs)

    def passthrough(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """No GPU and no simulation: DataParallel calls the module directly; only DPL304 can be seen."""
        originals = list(self.module.modules())
        before = _snapshot(self.module)
        output = self.module(*inputs, **kwargs)
        changes = _changes(before, self.module, originals)
        if changes:
            self.report("DPL304", forward_mutates_module_state.message(type(self.module).__name__, changes))
        return output

    def simulate(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any], devices: int) -> Any:
        expected = self.wrapper.src_device_obj if self.wrapper.device_ids else torch.device("cpu")
        self.check_devices(expected)
        scattered, scattered_kwargs = scatter_kwargs(inputs, kwargs, devices, self.dim)
        if not scattered and not scattered_kwargs:
            scattered, scattered_kwargs = ((),), ({},)
        if devices == 1:
            self.report("DPL307", single_device_data_parallel.MESSAGE)
            return self.module(*scattered[0], **scattered_kwargs[0])
        replicas = replicate(self.module, len(scattered))
        return self.apply_and_gather(
            replicas,
            self.chunk_sizes(inputs, kwargs, devices),
            lambda: parallel_apply(replicas, scattered, scattered_kwargs),
            lambda outputs: gather(outputs, self.dim),
        )

    def real(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """Real GPUs: DataParallel's own steps, with the checks between them."""
        wrapper = self.wrapper
        self.check_devices(wrapper.src_device_obj)
        scattered, scattered_kwargs = wrapper.scatter(inputs, kwargs, wrapper.device_ids)
        if not scattered and not scattered_kwargs:
            scattered, scattered_kwargs = ((),), ({},)
        if len(wrapper.device_ids) == 1:
            self.report("DPL307", single_device_data_parallel.MESSAGE)
            return self.module(*scattered[0], **scattered_kwargs[0])
        replicas = wrapper.replicate(self.module, wrapper.device_ids[: len(scattered)])
        return self.apply_and_gather(
            replicas,
            self.chunk_sizes(inputs, kwargs, len(wrapper.device_ids)),
            lambda: wrapper.parallel_apply(replicas, scattered, scattered_kwargs),
            lambda outputs: wrapper.gather(outputs, wrapper.output_device),
        )

    def apply_and_gather(self, replicas: List[nn.Module], sizes: Optional[List[int]], apply, gather_outputs) -> Any:
        if sizes is not None and len(sizes) < self.devices:
            self.report("DPL306", uneven_batch.message(sum(sizes), self.devices, sizes))
        originals = list(self.module.modules())
        # Replication itself rebinds some attributes (an RNN copies its weight lists): compare each
        # replica with itself, before and after its forward.
        before = [_snapshot(replica) for replica in replicas]
        outputs = apply()
        self.check_outputs(outputs, sizes)
        for replica, state in zip(replicas, before):
            changes = _changes(state, replica, originals)
            if changes:
                self.report("DPL304", forward_mutates_module_state.message(type(self.module).__name__, changes))
                break
        return gather_outputs(outputs)

    def check_devices(self, expected: torch.device) -> None:
        """DPL103, cached per wrapper until a parameter or buffer is registered or moved."""
        cached = _device_checks.get(self.wrapper)
        key = f"{_generation[0]}:{expected}"
        if cached is not None and cached[0] == key:
            message = cached[1]
        else:
            named = chain(self.module.named_parameters(), self.module.named_buffers())
            offenders = [(name, str(t.device)) for name, t in named if t.device != expected]
            message = module_off_primary_device.message(offenders, str(expected)) if offenders else None
            _device_checks[self.wrapper] = (key, message)
        if message is not None:
            self.report("DPL103", message)

    def chunk_sizes(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any], devices: int) -> Optional[List[int]]:
        """How the batch splits: the sizes of the first input tensor's chunks along `dim`."""
        tensor = _first_tensor((inputs, kwargs))
        if tensor is None or tensor.dim() <= self.dim:
            return None
        return [chunk.size(self.dim) for chunk in tensor.chunk(devices, self.dim)]

    def check_outputs(self, outputs: Sequence[Any], chunk_sizes: Optional[List[int]]) -> None:
        """DPL305 for 0-dim outputs, DPL301 for outputs whose batch is not at the gather dim."""
        for where, tensors in _leaves(outputs):
            if all(t.dim() == 0 for t in tensors):
                self.report("DPL305", scalar_output_from_forward.message(where, len(tensors), chunk_sizes or []))
                continue
            if chunk_sizes is None or len(chunk_sizes) != len(tensors) or any(t.dim() <= self.dim for t in tensors):
                continue
            if all(t.size(self.dim) == size for t, size in zip(tensors, chunk_sizes)):
                continue
            moved_to = next(
                (
                    d
                    for d in range(tensors[0].dim())
                    if d != self.dim and all(t.dim() > d and t.size(d) == size for t, size in zip(tensors, chunk_sizes))
                ),
                None,
            )
            if moved_to is None:
                continue  # not per-sample output: nothing says the batch moved
            gathered = list(tensors[0].shape)
            gathered[self.dim] = sum(t.size(self.dim) for t in tensors)
            message = batch_dim_moved.gathered_output_message(
                where, list(tensors[0].shape), gathered, sum(chunk_sizes), self.dim, moved_to
            )
            self.report("DPL301", message)
