"""MTP drafting for the whole batch: every sequence that drafts with the same MTP drafter (the
Gemma 4 assistant, or a drafter trained here) chains its drafts in the same drafter forwards,
each row reading its own row of the batch's target K/V.

Per row: a chain starts from the row's last accepted token (not yet in the target's cache), the
target's final hidden state that produced it (ctx.hidden: the batch loop keeps it from the
accepted position), and the target's K/V before that token; the query position stays that
token's for every chained step. Which K/V a row sees comes from the slot table
(engines/batch/cache.py): its live slots -- a rejected draft's slot is dead -- and, for a
sliding layer, the positions the last kept token attended to (the last `sliding_window` ones:
BatchMTP.view says why). Drafts are the argmax at T=0, and at T>0 a sample of the drafter's q
on the row's own RNG key.

The drafter keeps no cache, so nothing here rolls back: the batch's settle does, for the K/V
the drafter reads. A step launched before the last one's verdict is read (engines/batch/engine.py,
`_launch_ahead`) chains from that verdict still in the graph -- its token, the hidden state at
its accepted position, the position after it -- over K/V whose last slots are live by the lazy
count (SlotTable.defer): the chain is queued behind the verify it depends on, unevaluated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import mlx.core as mx

from engines.types import EngineError
from engines.batch.cache import DEAD, BatchCache
from engines.mlx_chat.proposers import LazyVerdict
from engines.speculative.proposer import Context, Draft
from engines.mlx_chat.sampling import draft_rows


@dataclass(eq=False)
class MTPRow:
    """The proposer an MTP sequence holds: its place among the batch's MTP rows. The batch
    loop drafts for all of them at once (BatchMTP.propose); the loop keeps ctx.hidden."""

    drafter: "BatchMTP"
    name: str = "mtp"
    needs_hidden: bool = True

    @property
    def group(self) -> "BatchMTP":
        return self.drafter

    def start(self, ctx: Context) -> None:
        if ctx.hidden is None:
            raise EngineError("MTP needs the target's hidden state; the batch loop did not provide it")

    def propose(self, ctx: Context, k: int) -> Draft:
        raise EngineError("an MTP row drafts with its batch (BatchMTP.propose), not on its own")

    def commit(self, ctx: Context) -> None:
        pass  # no cache of its own: the target's rollback is the drafter's

    def target_forward(self, tokens: mx.array, cache: list) -> tuple[mx.array, mx.array]:
        return self.drafter.target.forward(tokens, cache)


@dataclass
class BatchMTP:
    """One MTP drafter and the target view it reads (mtp.Gemma4Target or drafter.TargetView),
    made from a request's mtp.MtpSource."""

    drafter: Any
    target: Any
    step: Callable  # the drafter's step (compiled unless the engine's mtp_options.compiled is off), rows at once

    def made_from(self, source) -> bool:
        """Whether this group drafts as `source` (mtp.MtpSource) asks: the same drafter, the
        same step."""
        return self.drafter is source.drafter and self.step == source.step  # (bound methods: ==)

    def row(self) -> MTPRow:
        return MTPRow(self)

    def propose_rows(self, cache: BatchCache, asks: list) -> list[Draft]:
        """The DraftGroup protocol (engines/speculative/proposer.py): (row, sequence, k, key)."""
        return self.propose(cache, [(b, seq.ctx, k, key) for b, seq, k, key in asks])

    def propose_after(self, cache: BatchCache, asks: list, verdicts: list[LazyVerdict]) -> list[Draft]:
        """Drafts chained on launched steps' verdicts still in the graph (one per ask), unevaluated."""
        return self.propose(cache, [(b, seq.ctx, k, key) for b, seq, k, key in asks], verdicts)

    def propose(self, cache: BatchCache, asks: list[tuple[int, Context, int, mx.array | None]],
                after: list[LazyVerdict] | None = None) -> list[Draft]:
        """Drafts for several rows at once: (row index in the cache, its context, k, RNG key or
        None), from each row's settled state or, `after`, from its launched step's lazy verdict.
        One drafter forward per draft position over every asking row; a row that asked fewer
        than the longest k simply keeps the first k of its chain."""
        index = mx.array([b for b, _, _, _ in asks])
        position, token, h = self._start([ctx for _, ctx, _, _ in asks], after)
        kv, masks = self.view(cache, [b for b, _, _, _ in asks], position, index)
        k_max = max(k for _, _, k, _ in asks)
        tokens, qs = [], []
        for i in range(k_max):
            step = self.step(self.target.embed(token), h, position, kv, masks)
            token, q = self._pick(step.logits, asks, i, position)
            tokens.append(token)
            qs.append(q)
            h = step.h_next
        drafts = mx.stack(tokens, axis=1)  # [rows, k_max]
        if after is None:
            mx.eval(drafts, *[q for q in qs if q is not None])
        out = []
        for r, (_, ctx, k, _) in enumerate(asks):
            q = mx.stack([qs[i][r] for i in range(k)]) if qs[0] is not None else None
            out.append(Draft(drafts[r, :k].astype(mx.uint32), q, overlapped=after is not None))
        return out

    @staticmethod
    def _start(contexts: list[Context], after: list[LazyVerdict] | None):
        """Each row's chain start: (position [R], the token there [R], the target's hidden state
        that produced it [R, D]), from the settled contexts or the launched steps' verdicts."""
        if after is None:
            return (mx.array([ctx.position for ctx in contexts], dtype=mx.int32),
                    mx.array([ctx.tokens[-1] for ctx in contexts], dtype=mx.uint32),
                    mx.stack([ctx.hidden.reshape(-1) for ctx in contexts]))
        return (mx.stack([v.next_position for v in after]).astype(mx.int32), mx.concatenate([v.token for v in after]),
                mx.stack([v.hidden.reshape(-1) for v in after]))

    def view(self, cache: BatchCache, rows: list[int], positions: mx.array, index: mx.array):
        """Per attention kind the drafter reads: the K/V buffer of the target layer it reads,
        gathered to the asking rows, and which slots each row's query (at `positions`, the
        token not yet in the cache) sees: every live slot for full attention, for sliding
        attention the last `sliding_window` positions, the window the last kept token attended
        to (what a sliding-window cache holds).

        That window is a choice the published code does not pin down: transformers' assistant
        masks the sliding K/V it is handed with |q - kv| <= window (window + 1 positions when
        given more); llama.cpp applies its usual sliding-window mask at the query's position.
        All agree until the context passes the window; the parity test hands transformers
        exactly the K/V this reads, before and past the window.

        Why buffers and masks rather than exact slices: the kept counts may still be lazy (a
        step launched ahead), and a buffer's shape changes only when the cache grows it, so the
        compiled drafter step is traced once per growth (every STEP slots) rather than once per
        token: the columns not yet written are masked like dead ones. (Each new trace also
        stays in mx.compile's cache, and every call searches it.)"""
        kv, masks = {}, {}
        every_row = rows == list(range(cache.rows))
        for kind, layer in self.target.kv_layers.items():
            slots = cache.layers[layer]
            table = slots.table
            pos = mx.array(table.key_positions())  # [B, size]; the last token (positions[r]) is not in the cache
            unwritten = slots.keys.shape[2] - table.size
            pos = mx.pad(pos, [(0, 0), (0, unwritten)], constant_values=DEAD) if unwritten else pos
            pos = pos if every_row else pos[index]
            visible = pos >= 0
            if kind == "sliding_attention":
                visible = visible & (pos >= (positions - self.target.sliding_window)[:, None])
            if every_row:  # no gather
                kv[kind] = (slots.keys, slots.values)
            else:
                kv[kind] = (slots.keys[index], slots.values[index])
            masks[kind] = visible
        return kv, masks

    def _pick(self, logits: mx.array, asks: list, position: int, start: mx.array) -> tuple[mx.array, mx.array | None]:
        """Each row's draft at chain position `position` (its chain from position `start`):
        argmax at T=0; at T>0 a sample of the row's own q on the row's key for this step (one
        subkey per position, as the draft model's). (The replaying drafter in tests overrides it.)"""
        tokens, q = draft_rows(logits, [ctx.sampling for _, ctx, _, _ in asks], [key for *_, key in asks], position)
        return tokens.astype(mx.uint32), q
