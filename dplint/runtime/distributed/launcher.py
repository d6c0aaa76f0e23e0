"""The launcher: host the store, start N ranks with torchrun's environment, watch them, report."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from dplint.runtime.distributed import channel as keys
from dplint.runtime.distributed.analysis import _ranks as listed
from dplint.runtime.distributed.analysis import findings as analyse
from dplint.finding import Finding
from dplint.run_options import ALL_CHECKS, DEFAULT_TIMEOUT
from dplint.runtime.distributed.errors import LaunchError, RankFailure, finding_line

ACTIONS = ("raise", "warn")
# A failed rank's peers get this long to notice (a closed connection, a peer that ended) before they are stopped.
_GRACE = 5.0
_POLL = 0.02


def _validate(nprocs: Any, timeout: Any, checks: Iterable[str], action: str) -> List[str]:
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive int, got {nprocs!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
    chosen = list(checks)
    unknown = sorted(set(chosen) - set(ALL_CHECKS))
    if unknown:
        raise ValueError(f"unknown checks {unknown}; choose from {list(ALL_CHECKS)}")
    return chosen


def rank_environment(rank: int, world_size: int, port: int, per_node: int) -> Dict[str, str]:
    """The variables torchrun sets for one rank, its node holding `per_node` ranks, pointed at dplint's
    store; real GPUs hidden."""
    environment = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % per_node),
        "GROUP_RANK": str(rank // per_node),
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(per_node),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # every rank is a client of the launcher's store
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_RUN_ID": "dplint",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "CUDA_VISIBLE_DEVICES": "",  # real GPUs stay unused: the ranks' data is on the CPU, their GPUs emulated
        # DeepSpeed takes its CPU accelerator: its CUDA one builds CUDA kernels, which emulated GPUs cannot run.
        "DS_ACCELERATOR": "cpu",
    }
    # As torchrun: one thread per rank when several share the machine, unless the user chose.
    if "OMP_NUM_THREADS" in os.environ or world_size > 1:
        environment["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    return environment


@dataclass
class Outcome:
    failures: List[RankFailure]
    states: Dict[int, str]
    findings: List[Finding]
    results: Dict[int, Any]
    joined: List[int]  # the ranks that joined a process group of all the ranks
    spawns: List[Dict[str, Any]]  # the script's own mp.spawn calls that started no process
    gpus: int = 0  # the GPUs each rank saw (0: CUDA hidden)
    dataparallel: bool = False  # one process, DataParallel simulated: no process group to join
    interrupted: Optional[BaseException] = None  # the KeyboardInterrupt or SystemExit (a signal) that stopped the run

    def incomplete(self) -> Optional[str]:
        """Why a run without failures proves nothing (None: every rank joined, and ran what it was given)."""
        world = len(self.states)
        if (len(self.joined) == world or self.dataparallel) and not self.spawns:
            return None
        joined = f"{len(self.joined)} of {world} rank{'s' * (world != 1)} joined a process group"
        if self.spawns:
            spawn = self.spawns[0]
            why = " (torch.cuda.device_count() is 0: dplint hides CUDA)" if not self.gpus else ""
            return f"{joined}: {spawn['call']} at {spawn['where']} started no process{why}"
        missing = [r for r in range(world) if r not in self.joined]
        return f"{joined}: {listed(missing)} never called init_process_group"

    def reported(self) -> List[Finding]:
        """Every finding of the run: the checks' and, when a rank stopped on a pitfall, that pitfall's."""
        error = self.error()
        failure = error.failure if error is not None else None
        if failure is None or not failure.code:
            return list(self.findings)
        from dplint.runtime.findings import runtime_finding

        return [runtime_finding(failure.code, failure.message, failure.where, (failure.rank,), failure.help), *self.findings]

    def error(self) -> Optional[LaunchError]:
        if self.failures:
            primary = min(self.failures, key=lambda f: (f.time, f.rank))  # the first to fail; the others follow from it
            return LaunchError(primary, self.states, self.findings)
        incomplete = self.incomplete()
        return LaunchError(None, self.states, self.findings, incomplete) if self.findings or incomplete else None


class _Rank:
    """A started rank's process."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.stopped = False

    def exit_code(self) -> Optional[int]:
        code = self.process.exitcode
        # 255 for a rank still running: dplint's forkserver, its parent, was killed (a signal to the
        # launcher's whole process group: `timeout`, a scheduler), and multiprocessing lost track of it.
        return None if code == 255 and self._alive() else code

    def _alive(self) -> bool:
        try:
            os.kill(self.process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self) -> None:
        if self.exit_code() is None:
            self.stopped = True
        try:
            # Always the rank's whole group: it and the processes it started, even when multiprocessing
            # believes it ended (a killed forkserver reports every rank ended).
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, AttributeError):  # ended with its group, or not POSIX
            pass
        if self.process.exitcode is None:
            self.process.kill()
        self.process.join()


