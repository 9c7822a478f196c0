"""A drafter whose acceptance we choose, for tests and the benchmarks: the batch's real MTP
group and the real assistant forward run every step (so cost, K/V reads and h_prev plumbing
are real), then each row's drafted token is replaced by the target's own continuation --
wrong at a chosen rate. Handed to the engine as its MTP group maker (`engine.mtp_group =
replay_factory(...)`, read by engines/batch/engine.py).

T=0: `reference` is the target's greedy output (prompt + tokens); step j of a chain drafted
at position P proposes reference[P + 1 + j], or with probability `error_rate` another token.
The draw depends only on (seed, P, j), so steps launched ahead of their verdicts or after
them see the same acceptance.

T>0: `oracle(context) -> p` gives the target's exact next-token distribution after `context`;
the drafter proposes q = (1 - error_rate) * p + error_rate * (a point on the allowed token of
probability nearest 1/2, `over_estimated`): a full distribution, close to the target's but
biased, so rejection sampling accepts often, not always, and resamples from the residual
max(p - q, 0) when it rejects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import numpy as np

from engines.batch.mtp import BatchMTP

MAX_STEPS = 16  # the longest chain the table serves
BOOST = 50.0  # added to the replayed token's logit: an argmax, whatever the drafter said


def wrong_token(seed: int, position: int, j: int, error_rate: float, right: int, vocab: int) -> int:
    rng = np.random.default_rng([seed, position, j])
    if rng.random() >= error_rate:
        return right
    return int((right + 1 + rng.integers(vocab - 1)) % vocab)


@dataclass
class Seen:
    """What a chain started from (position, h_prev, K/V and masks may be lazy arrays)."""

    position: int | mx.array
    h_prev: mx.array
    kv: dict[str, tuple[mx.array, mx.array]]
    masks: dict[str, mx.array | None]
    launched_ahead: bool  # chained on a launched step's verdict still in the graph

    def visible_kv(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The K/V entries the drafter's query attends to, per attention type."""
        out = {}
        for kind, (keys, values) in self.kv.items():
            keys, values = np.array(keys), np.array(values)
            mask = self.masks.get(kind)
            if mask is not None:
                mask = np.array(mask)
                keys, values = keys[..., mask, :], values[..., mask, :]
            out[kind] = (keys, values)
        return out


@dataclass
class ReplayBatchMTP(BatchMTP):
    """The batch's MTP rows replayed: the real drafter forward runs for every row, then each
    row's draft at chain step j from position P is reference[P + 1 + j] (wrong at the error
    rate) at T=0, or (T>0) drawn from the biased oracle q after the row's own history. Every
    chain's start is kept (`seen`)."""

    reference: list[int] | None = None
    oracle: Callable[[tuple[int, ...]], np.ndarray] | None = None
    error_rate: float = 0.2
    seed: int = 0
    temperature: float = 1.0  # the run's: logits = T log q, so target_probs gives q

    def __post_init__(self):
        self.seen: list[Seen] = []  # every chain begun, launched ahead or not
        self.table = self.choices(self.reference, self.drafter.vocab_size) if self.reference is not None else None

    def choices(self, reference: list[int], vocab: int) -> mx.array:
        """[position, j] -> the token step j of a chain at that position proposes (T=0). A
        table, so a chain launched ahead, whose position is still lazy, reads it in the graph;
        made before the run, so the benchmark's timings do not include it."""
        n = len(reference)
        table = [[wrong_token(self.seed, pos, j, self.error_rate, reference[pos + 1 + j] if pos + 1 + j < n else 0, vocab)
                  for j in range(MAX_STEPS)] for pos in range(n + 1)]
        return mx.array(table, dtype=mx.int32)

    def propose(self, cache, asks, after=None):
        self.after, self.drafted = after, [[] for _ in asks]
        return super().propose(cache, asks, after)

    def _start(self, contexts, after):
        position, token, self.h = super()._start(contexts, after)
        return position, token, self.h

    def view(self, cache, rows, positions, index):
        """What each row's chain reads (Seen)."""
        kv, masks = super().view(cache, rows, positions, index)
        for r in range(len(rows)):
            self.seen.append(Seen(positions[r], self.h[r], {k: (a[r:r + 1], b[r:r + 1]) for k, (a, b) in kv.items()},
                                  {k: m[r] for k, m in masks.items()}, launched_ahead=self.after is not None))
        return kv, masks

    def _pick(self, logits, asks, position, start):
        vocab = logits.shape[-1]
        if self.oracle is None:  # T=0: the table, read in the graph (a row's start may be lazy)
            choice = self.table[mx.minimum(start, self.table.shape[0] - 1), position]
            onehot = mx.arange(vocab)[None] == choice[:, None]
            logits = mx.where(onehot, logits.max(axis=-1, keepdims=True) + BOOST, logits)
        else:  # T>0 (tests only): each row's history read on the host
            rows = []
            for r, (_, ctx, _, _) in enumerate(asks):
                p = self.oracle(tuple(row_history(ctx, int(start[r].item()), self.after, r)) + tuple(self.drafted[r]))
                q = (1 - self.error_rate) * p
                q[over_estimated(p)] += self.error_rate
                with np.errstate(divide="ignore"):
                    rows.append(np.maximum(self.temperature * np.log(q), -1e30))
            logits = mx.array(np.stack(rows), dtype=mx.float32) + 0.0 * logits
        token, q = super()._pick(logits, asks, position, start)
        if self.oracle is not None:
            for r, t in enumerate(token.tolist()):
                self.drafted[r].append(t)
        return token, q


def row_history(ctx, start: int, after, r: int) -> list[int]:
    """A batch row's token ids up to and including the one its chain's first step embeds."""
    if after is None:
        return ctx.tokens[: start + 1]
    v = after[r]
    accepted = int(v.accepted.item())
    return ctx.tokens[: v.position + 1] + np.array(v.drafts)[:accepted].tolist() + v.token.tolist()


def over_estimated(p: np.ndarray) -> int:
    """The token the T>0 drafter over-estimates: of those the target allows, the one whose
    probability is nearest 1/2. Rejections then fall on a token of moderate probability, and
    the residual max(p - q, 0) -- p without that token -- is far from p, so a verifier that
    resamples from p instead is visibly wrong. (A point on p's least likely token, as this
    drafter had first, moved only about p_min of mass and hid that mistake.)"""
    return int(np.where(p > 0, np.abs(p - 0.5), np.inf).argmin())


def replay_factory(**kwargs):
    """For engine.mtp_group: ReplayBatchMTP with these keyword arguments."""
    return lambda drafter, target, step: ReplayBatchMTP(drafter, target, step, **kwargs)
