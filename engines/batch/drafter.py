"""A draft model for the whole batch: every sequence that drafts with the same draft model
drafts in the same forwards (one ragged forward of each row's pending tokens, then one
one-token forward per draft position), with its own rows in a slot-table cache
(engines/batch/cache.py), so each rolls back on its own like the target's.

Per row: the cache holds the row's accepted
tokens but the last (which the next round feeds); drafts are the argmax at T=0 (a point mass)
and a sample of the draft model's own target_probs at T>0 on the sequence's own RNG key, q
returned for rejection sampling. A row that drafts fewer than the longest row's k still runs
the later positions (the forward is shared); those slots die at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from engines.batch.cache import BatchCache
from engines.speculative.proposer import EMPTY, Context, Draft
from engines.mlx_chat.sampling import draft_rows


@dataclass(eq=False)
class DraftRow:
    """The proposer a sequence holds: its row in the shared drafter. The batch loop drafts for
    all rows at once (BatchDrafter.propose); start and commit keep the row's cache in step."""

    drafter: "BatchDrafter"
    ctx: Context | None = None
    cached: int = 0  # how many of ctx.tokens the row's cache holds
    drafted: int = 0  # drafts of the last round still in the cache (all but the last draft)
    name: str = "draft"
    needs_hidden: bool = False

    @property
    def group(self) -> "BatchDrafter":
        return self.drafter

    def start(self, ctx: Context) -> None:
        self.ctx = ctx
        self.drafter.join(self)

    def propose(self, ctx: Context, k: int) -> Draft:  # the batch drafts all rows at once
        return self.drafter.propose([(self, k, None)])[0]

    def commit(self, ctx: Context) -> None:
        """Keep exactly the accepted prefix: the round's rejected drafts leave the row's cache."""
        self.ctx = ctx
        committed = len(ctx.tokens) - 1  # tokens[-1] is fed next round
        if self.cached > committed:
            self.drafter.rollback(self, self.cached - committed)
            self.cached = committed

    def leave(self) -> None:
        self.drafter.leave(self)


@dataclass
class BatchDrafter:
    model: Any
    rows: list[DraftRow] = field(default_factory=list)  # in cache row order
    cache: BatchCache | None = None

    def row(self) -> DraftRow:
        return DraftRow(self)

    def join(self, row: DraftRow) -> None:
        """Read the row's context (all but its last token) into a cache of its own, then append
        it below the others."""
        own = BatchCache(self.model, 1)
        body = row.ctx.tokens[:-1]
        if body:
            own.begin(len(body))
            self.model(mx.array([body], dtype=mx.uint32), cache=own.layers)
            own.settle([len(body)])
            mx.eval(own.arrays())
        row.cached = len(body)
        if self.cache is None:
            self.cache = own
        else:
            self.cache.append_rows(own)
        self.rows.append(row)

    def leave(self, row: DraftRow) -> None:
        if row not in self.rows:
            return
        keep = [i for i, r in enumerate(self.rows) if r is not row]
        self.rows = [self.rows[i] for i in keep]
        if self.rows:
            self.cache.select(keep)
        else:
            self.cache = None

    def rollback(self, row: DraftRow, n: int) -> None:
        counts = [n if r is row else 0 for r in self.rows]
        self.cache.rollback(counts)

    def propose_rows(self, target_cache, asks: list) -> list[Draft]:
        """The DraftGroup protocol (engines/speculative/proposer.py): (row, sequence, k, key)."""
        return self.propose([(seq.proposer, k, key) for _, seq, k, key in asks])

    def propose(self, asks: list[tuple[DraftRow, int, mx.array | None]]) -> list[Draft]:
        """Drafts for several rows at once: (row, k, RNG key or None). Rows not asked this step
        feed nothing and their slots die at once."""
        asked = {id(r): (k, key) for r, k, key in asks if k > 0}
        if not asked:
            return [EMPTY for _ in asks]
        pending = [r.ctx.tokens[r.cached:] if id(r) in asked else [] for r in self.rows]
        width = max(len(p) for p in pending)
        padded = [p + [0] * (width - len(p)) if p else [0] * width for p in pending]
        self.cache.begin(width)
        logits = self.model(mx.array(padded, dtype=mx.uint32), cache=self.cache.layers)
        self.cache.settle([len(p) for p in pending])
        last = mx.array([max(len(p) - 1, 0) for p in pending])
        logits = logits[mx.arange(len(self.rows)), last]  # [B, V]: after each row's last fed token
        k_max = max(k for k, _ in asked.values())
        tokens, qs = [], []
        for i in range(k_max):
            y, q = self._pick(logits, asked, i)
            tokens.append(y)
            qs.append(q)
            if i < k_max - 1:  # the last draft is fed next round, only if it is accepted
                self.cache.begin(1)
                logits = self.model(y[:, None].astype(mx.uint32), cache=self.cache.layers)[:, -1]
                self.cache.settle([1 if id(r) in asked and i < asked[id(r)][0] - 1 else 0 for r in self.rows])
        drafts = mx.stack(tokens, axis=1)  # [B, k_max]
        mx.eval(drafts, *[q for q in qs if q is not None])
        out = []
        for r, k, _ in asks:
            if k <= 0:
                out.append(EMPTY)
                continue
            b = self.rows.index(r)
            r.cached = len(r.ctx.tokens) + k - 1
            q = mx.stack([qs[i][b] for i in range(k)]) if qs[0] is not None else None
            out.append(Draft(drafts[b, :k].astype(mx.uint32), q))
        return out

    def _pick(self, logits: mx.array, asked: dict, position: int) -> tuple[mx.array, mx.array | None]:
        return draft_rows(logits, [r.ctx.sampling for r in self.rows],
                          [asked.get(id(r), (0, None))[1] for r in self.rows], position)
