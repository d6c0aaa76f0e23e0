"""The checks installed in every rank, and the shims that let a GPU script take its CPU path.

Everything a rank observes is published on the side channel (`channel.Channel`): cross-rank
comparisons that need no answer before going on (sampler settings, first batches, parameter
checksums, checkpoint paths) are made by the launcher after the run; only collectives compare at
once, because a mismatched collective hangs or silently corrupts data on gloo.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.data.dataloader import _BaseDataLoaderIter, _DatasetKind

from dplint.finding import display_path
from dplint.runtime.distributed.channel import Channel, frame_spot, guard_site, site_of, user_site
from dplint.runtime.distributed.errors import DistributedPitfall, PeerFailed, SetupError
from dplint.run_options import ALL_CHECKS
from dplint.runtime import devices
from dplint.runtime.origins import user_code

COLLECTIVES = (
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all", "all_to_all_single",
    "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter", "scatter_object_list",
)  # fmt: skip
_SIGNATURE_ARGUMENTS = ("src", "dst", "group_src", "group_dst", "op")
_FIRST_BATCH_LIMIT = 4096
_UNUSED = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")


@dataclass
class _Model:
    """A DistributedDataParallel model of this rank, numbered in construction order."""

    index: int
    ddp: "weakref.ref[DistributedDataParallel]"
    where: str  # the spot of its construction, `file:line:column`
    params: List[nn.Parameter]
    reducer_names: List[str]  # DDP's own parameter order: the indices in its unused-parameter error
    steps: int = 0
    noted: Set[str] = field(default_factory=set)


class _RankChecks:
    def __init__(self, channel: Channel, checks: Set[str], group_ready: bool) -> None:
        self.channel = channel
        self.checks = checks
        self.group_ready = group_ready  # the launcher initialised the default group before the user's code
        self.sequence = 0
        self.last_collective = ""
        self.local = threading.local()
        self.models: List[_Model] = []
        self.samplers = 0
        self.loaders = 0
        self.saved: Set[str] = set()
        self.notes: Set[str] = set()
        self.destroyed_groups: Set[Any] = set()
        self.sites: Set[str] = set()  # the collective call sites this rank has reached
        self.pending_sync: Optional[str] = None  # a DDP forward whose backward will all-reduce gradients
        self.none_results: Dict[str, str] = {}  # the collective call sites that returned None, with the collective
        self.delivered: Dict[int, "_Pass"] = {}  # by sampler: the pass whose batch is trained on at the next step
        self.master = (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])  # dplint's store, where every group meets

    # collectives -------------------------------------------------------------------------------
    def depth(self) -> int:
        return getattr(self.local, "depth", 0)

    def enter(self, call: str, spot: str) -> None:
        """Publish the fingerprint of the next collective on the default group and compare it with the peers'.
        `spot`: the call's `file:line:column`; the texts name its `file:line`."""
        self.sequence += 1
        where = site_of(spot)
        self.channel.state(f"is in {call} at {where}")
        if where not in self.sites:
            self.sites.add(where)
            self.channel.reached(where)
        mine = {"call": call, "where": where, "spot": spot}
        theirs = self.channel.exchange(self.sequence, mine)
        if all(peer is not None and peer["call"] == call for peer in theirs.values()):
            return
        failed = [rank for rank, peer in theirs.items() if peer is None and self.channel.failed(rank)]
        if failed:  # a consequence, not the cause: the launcher reports the failed rank first
            raise PeerFailed(f"rank {failed[0]} failed while rank {self.channel.rank} waited in {call} at {where}")
        theirs[self.channel.rank] = mine
        parts = [
            f"rank {rank} {self.channel.peer_state(rank)}" if peer is None else f"rank {rank} is in {peer['call']} at {peer['where']}"
            for rank, peer in sorted(theirs.items())
        ]
        raise DistributedPitfall("DPL507", "Collective mismatch: " + "; ".join(parts) + ".", self._odd_spot(theirs))

    def _odd_spot(self, calls: Dict[int, Optional[Dict[str, str]]]) -> str:
        """Of the mismatched calls, the spot of the site the fewest ranks ever reached: the collective only some ranks make."""
        reached = [self.sites] + [set(self.channel.sites(rank)) for rank in self.channel.peers]
        made = [peer for _, peer in sorted(calls.items()) if peer is not None]
        return min(made, key=lambda peer: sum(peer["where"] in ranks for ranks in reached))["spot"]

    def leave(self, call: str, where: str) -> None:
        self.last_collective = f"{call} at {where}"
        self.channel.state(f"is running; its last collective was {self.last_collective}")

    def note(self, text: str) -> None:
        """Say something about the run once, from rank 0."""
        if text not in self.notes and self.channel.rank == 0:
            # One write, line and newline together: print() writes them apart, and a warning another
            # rank prints to the same stderr can land between them.
            sys.stderr.write(f"dplint: {text}\n")
            sys.stderr.flush()
        self.notes.add(text)

    def model_of(self, module: nn.Module) -> Optional[_Model]:
        for model in self.models:
            ddp = model.ddp()
            if ddp is not None and (module is ddp or any(module is sub for sub in ddp.module.modules())):
                return model
        return None

    def changed_after_wrap(self, module: nn.Module, what: str) -> None:
        if getattr(self.local, "quiet", 0):
            return
        model = self.model_of(module)
        if model is None:
            return
        where = user_site(3)
        if f"changed {where}" not in model.noted:
            model.noted.add(f"changed {where}")
            self.channel.event("changed", model=model.index, what=what, where=where)