def _store() -> Any:
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))


def _supervise(store: Any, ranks: List[_Rank], timeout: float, per_node: int) -> Outcome:
    world = len(ranks)
    failed_at: Optional[float] = None
    interrupted: Optional[BaseException] = None
    try:
        try:
            while True:
                codes = [rank.exit_code() for rank in ranks]
                if all(code is not None for code in codes):
                    break
                if failed_at is None and (
                    any(code not in (None, 0) for code in codes) or any(store.check([keys.error_key(r)]) for r in range(world))
                ):
                    failed_at = time.monotonic()
                if failed_at is not None and time.monotonic() - failed_at > min(_GRACE, timeout):
                    break
                time.sleep(_POLL)
        except (KeyboardInterrupt, SystemExit) as stopped:  # Ctrl-C, SIGTERM: what the ranks saw so far is reported
            interrupted = stopped
        states = {r: _state(store, r) for r in range(world)}
    finally:
        for rank in ranks:
            rank.stop()
    failures = []
    for r, rank in enumerate(ranks):
        text = keys.read_text(store, keys.error_key(r))
        if text is not None:
            failures.append(RankFailure(**json.loads(text)))
        elif rank.stopped:
            states[r] += " (dplint stopped it)"
        elif rank.exit_code() not in (0, None) and keys.read_text(store, keys.done_key(r)) is None:
            where = states[r]
            failures.append(RankFailure(r, "exit", f"the process died with exit code {rank.exit_code()}", where, time=time.time()))
    events = {r: keys.read_events(store, r) for r in range(world)}
    results = {}
    for r in range(world):
        key = keys.result_key(r)
        if store.check([key]):
            results[r] = pickle.loads(store.get(key))
    joined = [r for r in range(world) if keys.read_text(store, keys.joined_key(r)) == str(world)]
    spawns = [event for r in range(world) for event in events[r] if event["kind"] == "spawn"]
    return Outcome(failures, states, analyse(events, per_node), results, joined, spawns, interrupted=interrupted)


def _state(store: Any, rank: int) -> str:
    for key in (keys.done_key(rank), keys.state_key(rank)):
        text = keys.read_text(store, key)
        if text is not None:
            return text
    return "had not started its work"


def launch(
    fn: Callable[..., Any],
    *args: Any,
    nprocs: int = 2,
    timeout: float = DEFAULT_TIMEOUT,
    checks: Optional[Iterable[str]] = None,
    action: str = "raise",
    kwargs: Optional[Dict[str, Any]] = None,
) -> List[Any]:
    """Run `fn(*args, **kwargs)` in `nprocs` processes joined in a gloo process group, with the checks on.

    Returns every rank's result, in rank order. Raises LaunchError when a rank fails (saying which
    rank, where, and what every other rank was doing), when `fn` started no work (its own
    `mp.spawn(nprocs=0)`), or, with `action="raise"`, when the checks found pitfalls; with
    `action="warn"` findings are warnings instead. `timeout` (seconds) bounds
    every wait on a peer: a collective, a barrier, the group's rendezvous. `checks` picks checks by
    name (None: all of `dplint.runtime.distributed.ALL_CHECKS`; empty: none, only the CPU shims). `fn` and its arguments must be
    picklable (a module-level function), as with torch.multiprocessing.spawn.
    """
    from dplint.runtime.distributed.rank import run_function

    chosen = _validate(nprocs, timeout, ALL_CHECKS if checks is None else checks, action)
    outcome = _run(run_function, (fn, args, kwargs or {}), nprocs, {"timeout": float(timeout), "checks": chosen, "launcher": os.getpid()}, nprocs)
    if outcome.interrupted is not None:
        raise outcome.interrupted
    _report(outcome, action)
    return [outcome.results.get(r) for r in range(nprocs)]


