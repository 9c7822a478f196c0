"""MTP drafting for the whole batch: every sequence that drafts with the same MTP drafter (the
Gemma 4 assistant, or a drafter trained here) chains its drafts in the same drafter forwards,
each row reading its own row of the batch's target K/V.

Per row, as the single-stream MTPProposer does it (engines/mlx_chat/mtp.py): a chain starts
from the row's last accepted token (not yet in the target's cache), the target's final hidden
state that produced it (ctx.hidden: the batch loop keeps it from the accepted position), and the
target's K/V before that token; the query position stays that token's for every chained step.
Which K/V a row sees comes from the slot table (engines/batch/cache.py): its live slots -- a
rejected draft's slot is dead -- and, for a sliding layer, the positions the last kept token
attended to (the last `sliding_window` ones: mtp.Gemma4Target.drafter_view says why). Drafts
are the argmax at T=0, and at T>0 a sample of the drafter's q on the row's own RNG key.

The drafter keeps no cache, so nothing here rolls back: the batch's settle does, for the K/V
the drafter reads. There is no depth-2 overlap in a batch: chains are built once the host
has read every row's verdict (the lone loop's overlap is a single-stream device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import mlx.core as mx
import numpy as np

from engines.types import EngineError
from engines.batch.cache import BatchCache
from engines.mlx_chat.proposers import ProposerContext
from engines.speculative.proposer import Draft
from engines.mlx_chat.sampling import target_probs
from engines.speculative.schedule import MAX_STEPS


@dataclass(eq=False)
class MTPRow:
    """The proposer an MTP sequence holds: its place among the batch's MTP rows. The batch
    loop drafts for all of them at once (BatchMTP.propose); the loop keeps ctx.hidden."""

    drafter: "BatchMTP"
    name: str = "mtp"
    needs_hidden: bool = True
    drafts_ahead: bool = False

    @property
    def group(self) -> "BatchMTP":
        return self.drafter

    def start(self, ctx: ProposerContext) -> None:
        if ctx.hidden is None:
            raise EngineError("MTP needs the target's hidden state; the batch loop did not provide it")

    def propose(self, ctx: ProposerContext, k: int) -> Draft:
        raise EngineError("an MTP row drafts with its batch (BatchMTP.propose), not on its own")

    def commit(self, ctx: ProposerContext) -> None:
        pass  # no cache of its own: the target's rollback is the drafter's

    def target_forward(self, tokens: mx.array, cache: list) -> tuple[mx.array, mx.array]:
        return self.drafter.target.forward(tokens, cache)


@dataclass
class BatchMTP:
    """One MTP drafter and the target view it reads (mtp.Gemma4Target or drafter.TargetView)."""

    drafter: Any
    target: Any
    step: Callable  # the drafter's step (compiled unless the engine's mtp_options.compiled is off), rows at once

    @classmethod
    def of(cls, proposer) -> "BatchMTP":
        """From the single-stream MTPProposer a request would get (same drafter, same checks)."""
        return cls(proposer.drafter, proposer.target, proposer.drafter_step)

    def row(self) -> MTPRow:
        return MTPRow(self)

    def propose_rows(self, cache: BatchCache, asks: list) -> list[Draft]:
        """The DraftGroup protocol (engines/speculative/proposer.py): (row, sequence, k, key)."""
        return self.propose(cache, [(b, seq.ctx, k, key) for b, seq, k, key in asks])

    def propose(self, cache: BatchCache, asks: list[tuple[int, ProposerContext, int, mx.array | None]]) -> list[Draft]:
        """Drafts for several rows at once: (row index in the cache, its context, k, RNG key or
        None). One drafter forward per draft position over every asking row; a row that asked
        fewer than the longest k simply keeps the first k of its chain."""
        index = mx.array([b for b, _, _, _ in asks])
        contexts = [ctx for _, ctx, _, _ in asks]
        positions = np.array([ctx.position for ctx in contexts])
        kv, masks = self._view(cache, [b for b, _, _, _ in asks], positions, index)
        token = mx.array([ctx.tokens[-1] for ctx in contexts], dtype=mx.uint32)
        h = mx.stack([ctx.hidden.reshape(-1) for ctx in contexts])
        position = mx.array(positions, dtype=mx.int32)
        k_max = max(k for _, _, k, _ in asks)
        tokens, qs = [], []
        for i in range(k_max):
            step = self.step(self.target.embed(token), h, position, kv, masks)
            token, q = self._pick(step.logits, asks, i)
            tokens.append(token)
            qs.append(q)
            h = step.h_next
        drafts = mx.stack(tokens, axis=1)  # [rows, k_max]
        mx.eval(drafts, *[q for q in qs if q is not None])
        out = []
        for r, (_, ctx, k, _) in enumerate(asks):
            q = mx.stack([qs[i][r] for i in range(k)]) if qs[0] is not None else None
            out.append(Draft(drafts[r, :k].astype(mx.uint32), q))
        return out

    def _view(self, cache: BatchCache, rows: list[int], positions: np.ndarray, index: mx.array):
        """Per attention kind the drafter reads: the K/V buffer of the target layer it reads,
        gathered to the asking rows, and which slots each row's query sees."""
        kv, masks = {}, {}
        for kind, layer in self.target.kv_layers.items():
            slots = cache.layers[layer]
            table = slots.table
            size = table.size
            pos = table.pos[rows]  # [rows, size]; the last token (positions[r]) is not in the cache
            visible = pos >= 0
            if kind == "sliding_attention":
                visible &= pos >= (positions - self.target.sliding_window)[:, None]
            if rows == list(range(table.rows)):  # every row drafts: no gather
                kv[kind] = (slots.keys[..., :size, :], slots.values[..., :size, :])
            else:
                kv[kind] = (slots.keys[index, :, :size, :], slots.values[index, :, :size, :])
            masks[kind] = mx.array(visible)
        return kv, masks

    def _pick(self, logits: mx.array, asks: list, position: int) -> tuple[mx.array, mx.array | None]:
        """Each row's draft at this chain position: argmax at T=0; at T>0 a sample of the row's
        own q on the row's key for this step (one subkey per position, as the draft model's)."""
        samplings = [ctx.sampling for _, ctx, _, _ in asks]
        if all(s.greedy for s in samplings):
            return mx.argmax(logits, axis=-1).astype(mx.uint32), None
        ys, qs = [], []
        for r, (_, ctx, _, key) in enumerate(asks):
            s = ctx.sampling
            if s.greedy:
                ys.append(mx.argmax(logits[r], axis=-1))
                qs.append(mx.zeros_like(logits[r]).at[ys[-1]].add(1.0))  # a point mass
                continue
            q = target_probs(logits[r], s)
            if key is not None:
                key = mx.random.split(key, MAX_STEPS)[position]
            ys.append(mx.random.categorical(mx.log(q), key=key))
            qs.append(q)
        return mx.stack(ys).astype(mx.uint32), mx.stack(qs)