_active: Optional[_RankChecks] = None


def install(channel: Channel, checks: Set[str], group_ready: bool = False, gpus: int = 0, dataparallel: bool = False) -> None:
    """Install the shims and the chosen checks in this process (one rank), with `gpus` emulated GPUs (0: CUDA hidden);
    `dataparallel`: one process whose DataParallel forwards are simulated on those GPUs, with their checks."""
    global _active
    unknown = set(checks) - set(ALL_CHECKS)
    if unknown:
        raise ValueError(f"unknown distributed checks: {sorted(unknown)}; choose from {list(ALL_CHECKS)}")
    _active = rank = _RankChecks(channel, set(checks), group_ready)
    if gpus:
        devices.install(gpus, rank.note, channel.event, dataparallel)  # first: the checks below wrap its DDP and collectives
    if dataparallel:
        _install_dataparallel(channel, gpus)
    _install_shims(rank)
    if checks & {"collectives", "samplers"}:
        torch.autograd.backward = _backward(rank, torch.autograd.backward)
    if "samplers" in checks:
        register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _trained(rank))
    if "collectives" in checks:
        for name in COLLECTIVES:
            _replace_distributed_function(name, _collective(rank, name, getattr(dist.distributed_c10d, name)))
        _install_gathers(rank)
    DistributedDataParallel.__init__ = _ddp_init(rank, DistributedDataParallel.__init__)
    if checks & {"collectives", "divergence", "unused-parameters"}:
        DistributedDataParallel.forward = _ddp_forward(rank, DistributedDataParallel.forward)
    if "divergence" in checks:
        # What changed, as a finding's message opens: "<what> after the DDP wrap".
        nn.Module.load_state_dict = _changing(rank, nn.Module.load_state_dict, "`load_state_dict()` runs")
        nn.Module._apply = _changing(rank, nn.Module._apply, "A move or cast (`.to`, `.double`, ...) runs")
        registration = torch.nn.modules.module
        registration.register_module_module_registration_hook(
            lambda module, name, sub: rank.changed_after_wrap(module, f"Submodule `{name}` is replaced")
        )
        registration.register_module_parameter_registration_hook(
            lambda module, name, param: rank.changed_after_wrap(module, f"Parameter `{name}` is replaced")
        )
        register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _after_step(rank))
    if checks & {"samplers", "sharding"}:
        DistributedSampler.__init__ = _sampler_init(rank, DistributedSampler.__init__)
        _BaseDataLoaderIter._next_index = _next_index(rank, _BaseDataLoaderIter._next_index)
        _BaseDataLoaderIter.__next__ = _next_batch(rank, _BaseDataLoaderIter.__next__)
    if "sharding" in checks:
        DataLoader.__init__ = _loader_init(DataLoader.__init__)
        DataLoader.__iter__ = _loader_iter(rank, DataLoader.__iter__)
    if "checkpoints" in checks:
        saving = _save(rank, torch.save)
        torch.save = saving
        torch.serialization.save = saving


