"""The side channel between the ranks and the launcher: the launcher's TCPStore, with `dplint/` keys.

It is the store the default process group rendezvouses on (torchrun's agent-store layout), reached
through a client connection of its own. Writes (`set`, `append`) do not wait for a reply, so
publishing an event costs one send; reads happen only where a rank must compare with its peers
(a collective's fingerprint) and in the launcher after the run. No collective is ever issued on it.
"""

from __future__ import annotations

import itertools
import json
import linecache
import sys
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional

from dplint.finding import display_path
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
    """The innermost frame of the user's own code: outside torch, dplint and Python, and outside the
    installed packages where one calls them (`accelerator.wait_for_everyone()` in the script, not the
    barrier inside Accelerate); an installed package's frame where no other calls it."""
    installed = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if user_code(filename):
            if not installed_code(filename):
                return frame
            installed = installed or frame
        frame = frame.f_back
    return installed


def frame_spot(frame: Any) -> str:
    """`file:line:column` where the expression the frame is running starts (its call into torch or dplint):
    where a static rule puts a finding on the same code. Before Python 3.11, which keeps no columns, the
    line's first non-blank column."""
    if frame is None:
        return "<unknown>"
    filename, line, offset = frame.f_code.co_filename, frame.f_lineno, None
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is not None:  # one entry per 2-byte code unit, as `f_lasti` counts
        start_line, _, start, _ = next(itertools.islice(positions(), frame.f_lasti // 2, None), (None, None, None, None))
        if start_line is not None and start is not None:
            line, offset = start_line, start
    text = linecache.getline(filename, line)
    # Python counts the column in UTF-8 bytes; a finding's column counts characters.
    column = len(text.encode("utf-8")[:offset].decode("utf-8", "replace")) if offset is not None else len(text) - len(text.lstrip())
    return f"{display_path(filename)}:{line}:{column + 1}"


def site_of(spot: str) -> str:
    """`file:line` of a `file:line:column` spot, as the ranks' texts name a place; any other place as it is."""
    head, _, last = spot.rpartition(":")
    return head if last.isdigit() and head.rpartition(":")[2].isdigit() else spot


def user_site(depth: int = 2) -> str:
    """`file:line:column` of the innermost caller outside torch and dplint (the user's code): the start of
    its call into them."""
    return frame_spot(_user_frame(sys._getframe(depth)))


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
    return frame_spot(frame)


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
