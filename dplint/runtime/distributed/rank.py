"""One rank: connect to the launcher's store, install the checks, run the user's code, publish the outcome."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import runpy
import select
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict
from typing import Any, Callable, Dict, Optional, Sequence


def _end_with(launcher: int) -> None:
    """End this rank and its group when the launcher ends, even killed (its own cleanup then never runs)."""
    try:
        handle = os.pidfd_open(launcher)
    except (AttributeError, OSError):  # not Linux 5.3+: the launcher's cleanup is all there is
        return

    def watch() -> None:
        select.select([handle], [], [])  # readable once the launcher has ended
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="dplint-launcher-watch", daemon=True).start()


def _become_rank(environment: Dict[str, str], launcher: int) -> None:
    """Take torchrun's environment and threads, and stay under the launcher's control with any children."""
    os.environ.update(environment)
    # The forkserver made its start method this process's default; a script's DataLoader workers and
    # processes start as in a process torchrun starts, with python's default.
    multiprocessing.set_start_method(None, force=True)
    if hasattr(os, "setpgrp"):
        # A group of its own: the launcher ends the rank with its DataLoader workers and the processes it
        # started (killpg), and a terminal's Ctrl-C reaches the launcher alone, which stops the ranks.
        os.setpgrp()
    _end_with(launcher)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        # The forkserver imported torch before OMP_NUM_THREADS was set: its thread pool has a thread per core.
        torch.set_num_threads(int(threads))


def _syntax_error_site(error: BaseException) -> Optional[str]:
    """`file:line` that a SyntaxError of the user's code names: the script or a module it imports did not
    compile, so none of its frames ran, and only the error says where."""
    from dplint.finding import display_path
    from dplint.runtime.origins import user_code

    if isinstance(error, SyntaxError) and error.filename and error.lineno and user_code(error.filename):
        return f"{display_path(error.filename)}:{error.lineno}"
    return None


def _where(error: BaseException) -> str:
    from dplint.finding import display_path
    from dplint.runtime.origins import user_code

    site = _syntax_error_site(error)
    if site is not None:
        return site
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if user_code(frame.filename):
            return f"{display_path(frame.filename)}:{frame.lineno}"
    return "<unknown>"


def _caught_error(exit: SystemExit) -> Optional[BaseException]:
    """The error a wrapper caught before exiting: the first in the exit's chain (`__cause__`, else
    `__context__`), where it was raised, if that is in the user's code."""
    original = None
    error: Optional[BaseException] = exit.__cause__ or exit.__context__
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if _where(error) != "<unknown>":
            original = error
        error = error.__cause__ or error.__context__
    return original


def _print_user_traceback(error: BaseException) -> None:
    """The traceback as python would print it for the script alone: without dplint's and runpy's frames."""
    from dplint.runtime.origins import dplint_code

    shown = traceback.TracebackException.from_exception(error)
    shown.stack = traceback.StackSummary.from_list(
        [frame for frame in shown.stack if not dplint_code(frame.filename) and not frame.filename.startswith("<frozen runpy")]
    )
    sys.stderr.write("".join(shown.format()))


def _is_dataparallel_pitfall(error: BaseException) -> bool:
    runtime = sys.modules.get("dplint.runtime.dataparallel.checks")
    return runtime is not None and isinstance(error, runtime.PitfallError)


def _quiet(channel: Any, error: BaseException) -> bool:
    """Failures whose traceback says nothing: dplint's own findings, and a rank's reaction to a failed peer."""
    from dplint.runtime.distributed.errors import DistributedPitfall, PeerFailed, SetupError

    quiet = (DistributedPitfall, PeerFailed, SetupError, KeyboardInterrupt)
    return isinstance(error, quiet) or _is_dataparallel_pitfall(error) or _launcher_gone(channel.a_peer_failed)


def _launcher_gone(talk: Callable[[], Any]) -> Any:
    """`talk()` to the launcher's store; True when the store is gone (the launcher ended: this rank is
    being stopped, and has nothing left to tell)."""
    try:
        return talk()
    except (RuntimeError, OSError):  # torch's DistNetworkError and DistStoreError are RuntimeErrors
        return True


