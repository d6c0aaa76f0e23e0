"""The side channel between the ranks and the launcher: the launcher's TCPStore, with `dplint/` keys.

It is the store the default process group rendezvouses on (torchrun's agent-store layout), reached
through a client connection of its own. Writes (`set`, `append`) do not wait for a reply, so
publishing an event costs one send; reads happen only where a rank must compare with its peers
(a collective's fingerprint) and in the launcher after the run. No collective is ever issued on it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional

from dplint.runtime.origins import installed_code, user_code

PREFIX = "dplint/"


def state_key(rank: int) -> str:
    return f"{PREFIX}state/{rank}"


def events_key(rank: int) -> str:
    return f"{PREFIX}events/{rank}"


def error_key(rank: int) -> str:
    return f"{PREFIX}error/{rank}"


def result_key(rank: int) -> str:
    return f"{PREFIX}result/{rank}"


def done_key(rank: int) -> str:
    return f"{PREFIX}done/{rank}"


def collective_key(seq: int, rank: int) -> str:
    return f"{PREFIX}collective/{seq}/{rank}"


def joined_key(rank: int) -> str:
    return f"{PREFIX}joined/{rank}"


def sites_key(rank: int) -> str:
    return f"{PREFIX}sites/{rank}"


def _user_frame(frame: Any) -> Any:
    while frame is not None and not user_code(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _site(frame: Any) -> str:
    return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else "<unknown>"


def user_site(depth: int = 2) -> str:
    """`file:line` of the innermost caller outside torch and dplint (the user's code)."""
    return _site(_user_frame(sys._getframe(depth)))


_SAVE_HELPER = ("save", "checkpoint", "ckpt")


def guard_site(depth: int = 2) -> str:
    """Where a rank guard for this save goes: the user's line, or, when that line is inside a function named
    for saving (`save_checkpoint`), its caller's, outward: a save helper saves whenever it is called."""
    frame = _user_frame(sys._getframe(depth))
    while frame is not None and any(word in frame.f_code.co_name.lower() for word in _SAVE_HELPER):
        caller = _user_frame(frame.f_back)
        if caller is None or installed_code(caller.f_code.co_filename):
            break
        frame = caller
    return _site(frame)


def display_path(filename: str) -> str:
    cwd = os.getcwd() + os.sep
    return filename[len(cwd):] if filename.startswith(cwd) else filename


class Channel:
    """One rank's end of the side channel."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout: float) -> None:
        from torch.distributed import TCPStore

        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(timeout, 5.0)))
        self.peers = [r for r in range(world_size) if r != rank]

    def state(self, text: str) -> None:
        self.store.set(state_key(self.rank), text)

    def event(self, kind: str, **data: Any) -> None:
        data["kind"] = kind
        self.store.append(events_key(self.rank), json.dumps(data, separators=(",", ":")) + "\n")

    def finding(self, code: str, message: str, where: str) -> None:
        self.event("finding", code=code, message=message, where=where)

    def joined(self, world_size: int) -> None:
        """This rank is in a process group of `world_size`: the launcher says "clean" only when all N are.
        It then waits until every rank of the group is in it: gloo connects the ranks pairwise, and a
        rank that finished early and destroyed its group would close a connection a slower rank is still
        opening ("Connection closed by peer" during init)."""
        self.store.set(joined_key(self.rank), str(world_size))
        if world_size == self.world_size:
            self.store.wait([joined_key(rank) for rank in range(world_size)])

    def reached(self, where: str) -> None:
        """A collective call site this rank reached for the first time (which ranks reached a site names the odd one in a mismatch)."""
        self.store.append(sites_key(self.rank), where + "\n")

    def sites(self, rank: int) -> List[str]:
        key = sites_key(rank)
        return self.store.get(key).decode().splitlines() if self.store.check([key]) else []

    def peer_state(self, rank: int) -> str:
        if self.store.check([done_key(rank)]):
            return self.store.get(done_key(rank)).decode()
        if self.store.check([state_key(rank)]):
            return self.store.get(state_key(rank)).decode()
        return "has not started its work yet"

    def exchange(self, seq: int, fingerprint: Dict[str, str]) -> Dict[int, Optional[Dict[str, str]]]:
        """Publish this rank's fingerprint of collective `seq`; return every peer's (None: never came)."""
        self.store.set(collective_key(seq, self.rank), json.dumps(fingerprint))
        keys = [collective_key(seq, r) for r in self.peers]
        deadline = time.monotonic() + self.timeout
        delay = 0.0002
        while not self.store.check(keys):
            if time.monotonic() > deadline or any(self._ended(r) for r in self.peers):
                # Peers that arrived meanwhile still count; the others are reported with their state.
                return {r: self._fingerprint(seq, r) for r in self.peers}
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        values = self.store.multi_get(keys)
        return {r: json.loads(value) for r, value in zip(self.peers, values)}

    def _ended(self, rank: int) -> bool:
        return self.store.check([done_key(rank)]) or self.store.check([error_key(rank)])

    def failed(self, rank: int) -> bool:
        return self.store.check([error_key(rank)])

    def a_peer_failed(self) -> bool:
        return any(self.failed(r) for r in self.peers)

    def _fingerprint(self, seq: int, rank: int) -> Optional[Dict[str, str]]:
        key = collective_key(seq, rank)
        return json.loads(self.store.get(key)) if self.store.check([key]) else None


def read_events(store: Any, rank: int) -> List[Dict[str, Any]]:
    key = events_key(rank)
    if not store.check([key]):
        return []
    return [json.loads(line) for line in store.get(key).decode().splitlines() if line]


def read_text(store: Any, key: str) -> Optional[str]:
    return store.get(key).decode() if store.check([key]) else None
