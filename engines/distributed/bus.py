"""Rank 0's word to the other ranks, over MLX's own collectives, with no wait left unbounded.

A broadcast is an `all_sum` to which the followers contribute zeros: rank 0's ints arrive
unchanged on every rank (integer sums are exact). One message is a fixed-size int32 buffer
(`INLINE` ints: its length, then the ops); a message longer than that (a prefill chunk)
follows as a second all_sum of exactly its length, which the followers read from the first.
So a decode step of a few rows costs one collective of 4 KB, whatever its drafts.

The ring backend raises "connection to a peer was lost" when a rank dies; a rank that hangs
(stopped, swapping, a cable pulled) would make every collective wait forever, so each one runs
under a `Watchdog`: past its deadline the rank gives up, says which rank it waited for, and
exits (the server first answers its requests 503)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx

from engines.types import EngineError

INLINE = 1024  # ints per message buffer: a decode step of 64 rows x 15 tokens fits
DEFAULT_TIMEOUT_S = 30.0  # longest a collective may take before a rank is declared lost


LOSS_SETTLE_S = 1.0  # how long describe_loss waits for a lost local rank's process to show its state


class RankLost(EngineError):
    """A rank died or stopped answering: the distributed target cannot go on."""


@dataclass
class Peer:
    """Who a rank is, told to every rank at start (to name a lost one)."""

    rank: int
    host: int  # crc32 of the host name: "same machine as me?"
    pid: int

    def state(self, here: int) -> str | None:
        """What this machine can see of the peer: 'exited', 'stopped', or None (running, or
        on another machine)."""
        if self.host != here:
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return "exited"
        except PermissionError:
            return None
        try:
            with open(f"/proc/{self.pid}/stat") as f:  # Linux: 'T' = stopped, 'Z' = exited
                status = f.read().rsplit(")", 1)[1].split()[0]
            return {"T": "stopped", "t": "stopped", "Z": "exited"}.get(status)
        except (OSError, IndexError):
            return None


def host_id() -> int:
    return zlib.crc32(socket.gethostname().encode())


@dataclass
class RankTimes:
    """A rank's running totals: forwards run, seconds computing them (the sharded layers' own
    all_sums included: they run inside the forward), seconds waiting for rank 0's messages (on
    rank 0: sending them, i.e. waiting for the slowest follower), seconds drafting with the draft
    model and the draft tokens it made (rank 0's; a follower's with --drafter-on every-rank)."""

    forwards: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    draft_s: float = 0.0
    drafted: int = 0


@dataclass
class Watchdog:
    """Bounds every wait on the other ranks. `arm(what)` before a collective (or a step made of
    them), `disarm()` after; a wait past `timeout_s` calls `on_expired(what)` from the
    watchdog's own thread (the waiting thread is stuck in the collective and cannot)."""

    timeout_s: float
    on_expired: Callable[[str], None]
    deadline: float | None = None
    what: str = ""
    _thread: threading.Thread | None = None

    def start(self) -> "Watchdog":
        self._thread = threading.Thread(target=self._watch, name="specscope-rank-watchdog", daemon=True)
        self._thread.start()
        return self

    def arm(self, what: str) -> None:
        self.what, self.deadline = what, time.monotonic() + self.timeout_s

    def disarm(self) -> None:
        self.deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline:
                self.deadline = None
                self.on_expired(self.what)
                return


@dataclass
class Bus:
    """The group, who is in it, and broadcasts from rank 0."""

    group: mx.distributed.Group
    peers: list[Peer] = field(default_factory=list)
    sent: int = 0  # messages, and seconds spent in them (the broadcast's share of a step)
    comm_s: float = 0.0

    @classmethod
    def join(cls, group: mx.distributed.Group) -> "Bus":
        """Every rank tells every other who it is (one all_gather)."""
        me = mx.array([group.rank(), host_id() - 2**31, os.getpid()], dtype=mx.int64)
        everyone = mx.distributed.all_gather(me[None], group=group, stream=mx.cpu)
        mx.eval(everyone)
        peers = [Peer(int(r), int(h) + 2**31, int(p)) for r, h, p in everyone.tolist()]
        return cls(group, peers)

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def send(self, ints: list[int]) -> None:
        """Rank 0: broadcast `ints` to every follower."""
        t0 = time.perf_counter()
        head = [len(ints), *ints[:INLINE - 1]]
        self._sum(head + [0] * (INLINE - len(head)))
        if len(ints) > INLINE - 1:
            self._sum(ints)
        self.sent += 1
        self.comm_s += time.perf_counter() - t0

    def receive(self) -> list[int]:
        """A follower: the next message rank 0 sends."""
        t0 = time.perf_counter()
        head = self._sum([0] * INLINE)
        n = head[0]
        ints = head[1:1 + n] if n <= INLINE - 1 else self._sum([0] * n)
        self.comm_s += time.perf_counter() - t0
        return ints

    def _sum(self, ints: list[int]) -> list[int]:
        out = mx.distributed.all_sum(mx.array(ints, dtype=mx.int32), group=self.group, stream=mx.cpu)
        mx.eval(out)
        return out.tolist()

    def same_on_every_rank(self, value: int) -> bool:
        """The divergence check: every rank offers a checksum; all must be rank 0's."""
        got = mx.distributed.all_gather(mx.array([value], dtype=mx.int64), group=self.group, stream=mx.cpu)
        mx.eval(got)
        return len(set(got.tolist())) == 1

    def end_local_peers(self) -> None:
        """The job is over: the other ranks on this machine are killed (SIGKILL: a stopped rank
        would hold a SIGTERM until continued, and mlx.launch waits for it forever)."""
        here = host_id()
        for p in self.peers:
            if p.rank != self.rank and p.host == here:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def gather_times(self, mine: "RankTimes") -> list["RankTimes"]:
        """Every rank's running totals, on every rank (one all_gather)."""
        row = mx.array([[mine.forwards, mine.compute_s, mine.wait_s, mine.draft_s, mine.drafted]], dtype=mx.float32)
        everyone = mx.distributed.all_gather(row, group=self.group, stream=mx.cpu)
        mx.eval(everyone)
        return [RankTimes(int(f), c, w, d, int(n)) for f, c, w, d, n in everyone.tolist()]

    def describe_loss(self, waited_s: float | None = None) -> str:
        """One line naming the rank(s) lost, as well as this machine can tell."""
        here = host_id()
        others = [p for p in self.peers if p.rank != self.rank]
        seen = [(p, p.state(here)) for p in others]
        # A killed rank's sockets close while its process is still being torn down: the ring can
        # report the loss a few milliseconds before /proc shows the process exited. Look again
        # for up to a second (this runs once, as the server goes down).
        deadline = time.monotonic() + LOSS_SETTLE_S
        while waited_s is None and not any(state for _, state in seen) and time.monotonic() < deadline:
            time.sleep(0.02)
            seen = [(p, p.state(here)) for p in others]
        known = [f"rank {p.rank} (pid {p.pid}) {state}" for p, state in seen if state]
        if known:
            return "; ".join(known)
        names = ", ".join(str(p.rank) for p in others)
        if waited_s is not None:
            return f"rank {names} did not answer within {waited_s:.0f} s"
        return f"lost the connection to rank {names}"
