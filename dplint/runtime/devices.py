"""GPUs emulated on the CPU: a script's CUDA code runs unmodified, and each placement keeps its logical GPU.

`install(count)` makes this process see `count` logical GPUs: `torch.cuda` and `torch.accelerator`
answer as on a node with that many GPUs, and every placement (`.cuda(i)`, `.to("cuda:1")`, `.to(i)`,
`device=` on a factory, `torch.load(map_location=...)`) leaves the data on the CPU and records the
logical GPU of the tensor it made, in a map that holds its tensors weakly. A model's forward checks its
inputs' logical GPUs against its parameters' as torch checks real ones. What cannot be emulated is said
once, and never guessed: tensors report `device` cpu, and the result of an operation carries no logical
GPU, so only placed tensors are compared.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

NAME = "dplint emulated GPU (CPU)"
# What an emulated GPU reports of itself: a current data-centre GPU's compute capability (bfloat16 and
# TF32 exist, as the emulated autocast has them) and memory, so code that picks a path by them takes
# the one it takes on a training node.
CAPABILITY = (8, 0)
TOTAL_MEMORY = 80 * 2**30
# The factories that take `device=`: under emulation a CUDA device makes their tensor on the CPU, placed.
_FACTORIES = (
    "arange", "as_tensor", "asarray", "empty", "empty_like", "empty_strided", "eye", "full", "full_like", "linspace",
    "logspace", "ones", "ones_like", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like", "randperm",
    "scalar_tensor", "tensor", "tril_indices", "triu_indices", "zeros", "zeros_like",
)  # fmt: skip
_NEW = ("new_empty", "new_full", "new_ones", "new_tensor", "new_zeros")
_MISMATCH = "Expected all tensors to be on the same device, but found at least two devices, {} and {}!"

Note = Callable[[str], None]
Record = Callable[..., None]


class InvalidDevice(RuntimeError):
    """CUDA's error for a GPU index this process does not have, with the index asked for."""

    def __init__(self, index: int, count: int) -> None:
        super().__init__("CUDA error: invalid device ordinal")
        self.index = index
        self.count = count


