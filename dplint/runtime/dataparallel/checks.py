"""Runtime checks around every `nn.DataParallel` forward, with N devices simulated on CPU.

    with dplint.runtime.checking(devices=2):
        model = nn.DataParallel(Net())
        model(batch)  # scattered into 2 chunks, run on 2 replicas, gathered: as on 2 GPUs

A simulated forward takes torch's own steps (`DataParallel.forward`): the wrapper's `scatter`,
`replicate`, `parallel_apply` and `gather` are called, so a subclass's overrides run; the base
class's versions do what torch's do, for simulated devices (`dplint.runtime.dataparallel.simulation`).

Settings are per thread (per context, `contextvars`): `checking()` in one thread leaves every other
thread's DataParallel calls as they were. torch itself is patched while any thread has the checks on;
only `DataParallel.__init__` stays wrapped from the import of this module on, to keep each wrapper's
`dim` and `device_ids`, which torch drops on machines without GPUs.

An exception that leaves a patched function (a finding, or the user's own from a replica's forward)
shows the user's frames and torch's, none of dplint's (`frames`), whether the checks were turned on
by `checking()` or by `install()`; `checking()`'s exit unlinks them from what leaves its block too.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import io
import linecache
import re
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from dplint.finding import Finding
from dplint.runtime.dataparallel import frames, messages, module_state, simulation
from dplint.runtime.findings import runtime_finding
from dplint.runtime.origins import user_code

__all__ = ["RUNTIME_CODES", "PitfallError", "PitfallWarning", "checking", "install", "is_installed", "uninstall"]

RUNTIME_CODES = frozenset(
    {"DPL103", "DPL301", "DPL303", "DPL304", "DPL305", "DPL306", "DPL307", "DPL309", "DPL310", "DPL311"}
)
ADVICE = frozenset({"DPL306", "DPL307"})
ACTIONS = ("raise", "warn")


# A line of the user's code, where a finding happened there rather than at `forward`: the file, the
# line and the function it is in.
Line = Tuple[str, int, str]


class _Located:
    """What both the error and the warning carry: the code, the message and where `forward` is (or the
    line of the user's code the finding is about)."""

    def _locate(self, code: str, said: messages.Said, module: Optional[nn.Module], line: Optional[Line] = None) -> str:
        self.code = code
        self.message, self.help = said
        self.module_class = type(module).__qualname__ if module is not None else None
        if line is not None:
            self.filename, self.lineno, function = line
            where = f" [{function} at {self.filename}:{self.lineno}, on a {self.module_class} replica]"
        else:
            self.filename, self.lineno = _forward_location(type(module)) if module is not None else (None, None)
            where = f" [{self.module_class}.forward at {self.filename}:{self.lineno}]" if self.filename else ""
        return f"{code} {self.message}{where}\n  help: {self.help}"

    @property
    def finding(self) -> Optional[Finding]:
        """The linter's Finding for it (what `dplint run --devices` and the CI annotations report); None
        when it has no place in the user's code (a module of torch's own)."""
        if not self.filename:
            return None
        from dplint.finding import display_path

        return runtime_finding(self.code, self.message, f"{display_path(self.filename)}:{self.lineno}", help=self.help)


class PitfallError(_Located, RuntimeError):
    """A DataParallel pitfall found at runtime; `.code`, `.message`, `.help`, `.module_class`, `.filename`, `.lineno`."""

    def __init__(self, code: str, said: messages.Said, module: Optional[nn.Module] = None, line: Optional[Line] = None) -> None:
        super().__init__(self._locate(code, said, module, line))


class PitfallWarning(_Located, UserWarning):
    """An advice-level pitfall, or any pitfall under `action="warn"`; same attributes as PitfallError."""

    def __init__(self, code: str, said: messages.Said, module: Optional[nn.Module] = None, line: Optional[Line] = None) -> None:
        super().__init__(self._locate(code, said, module, line))


def _entry(function: Callable[..., Any]) -> Callable[..., Any]:
    """A function of dplint that torch or the user calls (a patch): an exception leaving it, a finding or
    the user's own, shows none of dplint's frames (`frames`), under `checking()` and `install()` alike."""

    @functools.wraps(function)
    def entry(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            frames.hide_own_frames(error, (PitfallError, PitfallWarning))
            raise

    return entry


def _forward_location(cls: type) -> Tuple[Optional[str], Optional[int]]:
    """Where the module's own `forward` is; None for torch's (a module without forward, or torch's class)."""
    try:
        function = inspect.unwrap(cls.forward)
        if function.__module__.startswith("torch."):
            return None, None
        return inspect.getsourcefile(function), inspect.getsourcelines(function)[1]
    except (TypeError, OSError, AttributeError):
        return None, None


# ----- settings, per context, and the patches, process-wide ------------------------------------------


@dataclass(frozen=True)
class Settings:
    devices: Optional[int] = None
    action: str = "raise"
    ignore: FrozenSet[str] = frozenset()
    check_rows: bool = False


_settings: contextvars.ContextVar[Tuple[Settings, ...]] = contextvars.ContextVar("dplint_runtime_settings", default=())
_simulated_call: contextvars.ContextVar[Optional["_Call"]] = contextvars.ContextVar("dplint_simulated_call", default=None)

_lock = threading.RLock()
_installs = [0]  # install() calls not yet undone, all threads together: torch stays patched while > 0
_originals: Dict[Tuple[type, str], Any] = {}  # what each patch replaced, for calling it and for restoring it
_hook_handles: List[Any] = []
# Bumped whenever a parameter or buffer may have been added or moved; DPL103 re-checks only then.
_generation = [0]
_warning_registry: Dict[Any, Any] = {}  # shows each advice once per place, not once per training step
# DPL309's BatchNorm advice is the same for every BatchNorm model: said once per process (a pytest
# session), not once per model, call or test.
_batch_norm_advised = [False]
_device_checks: "weakref.WeakKeyDictionary[nn.DataParallel, Tuple[str, Optional[messages.Said]]]" = weakref.WeakKeyDictionary()
_unknown_dim_reported: "weakref.WeakSet[nn.DataParallel]" = weakref.WeakSet()


def _validated(devices: Optional[int], action: str, ignore: Iterable[str], check_rows: bool) -> Settings:
    if devices is not None and (not isinstance(devices, int) or isinstance(devices, bool) or devices < 1):
        raise ValueError(f"devices must be a positive int or None, got {devices!r}")
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
    if isinstance(ignore, str):
        raise ValueError(f"ignore must be a list of codes, got the string {ignore!r}")
    codes = frozenset(code.upper() for code in ignore)
    unknown = sorted(codes - RUNTIME_CODES)
    if unknown:
        raise ValueError(f"ignore: {', '.join(unknown)} not runtime codes; they are {', '.join(sorted(RUNTIME_CODES))}")
    if not isinstance(check_rows, bool):
        raise ValueError(f"check_rows must be True or False, got {check_rows!r}")
    return Settings(devices, action, codes, check_rows)


def install(
    *, devices: Optional[int] = None, action: str = "raise", ignore: Iterable[str] = (), check_rows: bool = False
) -> None:
    """Check every DataParallel forward of this thread (context) from now on; each install needs one uninstall.

    devices: simulate this many devices when fewer GPUs exist (None: only the real GPUs).
    action: "raise" a PitfallError, or "warn" with a PitfallWarning (advice codes always warn).
    ignore: runtime codes not to report (e.g. ["DPL305"]); ignoring DPL309 also skips its extra forward.
    check_rows: DPL309, compare each simulated output with one forward of the whole batch (costs that forward).
    """
    settings = _validated(devices, action, ignore, check_rows)
    with _lock:
        if not _installs[0]:
            _device_checks.clear()  # moves made while uninstalled were not tracked
            _patch()
        _installs[0] += 1
    _settings.set(_settings.get() + (settings,))


def uninstall() -> None:
    """Undo this thread's latest `install`; the last one anywhere restores what dplint patched in torch."""
    stack = _settings.get()
    if not stack:
        return
    _settings.set(stack[:-1])
    with _lock:
        _installs[0] -= 1
        if not _installs[0]:
            _unpatch()


def is_installed() -> bool:
    """Whether the checks are on in this thread (context)."""
    return bool(_settings.get())


class _Checking(contextlib.ContextDecorator):
    """`checking()`'s block (or decorated function): installed on entry, uninstalled on exit."""

    def __init__(self, devices: Optional[int], action: str, ignore: Iterable[str], check_rows: bool) -> None:
        self.settings = {"devices": devices, "action": action, "ignore": ignore, "check_rows": check_rows}

    def __enter__(self) -> None:
        install(**self.settings)

    def __exit__(self, exc_type: Any, error: Optional[BaseException], tb: Any) -> bool:
        uninstall()
        if error is not None:  # what leaves the block shows the user's frames and torch's, not dplint's
            frames.hide_own_frames(error, (PitfallError, PitfallWarning))
        return False


def checking(
    devices: Optional[int] = None, action: str = "raise", ignore: Iterable[str] = (), check_rows: bool = False
) -> contextlib.AbstractContextManager:
    """Check every DataParallel forward of this thread inside the block; arguments as for `install`."""
    return _Checking(devices, action, ignore, check_rows)


def _current() -> Optional[Settings]:
    stack = _settings.get()
    return stack[-1] if stack else None


def _patches() -> List[Tuple[type, str, Callable[..., Any]]]:
    return [
        (nn.DataParallel, "forward", _checked_forward),
        (nn.DataParallel, "scatter", _scatter),
        (nn.DataParallel, "replicate", _replicate),
        (nn.DataParallel, "parallel_apply", _parallel_apply),
        (nn.DataParallel, "gather", _gather),
        (nn.Module, "_apply", _tracking_apply),
        (nn.Module, "load_state_dict", _checked_load_state_dict),
    ]


def _patch() -> None:
    for owner, name, ours in _patches():
        current = owner.__dict__[name]
        if current is not ours:
            _originals[(owner, name)] = current
            setattr(owner, name, ours)
    registration = torch.nn.modules.module
    _hook_handles.append(registration.register_module_parameter_registration_hook(_parameters_changed))
    _hook_handles.append(registration.register_module_buffer_registration_hook(_parameters_changed))


def _unpatch() -> None:
    """Restore only what is still dplint's patch: a later patch by someone else stays (and calls ours)."""
    for owner, name, ours in _patches():
        if owner.__dict__.get(name) is ours:
            setattr(owner, name, _originals[(owner, name)])
    while _hook_handles:
        _hook_handles.pop().remove()


def _original(owner: type, name: str) -> Any:
    return _originals[(owner, name)]


@_entry
def _recording_init(self: nn.DataParallel, module: nn.Module, device_ids=None, output_device=None, dim: int = 0) -> None:
    _original(nn.DataParallel, "__init__")(self, module, device_ids, output_device, dim)
    # Without CUDA, DataParallel returns from __init__ before storing these; simulation needs them.
    if not hasattr(self, "dim"):
        self.dim = dim
    self._dplint_device_ids = None if device_ids is None else list(device_ids)


def _record_wrappers() -> None:
    """From the import of dplint.runtime on, every wrapper keeps its `dim` and `device_ids`, so one
    built before `checking()` (a tutorial's model, a pytest fixture's) is simulated as it was built."""
    if nn.DataParallel.__dict__["__init__"] is not _recording_init:
        _originals[(nn.DataParallel, "__init__")] = nn.DataParallel.__dict__["__init__"]
        nn.DataParallel.__init__ = _recording_init  # type: ignore[method-assign]


_record_wrappers()


def _parameters_changed(module: nn.Module, *args: Any) -> None:
    if not getattr(module, "_is_replica", False):  # dplint's own replicas change nothing DPL103 checks
        _generation[0] += 1


@_entry
def _tracking_apply(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
    _generation[0] += 1
    return _original(nn.Module, "_apply")(self, *args, **kwargs)


# ----- DPL303 at load_state_dict ---------------------------------------------------------------------


def _state_dict_keys(module: nn.Module) -> Optional[set]:
    """The keys `module.state_dict()` would have, without running it (it runs hooks); None when
    a submodule customises saving, so only `state_dict()` itself would know."""
    keys = set()
    for prefix, submodule in module.named_modules(remove_duplicate=False):
        cls = type(submodule)
        if (
            submodule._state_dict_hooks
            or submodule._state_dict_pre_hooks
            or cls.state_dict is not nn.Module.state_dict
            or cls._save_to_state_dict is not nn.Module._save_to_state_dict
        ):
            return None
        dotted = prefix + "." if prefix else ""
        keys.update(dotted + key for key, value in submodule._parameters.items() if value is not None)
        keys.update(
            dotted + key
            for key, value in submodule._buffers.items()
            if value is not None and key not in submodule._non_persistent_buffers_set
        )
        if cls.get_extra_state is not nn.Module.get_extra_state:
            keys.add(dotted + "_extra_state")
    return keys


@_entry
def _checked_load_state_dict(self: nn.Module, state_dict: Any, strict: bool = True, *args: Any, **kwargs: Any) -> Any:
    """DPL303: keys that differ from the model's by the `module.` prefix (under strict=False, nothing loads)."""
    settings = _current()
    if settings is not None and "DPL303" not in settings.ignore and hasattr(state_dict, "keys"):
        given = set(state_dict.keys())
        prefixed = any(isinstance(key, str) and key.startswith(messages.PREFIX) for key in given)
        expected = _state_dict_keys(self) if prefixed or "module" in self._modules else None
        difference = messages.prefix_mismatch(expected, given) if expected is not None else None
        if difference is not None:
            said = messages.wrapper_state_dict_prefix(difference, strict)
            if settings.action == "raise":
                raise PitfallError("DPL303", said, self)
            warnings.warn(PitfallWarning("DPL303", said, self), stacklevel=2)
    return _original(nn.Module, "load_state_dict")(self, state_dict, strict, *args, **kwargs)


# ----- the forward, and DataParallel's steps under simulation -----------------------------------------


@_entry
def _checked_forward(self: nn.DataParallel, *inputs: Any, **kwargs: Any) -> Any:
    settings = _current()
    if settings is None:
        return _original(nn.DataParallel, "forward")(self, *inputs, **kwargs)
    return _Call(self, settings).run(inputs, kwargs)


def _simulating(wrapper: nn.DataParallel) -> Optional["_Call"]:
    call = _simulated_call.get()
    return call if call is not None and call.wrapper is wrapper else None


@_entry
def _scatter(self: nn.DataParallel, inputs: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]], device_ids: Sequence[Any]) -> Any:
    call = _simulating(self)
    if call is None:
        return _original(nn.DataParallel, "scatter")(self, inputs, kwargs, device_ids)
    return simulation.scatter_kwargs(inputs, kwargs or {}, len(device_ids), call.dim)


@_entry
def _replicate(self: nn.DataParallel, module: nn.Module, device_ids: Sequence[Any]) -> List[nn.Module]:
    if _simulating(self) is None:
        return _original(nn.DataParallel, "replicate")(self, module, device_ids)
    return simulation.replicate(module, len(device_ids), not torch.is_grad_enabled())


@_entry
def _parallel_apply(self: nn.DataParallel, replicas: Sequence[nn.Module], inputs: Sequence[Any], kwargs: Any) -> List[Any]:
    call = _simulating(self)
    if call is None:
        return _original(nn.DataParallel, "parallel_apply")(self, replicas, inputs, kwargs)
    return simulation.parallel_apply(replicas, inputs, kwargs, call.device_ids[: len(replicas)])


@_entry
def _gather(self: nn.DataParallel, outputs: Any, output_device: Any) -> Any:
    call = _simulating(self)
    if call is None:
        return _original(nn.DataParallel, "gather")(self, outputs, output_device)
    return simulation.gather(outputs, call.dim)


# ----- the checks -----------------------------------------------------------------------------------


def _leaves(outputs: Sequence[Any], where: str = "output") -> Iterator[Tuple[str, List[torch.Tensor]]]:
    """Each tensor position of several like-shaped structures, with the tensor from each."""
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


def _map_leaves(obj: Any, function: Callable[[str, torch.Tensor], torch.Tensor], where: str = "output") -> Any:
    """`obj` with each tensor replaced by `function(place, tensor)`, places named as `_leaves` names them."""
    if isinstance(obj, torch.Tensor):
        return function(where, obj)
    if isinstance(obj, dict):
        return type(obj)((k, _map_leaves(v, function, f"{where}[{k!r}]")) for k, v in obj.items())
    if simulation._is_namedtuple(obj):
        return type(obj)(*(_map_leaves(o, function, f"{where}[{i}]") for i, o in enumerate(obj)))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_leaves(o, function, f"{where}[{i}]") for i, o in enumerate(obj))
    return obj