# shims: a torchrun/NCCL script on CPU -------------------------------------------------------------
def _install_shims(rank: _RankChecks) -> None:
    original = dist.init_process_group
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if rank.group_ready and dist.is_initialized():
            return None  # `launch` joined the group already: the function's own call is a no-op
        bound = signature.bind(*args, **kwargs)
        backend = bound.arguments.get("backend")
        if backend is not None and "nccl" in str(backend).lower():
            rank.note(f"backend {str(backend)!r} runs as 'gloo' on CPU ({site_of(user_site())})")
            bound.arguments["backend"] = "gloo"
        device_id = bound.arguments.get("device_id")
        if device_id is not None and (devices.active() is not None or not torch.cuda.is_available()):
            bound.arguments["device_id"] = None
        timeout = bound.arguments.get("timeout")
        if timeout is None or timeout.total_seconds() > rank.channel.timeout:
            from datetime import timedelta

            bound.arguments["timeout"] = timedelta(seconds=rank.channel.timeout)
        _to_dplint_store(rank, bound.arguments)
        result = original(*bound.args, **bound.kwargs)
        rank.channel.joined(dist.get_world_size())
        return result

    _replace_distributed_function("init_process_group", init_process_group)
    destroy = dist.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        # A gloo group's destructor joins its worker threads. When the last reference to the group is a
        # DistributedDataParallel model's reducer, freed while the GIL is held, a worker still freeing a
        # finished collective's tensors waits for the GIL forever (pytorch/pytorch#56297): the rank hangs
        # after its script ended. Holding the destroyed groups here, they end with the process instead.
        rank.destroyed_groups.update(dist.distributed_c10d._world.pg_map)
        return destroy(*args, **kwargs)

    _replace_distributed_function("destroy_process_group", destroy_process_group)
    import torch.multiprocessing as mp

    mp.spawn = _spawn_in_place(rank, "mp.spawn")
    mp.start_processes = _spawn_in_place(rank, "mp.start_processes")
    if not torch.cuda.is_available():
        torch.cuda.set_device = lambda device: None
    from torch.distributed.fsdp import FullyShardedDataParallel

    def fsdp1_unsupported(self: Any, *args: Any, **kwargs: Any) -> None:
        raise SetupError(
            f"FullyShardedDataParallel at {site_of(user_site())} needs real GPUs: dplint runs FSDP2's `fully_shard` on "
            "CPU ranks, not FSDP1"
        )

    FullyShardedDataParallel.__init__ = fsdp1_unsupported  # torch's own refuses the CPU: "FSDP needs a non-CPU accelerator device"


def _spawn_in_place(rank: _RankChecks, name: str) -> Callable[..., Any]:
    """A script that starts its own ranks: each of dplint's ranks is the process its spawn would start there."""

    def spawn(fn: Callable[..., Any], args: Any = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
              start_method: str = "spawn") -> Any:  # fmt: skip
        import torch.multiprocessing as mp

        call = f"{name}({getattr(fn, '__name__', 'fn')}, nprocs={nprocs})"
        where = site_of(user_site())
        world = rank.channel.world_size
        per_node = int(os.environ["LOCAL_WORLD_SIZE"])  # a spawn starts the ranks of its own node
        if nprocs == 0:
            rank.channel.event("spawn", call=call, where=where)
        elif nprocs != per_node:
            node = " a node" if per_node != world else ""
            raise SetupError(f"{call} at {where} asks for {nprocs} ranks; dplint started {per_node}{node}: run it with --nproc-per-node {nprocs}")
        else:
            rank.note(f"{call} at {where} runs {getattr(fn, '__name__', 'fn')}(LOCAL_RANK, ...) in each of the {world} rank{'s' * (world != 1)}")
            fn(int(os.environ["LOCAL_RANK"]), *args)
        return None if join else mp.ProcessContext([], [])

    return spawn