def _report(outcome: Outcome, action: str) -> None:
    if outcome.failures or action == "raise" or outcome.incomplete():
        error = outcome.error()
        if error is not None:
            raise error
    for finding in outcome.findings:
        warnings.warn(finding_line(finding), RuntimeWarning, stacklevel=3)


def _context() -> Any:
    """A forkserver that has imported torch once: each rank starts in milliseconds instead of re-importing it."""
    if sys.platform == "win32":
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # DistributedDataParallel's constructor imports torch._dynamo (seconds): once here, not in every rank.
    context.set_forkserver_preload(["dplint.runtime.distributed.rank", "dplint.runtime.distributed.checks", "dplint.runtime", "torch._dynamo"])
    return context


def run_script(
    target: Sequence[str],
    nprocs: int,
    timeout: float = DEFAULT_TIMEOUT,
    checks: Optional[Iterable[str]] = None,
    gpus: Optional[int] = None,
    dataparallel: bool = False,
    prints_to_stderr: bool = False,
    nnodes: int = 1,
) -> Outcome:
    """`dplint run`: run a script (or `-m` module) as `__main__` in each rank, as torchrun would.

    `nnodes` emulated nodes of `nprocs` ranks each (ranks numbered node by node, as torchrun's). Each
    rank sees its node's `gpus` emulated GPUs (None: one per rank of the node; 0: none, CUDA hidden). `dataparallel`
    (`dplint run --devices N`): one process, as `python script.py`, its DataParallel forwards simulated
    on the `gpus` GPUs with the DataParallel checks. `prints_to_stderr`: the ranks' standard output
    (their children's too) goes to standard error, leaving the launcher's to the report.
    """
    from dplint.runtime.distributed.rank import run_script as run_rank

    chosen = _validate(nprocs, timeout, ALL_CHECKS if checks is None else checks, "raise")
    gpus = nprocs if gpus is None else gpus
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        raise ValueError(f"gpus must be a non-negative int, got {gpus!r}")
    if dataparallel and (nprocs != 1 or gpus < 1):
        raise ValueError("a DataParallel run is one process with at least one GPU")
    settings = {
        "timeout": float(timeout), "checks": chosen, "launcher": os.getpid(), "gpus": gpus, "dataparallel": dataparallel,
        "prints_to_stderr": prints_to_stderr,
    }  # fmt: skip
    if not isinstance(nnodes, int) or isinstance(nnodes, bool) or nnodes < 1 or (dataparallel and nnodes != 1):
        raise ValueError(f"nnodes must be a positive int (1 for a DataParallel run), got {nnodes!r}")
    outcome = _run(run_rank, (tuple(target),), nprocs * nnodes, settings, nprocs)
    outcome.gpus = gpus
    outcome.dataparallel = dataparallel
    return outcome


def _run(target: Callable[..., Any], arguments: tuple, nprocs: int, settings: Dict[str, Any], per_node: int) -> Outcome:
    """`nprocs` ranks in all, `per_node` of them on each emulated node."""
    context = _context()
    store = _store()
    started: List[_Rank] = []
    try:
        for r in range(nprocs):
            process = context.Process(
                target=target,
                args=(rank_environment(r, nprocs, store.port, per_node), settings, *arguments),
                name=f"dplint-rank-{r}",
                daemon=False,  # a rank may have children (DataLoader workers); _Rank.stop ends them with it
            )
            process.start()
            started.append(_Rank(process))
        return _supervise(store, started, float(settings["timeout"]), per_node)
    finally:
        for rank in started:
            rank.stop()
        del store