def _tensors(obj: Any, where: str) -> Iterator[Tuple[str, torch.Tensor]]:
    """Every tensor inside inputs as scatter walks them, with its place."""
    if isinstance(obj, torch.Tensor):
        yield where, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _tensors(value, f"{where}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from _tensors(value, f"{where}[{index}]")


def _map_tensors(obj: Any, function: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return function(obj)
    if simulation._is_namedtuple(obj):
        return type(obj)(*(_map_tensors(o, function) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, function) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _map_tensors(v, function)) for k, v in obj.items())
    return obj


# What torch's ExceptionWrapper says of an exception in a replica: which one, and the traceback's frames
# (the innermost last), each with its source line when Python had it.
_CAUGHT = re.compile(r"Caught \w+ in replica (?P<replica>\d+) on device ")
_FRAME = re.compile(r'^  File "(?P<filename>[^"]+)", line (?P<lineno>\d+), in (?P<function>[^\n]+)\n(?:    (?P<source>[^\n]*)\n)?', re.M)
_TAKES_PARAMETERS = re.compile(r"parameters\(")  # `named_parameters(` too


def _failed_replica(error: BaseException) -> Optional[Tuple[int, Line, str]]:
    """The replica whose forward raised `error` (re-raised by torch's ExceptionWrapper), the line that
    raised it, and that line's source, when that line takes something from `parameters()`."""
    text = str(error)
    caught = _CAUGHT.match(text)
    found = list(_FRAME.finditer(text))
    if caught is None or not found:
        return None
    innermost = found[-1]
    filename, lineno = innermost["filename"], int(innermost["lineno"])
    source = (innermost["source"] or linecache.getline(filename, lineno)).strip()
    if not _TAKES_PARAMETERS.search(source):
        return None
    return int(caught["replica"]), (filename, lineno, innermost["function"]), source


def _tolerance(reference: torch.Tensor) -> float:
    """Beyond float rounding (chunked and full-batch kernels sum in different orders)."""
    relative = 1e-3 if reference.dtype in (torch.float32, torch.float64, torch.complex64, torch.complex128) else 3e-2
    return 1e-5 + relative * float(reference.abs().max()) if reference.numel() else 0.0


class _Call:
    """One checked DataParallel forward."""

    def __init__(self, wrapper: nn.DataParallel, settings: Settings) -> None:
        self.wrapper = wrapper
        self.module: nn.Module = wrapper.module
        self.settings = settings
        self.dim: Optional[int] = getattr(wrapper, "dim", None)
        self.device_ids: List[Any] = list(wrapper.device_ids)

    def report(
        self, code: str, said: messages.Said, advice: bool = False, cause: Optional[BaseException] = None, line: Optional[Line] = None
    ) -> None:
        if code in self.settings.ignore:
            return
        if not advice and code not in ADVICE and self.settings.action == "raise":
            if cause is not None:
                raise PitfallError(code, said, self.module, line) from cause
            raise PitfallError(code, said, self.module, line)
        warning = PitfallWarning(code, said, self.module, line)
        if warning.filename is None:
            # A module of torch's own (nn.Sequential) has no forward of the user's: the user's line that called the wrapper.
            caller = sys._getframe(1)
            while caller is not None and not user_code(caller.f_code.co_filename):
                caller = caller.f_back
            if caller is None:
                warnings.warn(warning, stacklevel=3)
                return
            warning.filename, warning.lineno = caller.f_code.co_filename, caller.f_lineno
        # point at the module's forward (or that line), not at dplint's frames
        warnings.warn_explicit(warning, PitfallWarning, warning.filename, warning.lineno, registry=_warning_registry)

    def run(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        wanted = self.settings.devices
        with torch.autograd.profiler.record_function("DataParallel.forward"):
            if wanted is not None and len(self.device_ids) < wanted:
                if self.dim is None:
                    return self.unknown_dim(inputs, kwargs)
                recorded = getattr(self.wrapper, "_dplint_device_ids", None)
                self.device_ids = recorded if recorded else list(range(wanted))
                token = _simulated_call.set(self)
                try:
                    return self.steps(inputs, kwargs, torch.device("cpu") if not self.wrapper.device_ids else self.wrapper.src_device_obj)
                finally:
                    _simulated_call.reset(token)
            if not self.device_ids:
                return self.passthrough(inputs, kwargs)
            return self.steps(inputs, kwargs, self.wrapper.src_device_obj)

    def unknown_dim(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        if self.wrapper not in _unknown_dim_reported:
            _unknown_dim_reported.add(self.wrapper)
            warnings.warn(messages.unknown_dim(type(self.wrapper).__name__), RuntimeWarning, stacklevel=4)
        return self.passthrough(inputs, kwargs)

    def passthrough(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """No GPU and no simulation: DataParallel calls the module directly; only DPL304 can be seen."""
        before = module_state.snapshot(self.module)
        output = self.module(*inputs, **kwargs)
        self.check_state([self.module], [before])
        return output

    def steps(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any], source: torch.device) -> Any:
        """`DataParallel.forward`'s steps, with the checks between them."""
        wrapper = self.wrapper
        self.check_devices(source)
        scattered, scattered_kwargs = wrapper.scatter(inputs, kwargs, self.device_ids)
        if not scattered and not scattered_kwargs:
            scattered, scattered_kwargs = ((),), ({},)
        if len(self.device_ids) == 1:
            self.report("DPL307", messages.SINGLE_DEVICE)
            return self.module(*scattered[0], **scattered_kwargs[0])
        sizes = self.chunk_sizes(inputs, kwargs)
        if sizes is not None and len(sizes) < len(self.device_ids):
            self.report("DPL306", messages.uneven_batch(sum(sizes), len(self.device_ids), sizes))
        if len(scattered) == len(scattered_kwargs):  # otherwise parallel_apply raises, as in torch
            self.check_dropped(inputs, kwargs, scattered, scattered_kwargs)
        replicas = wrapper.replicate(self.module, self.device_ids[: len(scattered)])
        before = [module_state.snapshot(replica) for replica in replicas]
        rng = torch.get_rng_state() if self.rows_checked else None
        try:
            outputs = wrapper.parallel_apply(replicas, scattered, scattered_kwargs)
        except (StopIteration, IndexError) as error:
            self.check_replica_parameters(error, replicas)
            raise
        refused = self.check_outputs(outputs, sizes, scattered, scattered_kwargs)
        self.check_state(replicas, before)
        if refused:  # warned, not raised: torch's gather would raise
            gathered = self.gather_as_a_single_device_would(outputs, getattr(wrapper, "output_device", None), refused)
        else:
            gathered = wrapper.gather(outputs, getattr(wrapper, "output_device", None))
        if rng is not None:
            self.check_rows(inputs, kwargs, gathered, rng)
        return gathered

    @property
    def rows_checked(self) -> bool:
        return self.settings.check_rows and "DPL309" not in self.settings.ignore and _simulating(self.wrapper) is self

    def check_devices(self, expected: torch.device) -> None:
        """DPL103, cached per wrapper until a parameter or buffer is registered or moved."""
        cached = _device_checks.get(self.wrapper)
        key = f"{_generation[0]}:{expected}"
        if cached is not None and cached[0] == key:
            said = cached[1]
        else:
            named = chain(self.module.named_parameters(), self.module.named_buffers())
            offenders = [(name, str(t.device)) for name, t in named if t.device != expected]
            said = messages.module_off_primary_device(offenders, str(expected)) if offenders else None
            _device_checks[self.wrapper] = (key, said)
        if said is not None:
            self.report("DPL103", said)

    def chunk_sizes(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[List[int]]:
        """How the batch splits: the sizes of the first input tensor's chunks along `dim`."""
        first = next((t for _, t in _tensors((inputs, kwargs), "")), None)
        if first is None or first.dim() <= self.dim:
            return None
        return [chunk.size(self.dim) for chunk in first.chunk(len(self.device_ids), self.dim)]

    def check_dropped(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any], scattered: Sequence[Any], scattered_kwargs: Sequence[Any]) -> None:
        """DPL310: rows that scatter's `zip` cut off because inputs split into different chunk counts."""
        worst: Optional[Tuple[int, int, str]] = None
        for original, per_replica, name in ((inputs, scattered, "input"), (kwargs, scattered_kwargs, "keyword")):
            received: Dict[str, int] = {}
            for part in per_replica:
                for where, tensor in _tensors(part, name):
                    if tensor.dim() > self.dim:
                        received[where] = received.get(where, 0) + tensor.size(self.dim)
            for where, tensor in _tensors(original, name):
                if tensor.dim() > self.dim and where in received:
                    dropped = tensor.size(self.dim) - received[where]
                    if dropped > 0 and (worst is None or dropped > worst[0]):
                        worst = (dropped, tensor.size(self.dim), where)
        if worst is None:
            return
        counts = [
            len(t.chunk(len(self.device_ids), self.dim)) for _, t in _tensors((inputs, kwargs), "") if t.dim() > self.dim
        ]
        dropped, total, where = worst
        self.report("DPL310", messages.samples_dropped(dropped, total, f"`{where}`", self.dim, len(scattered), counts))

    def check_replica_parameters(self, error: BaseException, replicas: Sequence[nn.Module]) -> None:
        """DPL311: a replica's forward stopped at `next(self.parameters())` (StopIteration) or
        `list(self.parameters())[0]` (IndexError), which its empty `parameters()` raise. Under
        action="warn" the warning is given and torch's error goes on."""
        failed = _failed_replica(error)
        if failed is None or "DPL311" in self.settings.ignore:
            return
        replica, line, source = failed
        if replica >= len(replicas) or next(replicas[replica].parameters(), None) is not None:
            return  # a replica with parameters (replica 0 without gradients holds the originals)
        if next(self.module.parameters(), None) is None:
            return  # nothing to have: the module has no parameters itself
        self.report("DPL311", messages.parameters_in_replica(source, type(error).__name__, replica), cause=error, line=line)

    def check_state(self, replicas: Sequence[nn.Module], before: Sequence[module_state.Snapshot]) -> None:
        """DPL304: compare each replica with itself, before and after its forward."""
        originals = list(self.module.modules())
        for replica, state in zip(replicas, before):
            changes = module_state.changes(state, replica, originals)
            if changes:
                self.report("DPL304", messages.forward_mutates_module_state(type(self.module).__name__, changes))
                return

    def check_outputs(self, outputs: Sequence[Any], sizes: Optional[List[int]], scattered: Sequence[Any], scattered_kwargs: Sequence[Any]) -> Dict[str, int]:
        """DPL305 for 0-dim outputs, DPL301 for outputs whose batch is not at the gather dim.

        Returns the outputs whose gather torch would refuse (uneven chunks with the batch elsewhere),
        each with the dim its batch is at, for `gather_as_a_single_device_would` under action="warn"."""
        refused: Dict[str, int] = {}
        for where, tensors in _leaves(outputs):
            if all(t.dim() == 0 for t in tensors):
                self.report("DPL305", messages.scalar_output(where, len(tensors), sizes or []))
                continue
            if sizes is None or len(sizes) != len(tensors) or any(t.dim() <= self.dim for t in tensors):
                continue
            at_dim = all(t.size(self.dim) == size for t, size in zip(tensors, sizes))
            candidates = [
                d
                for d in range(tensors[0].dim())
                if d != self.dim and all(t.dim() > d and t.size(d) == size for t, size in zip(tensors, sizes))
            ]
            if not candidates:
                continue  # not per-sample output, or the batch is at the gather dim alone
            if at_dim and tensors[0].dim() < 3:
                # [batch, classes] with as many classes as the chunk has samples: far likelier than a
                # transposed output, and not worth two more forwards on every such call.
                continue
            if at_dim or len(set(sizes)) == 1:
                # Sizes cannot tell (a time axis as long as the chunk): follow the samples themselves.
                moved_to = self.rows_went_to(where, candidates, sizes[0], scattered[0], scattered_kwargs[0])
                if moved_to is None:
                    continue
            else:
                moved_to = candidates[0]
            shapes = [list(t.shape) for t in tensors]
            if len(set(sizes)) == 1:
                gathered = list(tensors[0].shape)
                gathered[self.dim] = sum(t.size(self.dim) for t in tensors)
                said = messages.batch_dim_moved(where, shapes[0], gathered, sum(sizes), self.dim, moved_to)
            else:
                said = messages.batch_dim_moved_uneven(where, shapes, sizes, self.dim, moved_to)
                refused[where] = moved_to
            self.report("DPL301", said)
        return refused

    def gather_as_a_single_device_would(self, outputs: List[Any], output_device: Any, refused: Dict[str, int]) -> Any:
        """Under action="warn", the outputs torch's gather refuses are concatenated along their batch dim
        instead (what one device returns), so the warned test or script goes on."""

        def swap(where: str, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.transpose(self.dim, refused[where]) if where in refused else tensor

        gathered = self.wrapper.gather([_map_leaves(output, swap) for output in outputs], output_device)
        return _map_leaves(gathered, swap)

    def isolated_copy(self) -> nn.Module:
        """A replica with copies of every parameter and buffer: running it changes nothing outside."""
        return simulation.replicate(self.module, 2, detach=True)[1]

    def run_isolated(self, inputs: Any, kwargs: Dict[str, Any], training: bool = True) -> Any:
        """One forward of an isolated copy, without gradients, warnings or a trace in the RNG; None if it fails."""
        with torch.random.fork_rng(devices=[]), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            token = _settings.set(())
            try:
                positional = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
                copy = self.isolated_copy()
                return copy(*positional, **kwargs) if training else copy.eval()(*positional, **kwargs)
            except Exception:
                return None
            finally:
                _settings.reset(token)

    def rows_went_to(self, where: str, candidates: Sequence[int], size: int, chunk: Any, chunk_kwargs: Dict[str, Any]) -> Optional[int]:
        """Which dim of the output holds the chunk's samples, found by moving each sample one row on (a roll
        along the split dim) in eval mode: the output's rows move with them along the batch dim; None when
        that is the gather dim or nothing tells (equal samples, samples that mix)."""

        def rolled(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.dim() <= self.dim or tensor.size(self.dim) != size:
                return tensor
            return tensor.roll(1, self.dim)

        # A forward's prints from these two probes would read as forwards DataParallel made (the tutorial's).
        with contextlib.redirect_stdout(io.StringIO()):
            before = self.run_isolated(chunk, chunk_kwargs, training=False)
            after = self.run_isolated(_map_tensors(chunk, rolled), _map_tensors(chunk_kwargs, rolled), training=False)
        reference = dict(_leaves([before])).get(where, [None])[0] if before is not None else None
        moved = dict(_leaves([after])).get(where, [None])[0] if after is not None else None
        if reference is None or moved is None or reference.shape != moved.shape:
            return None
        for d in (self.dim, *candidates):
            expected = reference.roll(1, d)
            exact = not (expected.is_floating_point() or expected.is_complex())
            if torch.equal(moved, expected) if exact else float((moved - expected).abs().max()) <= _tolerance(expected):
                return None if d == self.dim else d
        return None

    def check_rows(self, inputs: Tuple[Any, ...], kwargs: Dict[str, Any], gathered: Any, rng: torch.Tensor) -> None:
        """DPL309: the gathered output against one forward of the whole batch (no grad, same RNG state)."""
        if not torch.equal(rng, torch.get_rng_state()):
            return  # forward drew random numbers (dropout): chunked and whole-batch draws differ anyway
        reference = self.run_isolated(inputs, kwargs)
        if reference is None:
            return
        for where, (simulated, whole) in _leaves([gathered, reference]):
            if simulated.shape != whole.shape or not (simulated.is_floating_point() or simulated.is_complex()):
                continue
            difference = float((simulated.detach() - whole.to(simulated.dtype)).abs().max()) if whole.numel() else 0.0
            if difference > _tolerance(whole):
                batch_norm = any(
                    isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in self.module.modules()
                )
                time_major = self.dim == 0 and any(getattr(m, "batch_first", True) is False for m in self.module.modules())
                if batch_norm and _batch_norm_advised[0]:
                    return
                _batch_norm_advised[0] = _batch_norm_advised[0] or batch_norm
                cause = messages.CAUSE_BATCH_NORM if batch_norm else messages.CAUSE_TIME_MAJOR if time_major else messages.cause_mixing(self.dim)
                self.report("DPL309", messages.rows_not_independent(where, difference, cause), advice=batch_norm)
                return
