"""A draft model on every rank (`serve --drafter-on every-rank`, the mlx-lm plan's "option B"),
against the default, rank 0 drafting alone and its drafts riding in the forward's message
("option A"; engine.py).

Every rank loads the draft model whole and keeps a batch of it (engines/batch/drafter.py) row
for row like rank 0's. A follower cannot know a row's next drafter input by itself -- the
target's token of the last round is sampled on rank 0 only (a follower never samples) -- so
rank 0 writes down what changes its drafter (a row joins with its context, leaves, rolls back
over rejected drafts) and, before it drafts, sends each asked row's pending tokens, k and RNG
key in a message of its own: then every rank drafts at once, each on its own cores. This is the
one extra message per drafting step option B costs here.

The drafts still travel in the forward's own message, as under option A: a message is a fixed
1024 int32 whatever it holds (bus.py), so leaving them out would save nothing, and keeping them
keeps one forward format and lets each follower check its own drafts against rank 0's at no
cost -- a difference is a divergence, said in one line, and the job ends (rank 0 answers 503).

An MTP drafter (the Gemma 4 assistant, one trained here) cannot be replicated: it reads the
target's K/V and final hidden state, which only rank 0 holds in a pipeline (and tensor
parallel splits over the ranks); the server refuses `--drafter-on every-rank` for it at start.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

import mlx.core as mx

from engines.batch.drafter import BatchDrafter, DraftRow
from engines.distributed.mirror import DJOIN, DLEAVE, DPROPOSE, DROLLBACK, OpLog
from engines.speculative.proposer import Context
from engines.types import Sampling

RANK0, EVERY_RANK = "rank0", "every-rank"  # --drafter-on


class DraftsDiffer(RuntimeError):
    """A follower's own drafts are not rank 0's: the ranks diverged."""


# -- ints on the wire ---------------------------------------------------------------------------
def sampling_ints(s: Sampling) -> list[int]:
    """A row's sampling flags, exactly (float64 bits as int32 pairs): its T>0 drafts depend on them."""
    return [*struct.unpack("<6i", struct.pack("<3d", s.temperature, s.top_p, s.min_p)), s.top_k]


def ints_sampling(ints: list[int]) -> Sampling:
    temperature, top_p, min_p = struct.unpack("<3d", struct.pack("<6i", *ints[:6]))
    return Sampling(temperature=temperature, top_p=top_p, top_k=ints[6], min_p=min_p)


SAMPLING_INTS = 7


def key_ints(key: mx.array | None) -> list[int]:
    """[1, lo, hi] for a row's RNG key of this step (two uint32 as int32), [0, 0, 0] for none (T=0)."""
    if key is None:
        return [0, 0, 0]
    return [1, *[v - 2**32 if v >= 2**31 else v for v in key.tolist()]]


def ints_key(ints: list[int]) -> mx.array | None:
    return mx.array([v % 2**32 for v in ints[1:3]], dtype=mx.uint32) if ints[0] else None


# -- rank 0 -------------------------------------------------------------------------------------
@dataclass
class MirroredDrafter(BatchDrafter):
    """Rank 0's batch of the draft model under option B: every change to its rows is also
    written to the op log, for the followers' copies (DrafterReplica)."""

    log: OpLog | None = None

    def join(self, row: DraftRow) -> None:
        self.log.add(DJOIN, 0, *sampling_ints(row.ctx.sampling), *row.ctx.tokens[:-1])
        super().join(row)

    def leave(self, row: DraftRow) -> None:
        if row in self.rows:
            self.log.add(DLEAVE, 0, self.rows.index(row))
        super().leave(row)

    def rollback(self, row: DraftRow, n: int) -> None:
        self.log.add(DROLLBACK, 0, self.rows.index(row), n)
        super().rollback(row, n)

    def announce(self, asks: list[tuple[DraftRow, int, mx.array | None]], places: list[int]) -> None:
        """Log what the followers need to draft this step as rank 0 is about to: per asked row,
        its drafter row, its row in the target's forward (`places`: where its drafts will be
        checked), k, its RNG key, and its pending tokens (what BatchDrafter.propose feeds)."""
        ints: list[int] = []
        for (row, k, key), place in zip(asks, places):
            pending = row.ctx.tokens[row.cached:]
            ints += [self.rows.index(row), place, k, *key_ints(key), len(pending), *pending]
        self.log.add(DPROPOSE, 0, *ints)


# -- a follower ---------------------------------------------------------------------------------
@dataclass
class DrafterReplica:
    """A follower's batch of the draft model: rank 0's drafter ops replayed on a BatchDrafter of
    its own (the same code, the same inputs, so the same drafts), and its drafts checked against
    the rows of the forward that follows."""

    drafter: BatchDrafter
    expected: dict[int, list[int]] = field(default_factory=dict)  # forward row -> this rank's drafts for it
    draft_s: float = 0.0  # seconds drafting (as rank 0 counts its own: a join's prompt read is not counted)
    drafted: int = 0  # draft tokens made here, each found equal to rank 0's

    def replay(self, op: int, args: list[int]) -> None:
        rows = self.drafter.rows
        if op == DJOIN:
            body = args[SAMPLING_INTS:]
            row = self.drafter.row()
            row.ctx = Context(body + [0], ints_sampling(args[:SAMPLING_INTS]))  # join reads tokens[:-1]
            self.drafter.join(row)
            row.ctx.tokens = body  # what the row's cache holds; its first propose brings the rest
        elif op == DLEAVE:
            self.drafter.leave(rows[args[0]])
        elif op == DROLLBACK:
            row, n = rows[args[0]], args[1]
            self.drafter.rollback(row, n)
            row.cached -= n
            row.ctx.tokens = row.ctx.tokens[:row.cached]
        elif op == DPROPOSE:
            t0 = time.perf_counter()
            self._propose(args)
            self.draft_s += time.perf_counter() - t0

    def _propose(self, args: list[int]) -> None:
        asks, places, i = [], [], 0
        while i < len(args):
            index, place, k = args[i:i + 3]
            key = ints_key(args[i + 3:i + 6])
            n = args[i + 6]
            pending = args[i + 7:i + 7 + n]
            i += 7 + n
            row = self.drafter.rows[index]
            row.ctx.tokens = row.ctx.tokens[:row.cached] + pending
            asks.append((row, k, key))
            places.append(place)
        try:
            drafts = self.drafter.propose(asks)
        except Exception:  # rank 0's drafter failed alike: it stops these rows speculating, and its leaves follow
            self.expected = {}
            return
        self.expected = {}
        for (row, k, _), place, draft in zip(asks, places, drafts):
            mine = draft.tokens.tolist()
            row.ctx.tokens = row.ctx.tokens + mine[:k - 1]  # what the row's cache now holds, as on rank 0
            self.expected[place] = mine

    def check(self, rows: list[list[int]]) -> None:
        """The forward after a drafting step: each drafted row must carry exactly this rank's drafts."""
        for place, mine in self.expected.items():
            theirs = rows[place][1:1 + len(mine)]
            if theirs != mine:
                raise DraftsDiffer(f"its own drafts {mine} for row {place} are not rank 0's {theirs}")
            self.drafted += len(mine)
        self.expected = {}