class Emulation:
    """The logical GPUs of one process: the current one (per thread, as CUDA's), and what was placed on each."""

    def __init__(self, count: int, note: Note, record: Optional[Record]) -> None:
        self.count = count
        self.local = threading.local()
        self.placed: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> logical GPU index
        self.peaks: Dict[int, int] = {}
        self.note = note
        self.record = record
        self.process = os.getpid()

    @property
    def current(self) -> int:
        return getattr(self.local, "current", 0)  # a new thread starts on GPU 0, as with CUDA

    @current.setter
    def current(self, index: int) -> None:
        self.local.current = index

    def index(self, device: Any) -> Optional[int]:
        """The logical GPU a device argument names (None: not a GPU); a bare "cuda" is the current one."""
        if isinstance(device, bool) or device is None:
            return None
        if isinstance(device, int):
            index: Optional[int] = device
        else:
            try:
                parsed = torch.device(device)
            except (RuntimeError, TypeError):
                return None
            if parsed.type != "cuda":
                return None
            index = parsed.index
        if index is None:
            return self.current
        if not 0 <= index < self.count:
            raise InvalidDevice(index, self.count)
        return index

    def own(self, tensor: Any, index: int) -> Any:
        if isinstance(tensor, torch.Tensor):
            self.placed[tensor] = index
        return tensor

    def placement(self, what: str, index: int, depth: int = 3) -> None:
        """Publish where this rank's code first placed something at a call site (DPL506/DPL508 compare the ranks)."""
        if self.record is None or os.getpid() != self.process or threading.current_thread() is not threading.main_thread():
            return  # a DataLoader worker or a helper thread: not the rank's own placements
        from dplint.runtime.distributed.channel import user_site

        where = user_site(depth)
        seen = self.local.__dict__.setdefault("sites", set())
        if (what, where) not in seen:
            seen.add((what, where))
            self.record("gpu", what=what, index=index, where=where)

    def memory(self, device: Any = None) -> int:
        """Bytes of the live tensors placed on a logical GPU: what the script put there, without activations."""
        index = self.current if device is None else self.index(device)
        storages = {}
        for tensor, placed in list(self.placed.items()):
            if placed == index:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        used = sum(storages.values())
        self.peaks[index] = max(self.peaks.get(index, 0), used)
        return used

    def peak(self, device: Any = None) -> int:
        index = self.current if device is None else self.index(device)
        return max(self.memory(index), self.peaks.get(index, 0))

    def check_inputs(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        """A module's forward pre-hook: a placed input on another GPU than the module's raises, as torch does."""
        expected = module.__dict__.get("_dplint_gpu")
        if expected is None:
            return
        for value in _tensors(args, kwargs.values()):
            index = self.placed.get(value)
            if index is not None and index != expected:
                raise RuntimeError(_MISMATCH.format(f"cuda:{expected}", f"cuda:{index}"))


def _tensors(*groups: Iterable[Any]) -> Iterable[torch.Tensor]:
    """The tensors among the arguments and one level into their lists, tuples and dicts (a batch's usual shapes)."""
    for group in groups:
        for value in group:
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(value, (list, tuple)):
                yield from (item for item in value if isinstance(item, torch.Tensor))
            elif isinstance(value, dict):
                yield from (item for item in value.values() if isinstance(item, torch.Tensor))


_active: Optional[Emulation] = None


def active() -> Optional[Emulation]:
    return _active


def install(count: int, note: Note, record: Optional[Record] = None, simulated_dataparallel: bool = False) -> Emulation:
    """Emulate `count` GPUs in this process; `note` says a thing once, `record(kind, **data)` publishes a placement.

    `simulated_dataparallel`: DataParallel's forward is simulated on the GPUs (`dplint run --devices`), so a
    wrapper keeps the `device_ids` it was given; otherwise it runs its module once, unsplit.
    """
    global _active
    if _active is not None:
        raise RuntimeError("GPU emulation is already installed in this process")
    _active = emulation = Emulation(count, note, record)
    _install_queries(emulation)
    _install_placement(emulation)
    _install_modules(emulation, simulated_dataparallel)
    _install_load(emulation)
    _install_precision(emulation)
    _install_distributed(emulation)
    _install_default_device(emulation)
    return emulation


# torch.cuda and torch.accelerator -----------------------------------------------------------------
class _DeviceContext:
    """`torch.cuda.device(i)` / `torch.accelerator.device_index(i)`: the current GPU within the block."""

    def __init__(self, device: Any) -> None:
        emulation = _active
        assert emulation is not None
        self.emulation = emulation
        self.target = None if device is None or device == -1 else emulation.index(device)
        self.previous = emulation.current

    def __enter__(self) -> "_DeviceContext":
        self.previous = self.emulation.current
        if self.target is not None:
            self.emulation.current = self.target
        return self

    def __exit__(self, *exc: Any) -> None:
        self.emulation.current = self.previous


class DeviceProperties:
    """`torch.cuda.get_device_properties` of an emulated GPU."""

    name = NAME
    major, minor = CAPABILITY
    total_memory = TOTAL_MEMORY
    multi_processor_count = 1
    is_integrated = False
    is_multi_gpu_board = False

    def __repr__(self) -> str:
        return f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, total_memory={self.total_memory >> 20}MB)"


class Stream:
    """A CUDA stream of an emulated GPU: the CPU runs every operation in order, so waiting is never needed."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cuda", active_index(device))
        self.priority = priority

    def wait_stream(self, stream: "Stream") -> None:
        pass

    def wait_event(self, event: "Event") -> None:
        pass

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class Event:
    """A CUDA event of an emulated GPU: recorded work has always finished."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.recorded_at: Optional[float] = None

    def record(self, stream: Optional[Stream] = None) -> None:
        self.recorded_at = time.perf_counter()

    def wait(self, stream: Optional[Stream] = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "Event") -> float:
        if self.recorded_at is None or end.recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.recorded_at - self.recorded_at) * 1000.0


def active_index(device: Any) -> int:
    """The emulated GPU a device argument names, the current one for None."""
    emulation = active()
    assert emulation is not None
    index = emulation.index(device)
    return emulation.current if index is None else index


