"""Held-out acceptance by depth, teacher-forced: what the progress and the model card report."""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from engines.mlx_chat.drafter import Drafter
from engines.training import data as D
from engines.training.losses import depth_outputs
from engines.training.progress import Clock

EVAL_DEPTH = 5  # acceptance is reported for depths 1..5


def evaluate(drafter: Drafter, held: D.Features, batch: int) -> list[float]:
    """Held-out acceptance by depth 1..EVAL_DEPTH, teacher-forced: the share of chain starts
    whose drafts 1..d all equal the target's greedy tokens (on the target's own answers this
    is what the chat engine's rounds accept at T=0). Chains start at a row's first answer
    position (held.starts) or later, as in chat, where the drafter never drafts the
    prompt (counting the prompt's positions would flatter it: every answer opens with the same
    system prompt, which the drafter learns by heart)."""
    hits = np.zeros(EVAL_DEPTH)
    starts = 0
    for i in range(0, held.size, batch):
        b = held.rows(list(range(i, min(i + batch, held.size))))
        L = b.tokens.shape[1]
        lengths = np.array(b.lengths)
        labels = np.array(b.labels)
        first = np.array(b.starts) if b.starts is not None else np.zeros(b.size, int)
        # correct[d][n, t]: the depth-d draft at position t equals the target's token
        correct = {}
        for d, h in depth_outputs(drafter, b, EVAL_DEPTH):
            ids = np.array(drafter.vocab_ids[mx.argmax(drafter.sub_logits(h), axis=-1)])
            correct[d] = np.zeros((b.size, L), bool)
            correct[d][:, d:] = ids == labels[:, d:]
        for n in range(b.size):
            # a chain starts at p (its first token) and its depth-d draft sits at p + d - 1;
            # starts from 1 (depth 1 reads h_{p-1}) while the chain stays inside the row
            for p in range(max(1, int(first[n])), int(lengths[n]) - EVAL_DEPTH + 1):
                starts += 1
                ok = True
                for d in range(1, EVAL_DEPTH + 1):
                    ok = ok and d in correct and bool(correct[d][n, p + d - 1])
                    hits[d - 1] += ok
    return [float(x) for x in hits / max(starts, 1)]


def timed_evaluate(drafter: Drafter, held: D.Features, batch: int, clock: Clock) -> list[float]:
    """evaluate, its time per sequence kept as the clock's estimate of the final measure's."""
    t = time.perf_counter()
    acceptance = evaluate(drafter, held, batch)
    clock.eval_row_s = (time.perf_counter() - t) / max(held.size, 1)
    return acceptance