def _to_dplint_store(rank: _RankChecks, arguments: Dict[str, Any]) -> None:
    """A script's own rendezvous (`init_method="tcp://..."`, `store=`, explicit ranks) joins dplint's group instead."""
    own = {name: arguments[name] for name in ("init_method", "store") if arguments.get(name) not in (None, "env://")}
    address = (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
    if address != rank.master:  # the script set its own (the tutorials' `os.environ["MASTER_PORT"] = "12355"`)
        rank.note(f"MASTER_ADDR:MASTER_PORT {address[0]}:{address[1]} set by the script joins dplint's process group instead ({site_of(user_site(3))})")
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = rank.master
    asked = {name: arguments[name] for name in ("world_size", "rank") if arguments.get(name, -1) != -1}
    expected = {"world_size": rank.channel.world_size, "rank": rank.channel.rank}
    wrong = {name: value for name, value in asked.items() if value != expected[name]}
    local_rank = int(os.environ["LOCAL_RANK"])
    if wrong.get("rank", local_rank + 1) == local_rank:  # only where ranks differ from local ranks: on a second node
        raise DistributedPitfall(
            "DPL519",
            f"Rank {rank.channel.rank} passes its local rank {local_rank} as `rank=`: the nodes' processes claim the same global ranks.",
            user_site(3),
        )
    if wrong:
        name, value = next(iter(wrong.items()))
        raise SetupError(
            f"init_process_group({name}={value}) at {site_of(user_site(3))} on dplint's rank {rank.channel.rank} of "
            f"{rank.channel.world_size}: run it with --nproc-per-node matching its world size"
        )
    if own:
        name, value = next(iter(own.items()))
        rank.note(f"init_process_group({name}={value!r}) joins dplint's process group instead ({site_of(user_site(3))})")
        arguments.pop("init_method", None)
        arguments.pop("store", None)
        arguments.pop("world_size", None)
        arguments.pop("rank", None)


def _replace_distributed_function(name: str, replacement: Callable[..., Any]) -> None:
    """Replace a function of torch.distributed where user code finds it: `dist.<name>` and its defining module."""
    setattr(dist.distributed_c10d, name, replacement)
    if getattr(dist, name, None) is not None:
        setattr(dist, name, replacement)


# collectives -------------------------------------------------------------------------------------
def _describe(name: str, arguments: Dict[str, Any]) -> str:
    parts = []
    for value in arguments.values():
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            value = value[0]
        if isinstance(value, torch.Tensor):
            parts.append(f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}")
            break
    parts += [f"{key}={arguments[key]}" for key in _SIGNATURE_ARGUMENTS if arguments.get(key) is not None and key != "op"]
    if arguments.get("op") is not None:
        parts.append(f"op={getattr(arguments['op'], 'name', arguments['op'])}")
    return f"dist.{name}({', '.join(parts)})"


def _on_default_group(arguments: Dict[str, Any]) -> bool:
    group = arguments.get("group")
    return group is None or group is dist.GroupMember.WORLD


def _collective(rank: _RankChecks, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if rank.depth():  # a collective made of collectives (all_gather_object) is fingerprinted once
            return original(*args, **kwargs)
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)
        spot = user_site()
        call = _describe(name, arguments)
        if _on_default_group(arguments) and dist.is_initialized():
            rank.enter(call, spot)
        rank.local.depth = 1
        try:
            result = original(*args, **kwargs)
        finally:
            rank.local.depth = 0
            rank.leave(call, site_of(spot))
        if result is None:
            rank.none_results.setdefault(spot, name)
        return result

    return collective


def _install_gathers(rank: _RankChecks) -> None:
    """torch's calls that gather a sharded model or tensor on every rank, through DTensor's functional
    collectives, which the c10d functions above never see: each is checked as one collective, so a full
    state dict taken on rank 0 alone is a mismatch at the user's line, not a hang."""
    from torch.distributed.checkpoint import state_dict
    from torch.distributed.tensor import DTensor

    for name in ("get_model_state_dict", "get_optimizer_state_dict", "get_state_dict"):
        setattr(state_dict, name, _collective(rank, f"checkpoint.state_dict.{name}", getattr(state_dict, name)))
    DTensor.full_tensor = _collective(rank, "tensor.DTensor.full_tensor", DTensor.full_tensor)


def _install_dataparallel(channel: Channel, gpus: int) -> None:
    """DataParallel's checks on `gpus` simulated devices; their warnings (advice) become findings."""
    import warnings

    from dplint import runtime

    runtime.install(devices=max(gpus, 1))
    show = warnings.showwarning

    def showwarning(message: Any, category: Any, filename: str, lineno: int, *args: Any, **kwargs: Any) -> None:
        if isinstance(message, runtime.PitfallWarning):
            channel.finding(message.code, message.message, f"{display_path(filename)}:{lineno}")
        else:
            show(message, category, filename, lineno, *args, **kwargs)

    warnings.showwarning = showwarning


def explained(error: BaseException) -> BaseException:
    """The pitfall that caused `error`, where the run shows it; else `error`.

    DPL516 for a GPU index beyond the node's that is the rank's global rank, on a node other than the first.
    DPL512 for a TypeError/AttributeError on None that a collective's result (None) caused. Established,
    not guessed: the failing line is the collective's own (`dist.all_reduce(x) / n`), or a line of the
    function that assigned the result, whose name still holds None there.
    """
    if isinstance(error, devices.InvalidDevice):
        return _global_rank_as_device(error)
    rank = _active
    if rank is None or not rank.none_results or not isinstance(error, (TypeError, AttributeError)) or "NoneType" not in str(error):
        return error
    failing = _failing_user_frame(error)
    if failing is None:
        return error
    filename = failing.tb_frame.f_code.co_filename
    failed_at = f"{display_path(filename)}:{failing.tb_lineno}"
    lines = {line for _, _, line in failing.tb_frame.f_code.co_lines() if line is not None}
    raised = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    for spot, name in rank.none_results.items():
        site = site_of(spot)
        path, _, line = site.rpartition(":")
        said = f"`dist.{name}` works in place and returns `None` here"  # as the static rule says it
        if site == failed_at:
            message = f"{said}; this line uses that `None`: {raised}."
        else:
            assigned = re.match(rf"\s*([A-Za-z_]\w*)\s*=\s*[\w.]*\b{name}\(", linecache.getline(os.path.abspath(path), int(line)))
            if not (
                assigned and os.path.abspath(path) == filename and int(line) in lines
                and failing.tb_frame.f_locals.get(assigned.group(1), error) is None
            ):  # fmt: skip
                continue
            target = assigned.group(1)
            message = f"{said}; `{target}` holds that `None` at {failed_at}, which raised {raised}."
        pitfall = DistributedPitfall("DPL512", message, spot)
        pitfall.__cause__ = error
        return pitfall
    return error


def _global_rank_as_device(error: devices.InvalidDevice) -> BaseException:
    global_rank, local_rank = int(os.environ.get("RANK", -1)), int(os.environ.get("LOCAL_RANK", -1))
    failing = _failing_user_frame(error)
    if error.index != global_rank or global_rank == local_rank or failing is None:
        return error
    message = (
        f"Rank {global_rank} asks for `cuda:{global_rank}`, its global rank, on a node of {error.count} "
        f"GPU{'s' * (error.count != 1)}: a GPU's index on its node is the local rank ({local_rank} here)."
    )
    pitfall = DistributedPitfall("DPL516", message, frame_spot(failing.tb_frame))
    pitfall.__cause__ = error
    return pitfall


def _failing_user_frame(error: BaseException) -> Any:
    """The traceback entry of the innermost frame of the user's code that the error passed through (None: none)."""
    return next((tb for tb in _frames(error.__traceback__) if user_code(tb.tb_frame.f_code.co_filename)), None)


def _frames(traceback: Any) -> List[Any]:
    """The traceback's entries, innermost first."""
    entries = []
    while traceback is not None:
        entries.append(traceback)
        traceback = traceback.tb_next
    return entries[::-1]


# DistributedDataParallel -------------------------------------------------------------------------
def _ddp_init(rank: _RankChecks, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        module = bound.arguments["module"]
        on_cpu = all(p.device.type == "cpu" for p in module.parameters())
        if on_cpu and bound.arguments.get("device_ids") and devices.active() is None:
            rank.note(f"DDP device_ids={bound.arguments['device_ids']} dropped: the model is on CPU ({site_of(user_site())})")
            bound.arguments["device_ids"] = None
            bound.arguments["output_device"] = None
        spot = user_site()
        collective = "collectives" in rank.checks and dist.is_initialized() and bound.arguments.get("process_group") is None
        if collective:
            rank.enter("DDP construction (parameter broadcast)", spot)
        rank.local.quiet = getattr(rank.local, "quiet", 0) + 1
        try:
            original(*bound.args, **bound.kwargs)
        finally:
            rank.local.quiet -= 1
            if collective:
                rank.leave("DDP construction (parameter broadcast)", site_of(spot))
        _register(rank, self, spot)

    return __init__


def _register(rank: _RankChecks, ddp: DistributedDataParallel, where: str) -> None:
    seen: Set[int] = set()
    names, params = [], []
    for name, param in ddp.module.named_parameters():
        names.append(name)
        params.append(param)
        seen.add(id(param))
    reducer_names, reducer_seen = [], set()
    ignored = getattr(ddp, "parameters_to_ignore", set())
    for module_name, module in ddp.module.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if param.requires_grad and full not in ignored and id(param) not in reducer_seen:
                reducer_seen.add(id(param))
                reducer_names.append(full)
    model = _Model(len(rank.models), weakref.ref(ddp), where, params, reducer_names)
    rank.models.append(model)
    if "divergence" in rank.checks:
        rank.channel.event("model", model=model.index, where=where, names=names)
        hook = functools.partial(_bypass_hook, rank, model)
        for module in (ddp.module, *ddp.module.children()):
            module.register_forward_pre_hook(hook)


def _bypass_hook(rank: _RankChecks, model: _Model, module: nn.Module, inputs: Any) -> None:
    if getattr(rank.local, "ddp_forward", 0) or not torch.is_grad_enabled() or not module.training:
        return
    where = user_site(3)
    if f"bypass {where}" not in model.noted:
        model.noted.add(f"bypass {where}")
        rank.channel.event("bypass", model=model.index, where=where)


def _ddp_forward(rank: _RankChecks, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self: DistributedDataParallel, *inputs: Any, **kwargs: Any) -> Any:
        syncs, call, spot = False, "", ""
        if "collectives" in rank.checks:
            spot = user_site()
            syncs = self.will_sync_module_buffers() and self.process_group is dist.GroupMember.WORLD
            # Told apart: a forward with gradients is followed by the backward's all-reduce, one without is not.
            call = "DDP forward (buffer broadcast)" if torch.is_grad_enabled() else "DDP forward under no_grad (buffer broadcast)"
            if syncs:
                rank.enter(call, spot)
            else:
                rank.channel.state(f"is in or after DDP forward at {site_of(spot)} (its backward all-reduces gradients)")
        rank.local.ddp_forward = getattr(rank.local, "ddp_forward", 0) + 1
        try:
            output = original(self, *inputs, **kwargs)
            if torch.is_grad_enabled() and self.require_backward_grad_sync and self.process_group is dist.GroupMember.WORLD:
                rank.pending_sync = user_site()  # its backward all-reduces the gradients: a collective too
            return output
        except RuntimeError as error:
            unused = _UNUSED.search(str(error)) if "unused-parameters" in rank.checks else None
            if unused is None:
                raise
            raise _unused_parameters(rank, self, int(unused.group(1)), unused.group(2).split()) from error
        finally:
            rank.local.ddp_forward -= 1
            if syncs:
                rank.leave(call, site_of(spot))

    return forward


def _unused_parameters(rank: _RankChecks, ddp: DistributedDataParallel, on_rank: int, indices: List[str]) -> DistributedPitfall:
    model = next((m for m in rank.models if m.ddp() is ddp), None)
    names = [model.reducer_names[int(i)] for i in indices if model and int(i) < len(model.reducer_names)] or indices
    frozen = {name for name, param in ddp.module.named_parameters() if not param.requires_grad}
    listed = ", ".join(f"`{name}`" for name in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    if frozen & set(names):
        cause = "they were frozen after wrapping; freeze before `DistributedDataParallel(...)`"
    else:
        cause = "use them in every forward, or pass `find_unused_parameters=True`"
    message = f"Parameters got no gradient on rank {on_rank} in the previous iteration: {listed}; {cause}."
    return DistributedPitfall("DPL521", message, model.where if model else user_site())


def _changing(rank: _RankChecks, original: Callable[..., Any], what: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def changing(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if rank.models:
            rank.changed_after_wrap(self, what)
        rank.local.quiet = getattr(rank.local, "quiet", 0) + 1  # `_apply` recurses into every submodule
        try:
            return original(self, *args, **kwargs)
        finally:
            rank.local.quiet -= 1

    return changing


def _after_step(rank: _RankChecks) -> None:
    for model in rank.models:
        if model.ddp() is None or not model.params:
            continue
        model.steps += 1
        with torch.no_grad():
            norms = torch.stack([norm.double() for norm in torch._foreach_norm(model.params)]).tolist()
        rank.channel.event("params", model=model.index, step=model.steps, norms=norms)


# samplers and loaders ----------------------------------------------------------------------------
def _sampler_init(rank: _RankChecks, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: DistributedSampler, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._dplint_where = user_site()
        self._dplint_index = rank.samplers
        rank.samplers += 1
        if "sharding" in rank.checks:
            try:
                length: Optional[int] = len(self.dataset)  # type: ignore[arg-type]
            except TypeError:
                length = None
            rank.channel.event(
                "sampler", index=self._dplint_index, where=self._dplint_where, seed=self.seed, length=length,
                num_replicas=self.num_replicas, rank=self.rank, shuffle=self.shuffle, drop_last=self.drop_last,
            )  # fmt: skip

    return __init__


@dataclass(eq=False)
class _Pass:
    """One pass of a DataLoader over a shuffling DistributedSampler: its order is the sampler's epoch's."""

    sampler: DistributedSampler
    epoch: int
    counted: bool = False


def _distributed_sampler(index_sampler: Any) -> Optional[DistributedSampler]:
    """The DistributedSampler under a loader's sampler or batch sampler, if any."""
    for _ in range(3):
        if isinstance(index_sampler, DistributedSampler):
            return index_sampler
        index_sampler = getattr(index_sampler, "sampler", None)
    return None


def _training(rank: _RankChecks) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any((ddp := model.ddp()) is not None and ddp.training for model in rank.models)


def _trained(rank: _RankChecks) -> None:
    """A backward or an optimizer step: the passes that delivered the last training batches are training passes."""
    for step_pass in rank.delivered.values():
        if step_pass.counted:
            continue
        step_pass.counted = True
        sampler = step_pass.sampler
        epochs: Set[int] = sampler.__dict__.setdefault("_dplint_trained_epochs", set())
        if step_pass.epoch in epochs and not sampler.__dict__.get("_dplint_reported"):
            sampler._dplint_reported = True
            rank.channel.finding(
                "DPL501",
                f"This shuffling `DistributedSampler` starts a second training pass with its epoch still {step_pass.epoch}: "
                "every epoch has the same order.",
                sampler._dplint_where,
            )
        epochs.add(step_pass.epoch)
    rank.delivered.clear()


def _backward(rank: _RankChecks, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        synced, rank.pending_sync = rank.pending_sync, None
        if synced is None or "collectives" not in rank.checks:
            result = original(*args, **kwargs)
        else:
            spot = user_site()
            rank.enter("DDP backward (gradient all-reduce)", spot)
            try:
                result = original(*args, **kwargs)
            finally:
                rank.leave("DDP backward (gradient all-reduce)", site_of(spot))
        if "samplers" in rank.checks:
            _trained(rank)
        return result

    return backward


def _loader_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.__dict__["_dplint_where"] = user_site()

    return __init__


def _loader_iter(rank: _RankChecks, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __iter__(self: DataLoader) -> Any:
        iterator = original(self)
        if "_dplint_seen" not in self.__dict__ and _training(rank):
            self.__dict__["_dplint_seen"] = True
            padding = 0
            sampler = self.sampler
            if isinstance(sampler, DistributedSampler) and not sampler.drop_last:
                padding = sampler.total_size - len(sampler.dataset)  # type: ignore[arg-type]
            where = self.__dict__.get("_dplint_where") or user_site()
            iterator._dplint_first = {"index": rank.loaders, "where": where, "padding": padding}
            rank.loaders += 1
        return iterator

    return __iter__


def _next_index(rank: _RankChecks, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _next_index(self: _BaseDataLoaderIter) -> Any:
        index = original(self)
        first = self.__dict__.get("_dplint_first")
        if first is not None and self._dataset_kind == _DatasetKind.Map and "indices" not in first:
            first["indices"] = [int(i) for i in (index if isinstance(index, (list, tuple)) else [index])][:_FIRST_BATCH_LIMIT]
        if "samplers" in rank.checks and self.__dict__.get("_dplint_order") is not self._sampler_iter:
            # The first index of a new pass (a new index iterator): the sampler has just made its order, from its epoch now.
            self.__dict__["_dplint_order"] = self._sampler_iter
            sampler = _distributed_sampler(self._index_sampler)
            shuffled = sampler is not None and sampler.shuffle and hasattr(sampler, "_dplint_where")
            self.__dict__["_dplint_pass"] = _Pass(sampler, sampler.epoch) if shuffled else None
        return index

    return _next_index


def _next_batch(rank: _RankChecks, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __next__(self: _BaseDataLoaderIter) -> Any:
        batch = original(self)
        first = self.__dict__.pop("_dplint_first", None)
        if first is not None:
            if "indices" not in first:
                first["digest"] = _digest(batch)
            rank.channel.event("batch", **first)
        current = self.__dict__.get("_dplint_pass")
        if current is not None and (_training(rank) if rank.models else torch.is_grad_enabled()):
            # A later pass of the same sampler (the training loop after a peek) replaces an earlier one.
            rank.delivered[id(current.sampler)] = current
        return batch

    return __next__


def _digest(batch: Any) -> List[Any]:
    tensors: List[torch.Tensor] = []
    pending = [batch]
    while pending and len(tensors) < 16:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            tensors.append(item)
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return [[list(t.shape), float(t.detach().double().sum())] for t in tensors]


# checkpoints -------------------------------------------------------------------------------------
def _save(rank: _RankChecks, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, (str, os.PathLike)):
            path = os.path.realpath(os.fspath(f))
            if path not in rank.saved:
                rank.saved.add(path)
                rank.channel.event("save", path=path, where=guard_site())
        return original(obj, f, *args, **kwargs)

    return save