def _install_queries(emulation: Emulation) -> None:
    def set_device(device: Any) -> None:
        index = emulation.index(device)
        if index is not None:
            emulation.current = index
            emulation.placement("set_device", index)

    def memory_stat(kind: Callable[..., int]) -> Callable[..., int]:
        def stat(device: Any = None) -> int:
            emulation.note("memory figures count the tensors placed on each emulated GPU, not activations or a cache")
            return kind(device)

        return stat

    def reset_peaks(device: Any = None) -> None:
        emulation.peaks.pop(emulation.current if device is None else emulation.index(device), None)

    def properties(device: Any = None) -> DeviceProperties:
        emulation.index(device)  # an index this process does not have fails as CUDA's does
        return DeviceProperties()

    def capability(device: Any = None) -> Tuple[int, int]:
        emulation.index(device)
        return CAPABILITY

    queries: Dict[str, Any] = {
        "is_available": lambda: True,
        "device_count": lambda: emulation.count,
        "current_device": lambda: emulation.current,
        "set_device": set_device,
        "device": _DeviceContext,
        "synchronize": lambda device=None: None,  # every operation has finished: the CPU runs them in order
        "empty_cache": lambda: None,
        "memory_allocated": memory_stat(emulation.memory),
        "memory_reserved": memory_stat(emulation.memory),
        "max_memory_allocated": memory_stat(emulation.peak),
        "max_memory_reserved": memory_stat(emulation.peak),
        "reset_peak_memory_stats": reset_peaks,
        "get_device_name": lambda device=None: NAME,
        "get_device_properties": properties,
        "Stream": Stream,
        "Event": Event,
        "stream": lambda stream=None: contextlib.nullcontext(stream),
        "current_stream": lambda device=None: Stream(device),
        "default_stream": lambda device=None: Stream(device),
        "get_device_capability": capability,
        "is_bf16_supported": lambda including_emulation=True: True,  # the emulated autocast runs on the CPU, which has bfloat16
    }
    for name, value in queries.items():
        setattr(torch.cuda, name, value)
    accelerator = {
        "is_available": lambda: True,
        "device_count": lambda: emulation.count,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "set_device_index": set_device,
        "set_device_idx": set_device,
        "current_device_index": lambda: emulation.current,
        "current_device_idx": lambda: emulation.current,
        "device_index": _DeviceContext,
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "memory_allocated": queries["memory_allocated"],
        "max_memory_allocated": queries["max_memory_allocated"],
        "memory_reserved": queries["memory_reserved"],
        "max_memory_reserved": queries["max_memory_reserved"],
        "reset_peak_memory_stats": reset_peaks,
    }
    for name, value in accelerator.items():
        setattr(torch.accelerator, name, value)
        if hasattr(torch.accelerator.memory, name):
            setattr(torch.accelerator.memory, name, value)


# placement ----------------------------------------------------------------------------------------
def _device_argument(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[str, Any]:
    """Where `.to(...)` takes its device: ("device", value) from the keyword, ("0", value) the first argument, else ("", None)."""
    if "device" in kwargs:
        return "device", kwargs["device"]
    if args and isinstance(args[0], (str, torch.device, int, torch.Tensor)) and not isinstance(args[0], bool):
        return "0", args[0]
    return "", None


def _on_cpu(args: Tuple[Any, ...], kwargs: Dict[str, Any], slot: str) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    if slot == "device":
        return args, {**kwargs, "device": "cpu"}
    return ("cpu", *args[1:]), kwargs


def _install_placement(emulation: Emulation) -> None:
    tensor_to, tensor_cpu = torch.Tensor.to, torch.Tensor.cpu

    def target(value: Any) -> Optional[int]:
        return emulation.placed.get(value) if isinstance(value, torch.Tensor) else emulation.index(value)

    @functools.wraps(tensor_to)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        slot, device = _device_argument(args, kwargs)
        index = target(device) if slot else None
        if index is None:
            result = tensor_to(self, *args, **kwargs)
            if result is not self and not slot and self in emulation.placed:
                emulation.own(result, emulation.placed[self])  # a cast stays on its GPU
            return result
        if isinstance(device, torch.Tensor):
            args, kwargs = (args[0].cpu(), *args[1:]), kwargs
        else:
            args, kwargs = _on_cpu(args, kwargs, slot)
        emulation.placement("tensor", index)
        if emulation.placed.get(self) == index:
            return tensor_to(self, *args, **kwargs)
        # A copy, as a move to another device makes: changing it leaves the original as it was.
        return emulation.own(tensor_to(self, *args, **{**kwargs, "copy": True}), index)

    @functools.wraps(torch.Tensor.cuda)
    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, memory_format: Any = torch.preserve_format) -> torch.Tensor:
        index = emulation.current if device is None else emulation.index(device)
        assert index is not None
        emulation.placement("tensor", index)
        if emulation.placed.get(self) == index:
            return self
        return emulation.own(tensor_to(self, "cpu", copy=True, memory_format=memory_format), index)

    @functools.wraps(tensor_cpu)
    def cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self in emulation.placed:
            return tensor_to(self, "cpu", copy=True)  # a copy, as from a GPU
        return tensor_cpu(self, *args, **kwargs)

    def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
        emulation.note("pin_memory leaves tensors in pageable memory: a CPU build of torch cannot pin")
        return self

    torch.Tensor.to = to
    torch.Tensor.cuda = cuda
    torch.Tensor.cpu = cpu
    torch.Tensor.pin_memory = pin_memory
    for name in _FACTORIES:
        setattr(torch, name, _factory(emulation, getattr(torch, name), like=name.endswith("_like")))
    for name in _NEW:
        setattr(torch.Tensor, name, _factory(emulation, getattr(torch.Tensor, name), like=True))


