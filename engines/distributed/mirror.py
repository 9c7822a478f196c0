"""The batch's KV caches, mirrored on every rank: rank 0 records each cache op, a follower
replays them on caches of its own (its shard of the heads), in the same order.

Rank 0's `MirroredCache` is a BatchCache that also writes down what was done to it (a new
cache, settle, rollback, select, compact, append_rows, clone, dropped). The ops wait in the
`OpLog` and ride with the next forward in one message (bus.py): a follower needs them only
before its next forward, and a step then costs one broadcast, not one per op.

A forward is the one op that needs every rank at once: the sharded layers all_sum their
partial outputs. Rank 0 evaluates it at once (so the collectives run now, in this order, and
no later `mx.eval` of the engine can start one that the followers would not join), and the
follower evaluates the same arrays: the logits of a forward whose logits are read (a verify, a
first token), or only the KV of a prefill chunk (its logits are never computed: the last
layer's all_sum then runs on no rank)."""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from engines.batch.cache import BatchCache

# op codes: [op, cache id, n, *n ints]; the D ops change the draft model's batch on every rank
# (--drafter-on every-rank, drafting.py)
NEW, DROP, SETTLE, ROLLBACK, SELECT, COMPACT, APPEND, CLONE, FORWARD, HEARTBEAT, STOP, TIMES = range(12)
DJOIN, DLEAVE, DROLLBACK, DPROPOSE = range(12, 16)
LOGITS, KV_ONLY = 0, 1  # what a forward evaluates


@dataclass
class OpLog:
    """Rank 0's cache ops not yet sent, and the ids of its caches."""

    ops: list[int] = field(default_factory=list)
    next_id: int = 0

    def add(self, op: int, cache_id: int, *args: int) -> None:
        self.ops += [op, cache_id, len(args), *args]

    def take(self) -> list[int]:
        ops, self.ops = self.ops, []
        return ops

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id


class MirroredCache(BatchCache):
    """Rank 0's BatchCache: every op is also written to the log for the followers."""

    def __init__(self, model: Any, rows: int, log: OpLog):
        super().__init__(model, rows)
        self.log, self.id = log, log.new_id()
        log.add(NEW, self.id, rows)
        # When rank 0 lets go of a cache, the followers drop theirs (the finalizer holds no
        # reference to the cache itself).
        weakref.finalize(self, log.add, DROP, self.id)

    def settle(self, kept: list[int]) -> None:
        self.log.add(SETTLE, self.id, *kept)
        super().settle(kept)

    def rollback(self, counts: list[int]) -> None:
        self.log.add(ROLLBACK, self.id, *counts)
        super().rollback(counts)

    def select(self, rows: list[int]) -> None:
        self.log.add(SELECT, self.id, *rows)
        super().select(rows)

    def compact_if_sparse(self, share: float = 0.25, min_slots: int = 64) -> None:
        """Rank 0 decides (the same rule as BatchCache's); the followers are told which tables."""
        chosen = [i for i, t in enumerate(self.tables)
                  if (free := t.reclaimable()) >= min_slots and free >= share * t.size]
        if chosen:
            self.log.add(COMPACT, self.id, *chosen)
            for i in chosen:
                self.tables[i].compact()

    def append_rows(self, other: "MirroredCache") -> None:
        self.log.add(APPEND, self.id, other.id)
        super().append_rows(other)

    def clone(self, model: Any) -> "MirroredCache":
        copy = BatchCache.clone(self, model)  # a plain cache: adopt it without logging a NEW
        twin = MirroredCache.__new__(MirroredCache)
        twin.__dict__.update(copy.__dict__)
        twin.log, twin.id = self.log, self.log.new_id()
        self.log.add(CLONE, self.id, twin.id)
        weakref.finalize(twin, self.log.add, DROP, twin.id)
        return twin


def forward_op(log: OpLog, cache: MirroredCache, tokens: list[list[int]], evaluate: int, check: bool) -> list[int]:
    """The message for one forward: the pending cache ops, then the forward itself."""
    width = len(tokens[0])
    log.add(FORWARD, cache.id, evaluate, int(check), width, *[t for row in tokens for t in row])
    return log.take()


def run_forward(model: Any, cache: BatchCache, tokens: mx.array, evaluate: int) -> mx.array:
    """One forward of the sharded target, evaluated now (see the module's docstring)."""
    cache.begin(tokens.shape[1])
    logits = model(tokens, cache=cache.layers)
    mx.eval(cache.arrays() if evaluate == KV_ONLY else logits)
    return logits


def checksum(logits: mx.array) -> int:
    """The divergence check's digest of a forward: its argmax at every position, weighted by
    position (a swapped pair changes it)."""
    top = mx.argmax(logits, axis=-1).astype(mx.int64).reshape(-1)
    weights = mx.arange(1, top.size + 1, dtype=mx.int64)
    return int(mx.sum(top * weights).item()) % (2**61 - 1)


@dataclass
class Forward:
    """A forward a follower must run (in message order)."""

    cache: BatchCache
    tokens: mx.array
    evaluate: int
    check: bool


@dataclass
class Replica:
    """A follower's copies of rank 0's caches, by id (and of its draft model's batch, with
    --drafter-on every-rank: drafting.DrafterReplica)."""

    model: Any
    drafter: Any = None
    caches: dict[int, BatchCache] = field(default_factory=dict)
    stopped: bool = False
    times_asked: bool = False  # rank 0 gathers every rank's times after this message's forward
    op_counts: Counter = field(default_factory=Counter)  # ops replayed, by code (what a test can ask)

    def apply(self, ints: list[int]) -> list[Forward]:
        """Replays a message's cache ops; returns its forwards for the caller to run, in
        order (a message carries at most one, last)."""
        forwards = []
        i = 0
        while i < len(ints):
            op, cid, n = ints[i:i + 3]
            args = ints[i + 3:i + 3 + n]
            i += 3 + n
            self.op_counts[op] += 1
            if op == NEW:
                self.caches[cid] = BatchCache(self.model, args[0])
            elif op == DROP:
                self.caches.pop(cid, None)
            elif op == SETTLE:
                self.caches[cid].settle(args)
            elif op == ROLLBACK:
                self.caches[cid].rollback(args)
            elif op == SELECT:
                self.caches[cid].select(args)
            elif op == COMPACT:
                for t in args:
                    self.caches[cid].tables[t].compact()
            elif op == APPEND:
                self.caches[cid].append_rows(self.caches[args[0]])
            elif op == CLONE:
                self.caches[args[0]] = self.caches[cid].clone(self.model)
            elif op == FORWARD:
                evaluate, check, width = args[:3]
                flat = args[3:]
                tokens = mx.array(flat, dtype=mx.uint32).reshape(len(flat) // width, width)
                if self.drafter is not None:  # this rank drafted too: its drafts must be these rows'
                    self.drafter.check([flat[i:i + width] for i in range(0, len(flat), width)])
                forwards.append(Forward(self.caches[cid], tokens, evaluate, bool(check)))
            elif op in (DJOIN, DLEAVE, DROLLBACK, DPROPOSE):
                self.drafter.replay(op, args)
            elif op == STOP:
                self.stopped = True
            elif op == TIMES:
                self.times_asked = True
            elif op != HEARTBEAT:
                raise ValueError(f"unknown op {op} from rank 0")
        return forwards