def _publish_failure(channel: Any, error: BaseException) -> None:
    from dplint.runtime.distributed.channel import error_key, site_of, state_key
    from dplint.runtime.distributed.errors import DistributedPitfall, RankFailure

    pitfall = error if isinstance(error, DistributedPitfall) else None
    where = pitfall.where if pitfall else _where(error)
    # A SyntaxError's text ends with its file and line, "(train.py, line 2)": `where` says them already.
    text = error.msg if _syntax_error_site(error) and error.msg else str(error).strip()  # type: ignore[attr-defined]
    failure = RankFailure(
        rank=channel.rank,
        kind=type(error).__name__,
        message=text.splitlines()[0] if text else "",
        where=where,
        traceback="".join(traceback.format_exception(type(error), error, error.__traceback__)),
        code=pitfall.code if pitfall else None,
        time=time.time(),
    )
    if pitfall:
        failure.message = pitfall.message
    elif _is_dataparallel_pitfall(error):  # `dplint run --devices`: a DataParallel check stopped the script
        failure.code, failure.message, failure.help = error.code, error.message, error.help  # type: ignore[attr-defined]
        finding = error.finding  # type: ignore[attr-defined]
        if finding is not None:
            failure.where = where = f"{finding.path}:{finding.location.row}"
    said = f"{failure.code} {failure.message}" if failure.code else failure.message
    channel.store.set(state_key(channel.rank), f"failed at {site_of(where)}: {failure.kind}: {said}")
    channel.store.set(error_key(channel.rank), json.dumps(asdict(failure)))


def _finish(channel: Any, checks_module: Any) -> None:
    from dplint.runtime.distributed.channel import done_key

    rank = checks_module._active
    last = f" (its last collective: {rank.last_collective})" if rank and rank.last_collective else " without any collective"
    channel.store.set(done_key(channel.rank), f"has finished its work{last}")


def _connect(settings: Dict[str, Any]) -> Any:
    from dplint.runtime.distributed.channel import Channel

    return Channel(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        float(settings["timeout"]),
    )


def run_function(environment: Dict[str, str], settings: Dict[str, Any], fn: Callable[..., Any], args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
    """The target of each process `launch` starts."""
    _become_rank(environment, settings["launcher"])
    from datetime import timedelta

    import torch.distributed as dist

    from dplint.runtime.distributed import checks
    from dplint.runtime.distributed.channel import result_key

    channel = _connect(settings)
    try:
        checks.install(channel, set(settings["checks"]), group_ready=True)
        dist.init_process_group("gloo", timeout=timedelta(seconds=float(settings["timeout"])))
        channel.joined(dist.get_world_size())
        channel.state(f"is running {getattr(fn, '__qualname__', fn)}() and has made no collective yet")
        result = fn(*args, **kwargs)
        channel.store.set(result_key(channel.rank), pickle.dumps(result))
    except BaseException as error:  # noqa: B902 - every failure is reported to the launcher, then the rank ends
        failure = checks.explained(error)
        _launcher_gone(lambda: _publish_failure(channel, failure))
        raise SystemExit(1) from None
    else:
        _finish(channel, checks)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_script(environment: Dict[str, str], settings: Dict[str, Any], target: Sequence[str]) -> None:
    """A rank of `dplint run`: run the script (or `-m` module) as `__main__`, as python does under torchrun."""
    _become_rank(environment, settings["launcher"])
    if settings.get("prints_to_stderr"):
        # At the descriptor: print(), C code and the processes the script starts all write to stderr.
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    from dplint.runtime.distributed import checks

    channel = _connect(settings)
    status = 0
    try:
        checks.install(channel, set(settings["checks"]), gpus=settings["gpus"], dataparallel=bool(settings.get("dataparallel")))
        if settings.get("dataparallel"):
            # One process, as `python train.py` runs it: no torchrun variables, so the script takes its own path.
            for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE",
                         "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
                         "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS"):  # fmt: skip
                os.environ.pop(name, None)
        channel.state(f"is running {' '.join(target)} and has made no collective yet")
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(target[0])
            sys.argv = list(target)
            sys.path[0] = os.path.dirname(script)  # the script's folder first: its sibling modules import
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        status = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        if status:
            caught = _caught_error(exit)
            # A wrapper (`except Exception: sys.exit(1)`, hydra, fire) caught the error: its line is the user's, not the exit's.
            failure = caught or SystemExit(f"the script exited with status {status}").with_traceback(exit.__traceback__)
            _launcher_gone(lambda: _publish_failure(channel, failure))
    except BaseException as error:  # noqa: B902 - every failure is reported to the launcher
        failure = checks.explained(error)
        if not _quiet(channel, failure):
            _print_user_traceback(failure)
        _launcher_gone(lambda: _publish_failure(channel, failure))
        status = 1
    if status == 0:
        _launcher_gone(lambda: _finish(channel, checks))
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(status)