def _install_default_device(emulation: Emulation) -> None:
    """`torch.set_default_device("cuda")` and `with torch.device("cuda"):` both enter torch's DeviceContext
    (the latter from C++), a mode that hands its device to every factory called without one: under
    emulation a CUDA device makes the tensor on the CPU, placed on its logical GPU."""
    from torch.utils._device import DeviceContext, _device_constructors

    default_device = torch.get_default_device

    @functools.lru_cache(1)
    def constructors() -> frozenset:
        # torch's set holds whatever `torch.ones` is when first asked: here, maybe the emulation's wrapper.
        return frozenset(inspect.unwrap(function) for function in _device_constructors())

    def __torch_function__(self: DeviceContext, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if inspect.unwrap(func) not in constructors() or kwargs.get("device") is not None:
            return func(*args, **kwargs)
        index = emulation.index(self.device)
        if index is None:
            return func(*args, **{**kwargs, "device": self.device})
        emulation.placement("tensor", index)
        return emulation.own(func(*args, **{**kwargs, "device": "cpu"}), index)

    @functools.wraps(default_device)
    def get_default_device() -> torch.device:
        from torch.utils._device import CURRENT_DEVICE

        if CURRENT_DEVICE is not None and CURRENT_DEVICE.type == "cuda":
            # Not torch's way, which makes a tensor to read its device: here that tensor is on the CPU.
            return torch.device("cuda", emulation.index(CURRENT_DEVICE))
        return default_device()

    DeviceContext.__torch_function__ = __torch_function__
    torch.get_default_device = get_default_device


def _factory(emulation: Emulation, original: Callable[..., Any], like: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def factory(*args: Any, **kwargs: Any) -> Any:
        if kwargs.pop("pin_memory", False):
            emulation.note("pin_memory leaves tensors in pageable memory: a CPU build of torch cannot pin")
        device = kwargs.get("device")
        index = None if device is None else emulation.index(device)
        if index is None:
            result = original(*args, **kwargs)
            if like and device is None and args and args[0] in emulation.placed:
                emulation.own(result, emulation.placed[args[0]])  # `zeros_like(x)`, `x.new_zeros(...)`: on x's GPU
            return result
        emulation.placement("tensor", index)
        return emulation.own(original(*args, **{**kwargs, "device": "cpu"}), index)

    return factory


def place_module(emulation: Emulation, module: nn.Module, index: Optional[int]) -> None:
    """Record a module's parameters and buffers on a logical GPU (None: back on the CPU)."""
    for sub in module.modules():
        sub.__dict__["_dplint_gpu"] = index
    for tensor in (*module.parameters(), *module.buffers()):
        if index is None:
            emulation.placed.pop(tensor, None)
        else:
            emulation.own(tensor, index)
    if index is not None and not module.__dict__.get("_dplint_checked"):
        module.__dict__["_dplint_checked"] = True
        module.register_forward_pre_hook(lambda m, a, k: emulation.check_inputs(m, a, k), with_kwargs=True)


def _install_modules(emulation: Emulation, simulated_dataparallel: bool) -> None:
    module_to, module_cpu = nn.Module.to, nn.Module.cpu
    parameter_new = nn.Parameter.__new__

    def new_parameter(cls: Any, data: Any = None, requires_grad: bool = True) -> Any:
        # A layer built on a device (`device=`, the default device) wraps its placed tensor: the parameter is there too.
        parameter = parameter_new(cls, data, requires_grad)
        index = emulation.placed.get(data) if isinstance(data, torch.Tensor) else None
        return parameter if index is None else emulation.own(parameter, index)

    nn.Parameter.__new__ = new_parameter  # type: ignore[assignment]

    @functools.wraps(module_to)
    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        slot, device = _device_argument(args, kwargs)
        index = (emulation.placed.get(device) if isinstance(device, torch.Tensor) else emulation.index(device)) if slot else None
        if index is None:
            return module_to(self, *args, **kwargs)
        if not isinstance(device, torch.Tensor):
            args, kwargs = _on_cpu(args, kwargs, slot)
        result = module_to(self, *args, **kwargs)
        emulation.placement("model", index)
        place_module(emulation, self, index)
        return result

    @functools.wraps(nn.Module.cuda)
    def cuda(self: nn.Module, device: Any = None) -> nn.Module:
        index = emulation.current if device is None else emulation.index(device)
        assert index is not None
        emulation.placement("model", index)
        place_module(emulation, self, index)
        return self

    @functools.wraps(module_cpu)
    def cpu(self: nn.Module) -> nn.Module:
        place_module(emulation, self, None)
        return module_cpu(self)

    nn.Module.to = to
    nn.Module.cuda = cuda
    nn.Module.cpu = cpu

    def sync_batch_norm(self: nn.SyncBatchNorm, input: torch.Tensor) -> torch.Tensor:
        emulation.note("SyncBatchNorm runs as BatchNorm: each rank normalises with its own batch's statistics")
        return nn.modules.batchnorm._BatchNorm.forward(self, input)

    nn.SyncBatchNorm.forward = sync_batch_norm
    data_parallel = nn.DataParallel.__init__

    # DataParallel takes torch's path for a machine without GPUs (it would query real GPUs' properties):
    # it keeps no devices and calls its module once, unsplit, unless dplint simulates its forward.
    # (`torch.nn.parallel.data_parallel` is the function, which hides its module of the same name.)
    sys.modules["torch.nn.parallel.data_parallel"]._get_available_device_type = lambda: None  # type: ignore[attr-defined]
    if not simulated_dataparallel:

        @functools.wraps(data_parallel)
        def data_parallel_init(self: nn.DataParallel, *args: Any, **kwargs: Any) -> None:
            emulation.note("DataParallel runs its module once, unsplit: its devices are not emulated")
            data_parallel(self, *args, **kwargs)

        nn.DataParallel.__init__ = data_parallel_init


# torch.load --------------------------------------------------------------------------------------
def _install_load(emulation: Emulation) -> None:
    original = torch.load

    @functools.wraps(original)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        index: Optional[int] = None
        if callable(map_location) or map_location is None:
            return original(f, map_location, *args, **kwargs)
        if isinstance(map_location, dict):
            targets = {emulation.index(value) for value in map_location.values()}
            if targets - {None}:
                map_location = {key: "cpu" if emulation.index(value) is not None else value for key, value in map_location.items()}
                index = min(targets - {None})
        else:
            index = emulation.index(map_location)
            if index is not None:
                map_location = "cpu"
        loaded = original(f, map_location, *args, **kwargs)
        if index is not None:
            emulation.placement("load", index)
            for tensor in _loaded_tensors(loaded):
                emulation.own(tensor, index)
        return loaded

    torch.load = load
    torch.serialization.load = load


def _moved(emulation: Emulation, value: Any, index: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value if emulation.placed.get(value) == index else emulation.own(value.view_as(value), index)
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_moved(emulation, item, index) for item in value)
    return value


def _loaded_tensors(value: Any, depth: int = 0) -> Iterable[torch.Tensor]:
    """The tensors of a loaded checkpoint: a state dict, or dicts and lists of them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 4 and isinstance(value, dict):
        for item in value.values():
            yield from _loaded_tensors(item, depth + 1)
    elif depth < 4 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _loaded_tensors(item, depth + 1)


# autocast and GradScaler -------------------------------------------------------------------------
def _install_precision(emulation: Emulation) -> None:
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__init__

    @functools.wraps(original)
    def __init__(self: Any, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None) -> None:
        if device_type == "cuda":
            dtype = torch.float16 if dtype is None else dtype  # CUDA autocast's default, kept on the CPU
            emulation.note(f"autocast('cuda') runs as CPU autocast in {str(dtype).replace('torch.', '')}")
            device_type = "cpu"
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    autocast.__init__ = __init__
    # Adam and its kin ask the current stream whether a CUDA graph is being captured; none ever is here.
    torch.optim.Optimizer._accelerator_graph_capture_health_check = lambda self: None


# torch.distributed -------------------------------------------------------------------------------
def _install_distributed(emulation: Emulation) -> None:
    from torch.nn.parallel import DistributedDataParallel

    ddp_init, ddp_forward = DistributedDataParallel.__init__, DistributedDataParallel.forward
    signature = inspect.signature(ddp_init)

    @functools.wraps(ddp_init)
    def __init__(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        device_ids = bound.arguments.get("device_ids")
        index = None
        if device_ids:
            if len(device_ids) > 1:
                raise ValueError("device_ids can only be None or contain a single element.")
            index = emulation.index(device_ids[0])
            emulation.placement("DDP", index)
        # The data is on the CPU: DDP runs as for a CPU module, and its inputs are placed on device_ids[0] here.
        bound.arguments["device_ids"] = None
        bound.arguments["output_device"] = None
        ddp_init(*bound.args, **bound.kwargs)
        self.__dict__["_dplint_gpu"] = index

    @functools.wraps(ddp_forward)
    def forward(self: DistributedDataParallel, *inputs: Any, **kwargs: Any) -> Any:
        index = self.__dict__.get("_dplint_gpu")
        if index is not None:  # DDP moves its inputs to device_ids[0]: a copy where a tensor is elsewhere
            inputs = tuple(_moved(emulation, value, index) for value in inputs)
            kwargs = {name: _moved(emulation, value, index) for name, value in kwargs.items()}
        return ddp_forward(self, *inputs, **kwargs)

    sync_batch_norm_check = DistributedDataParallel._passing_sync_batchnorm_handle

    @functools.wraps(sync_batch_norm_check)
    def passing_sync_batchnorm_handle(self: DistributedDataParallel, module: nn.Module) -> None:
        if module.__dict__.get("_dplint_gpu") is None:  # a module left on the CPU fails as it does with GPUs
            sync_batch_norm_check(self, module)

    DistributedDataParallel.__init__ = __init__
    DistributedDataParallel.forward = forward
    DistributedDataParallel._passing_sync_batchnorm_handle = passing_sync_batchnorm_handle
    default_backend = dist.get_default_backend_for_device

    @functools.wraps(default_backend)
    def get_default_backend_for_device(device: Any) -> str:
        if emulation.index(device) is not None:
            return "gloo"  # NCCL is the GPUs' backend; on the CPU the group runs as gloo
        return default_backend(device)

    barrier = dist.barrier

    @functools.wraps(barrier)
    def barrier_on_cpu(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("device_ids", None)  # gloo's barrier has no device to choose
        return barrier(*args, **kwargs)

    # torch 2.13 routes all_gather_into_tensor through all_gather_single; earlier versions have only the former.
    gather_name = "all_gather_single" if hasattr(dist.distributed_c10d, "all_gather_single") else "all_gather_into_tensor"
    gather_into_tensor = getattr(dist.distributed_c10d, gather_name)

    @functools.wraps(gather_into_tensor)
    def gather_into_tensor_on_cpu(output_tensor: torch.Tensor, input_tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # NCCL fills the output by element count, whatever its shape (Accelerate gathers a (B, 1) tensor
        # into a flat one); gloo compares each rank's chunk with the input's shape: it gets both flat.
        if output_tensor.is_contiguous() and output_tensor.shape[1:] != input_tensor.shape[1:]:
            return gather_into_tensor(output_tensor.view(-1), input_tensor.reshape(-1), *args, **kwargs)
        return gather_into_tensor(output_tensor, input_tensor, *args, **kwargs)

    for name, replacement in (
        ("get_default_backend_for_device", get_default_backend_for_device),
        ("barrier", barrier_on_cpu),
        (gather_name, gather_into_tensor_on_cpu),
    ):
        setattr(dist.distributed_c10d, name, replacement)
        setattr(dist, name, replacement)
