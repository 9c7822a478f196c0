"""The chained loss (training-time test, EAGLE-3, Li et al. 2025): depth 1 reads the target's
hidden state h_{t-1} and embeds token t; depth d reads the drafter's own depth d-1 output
instead, so the drafter learns from the states it is really fed when it drafts several tokens
in a row. Every depth learns the target's distribution over the draft vocabulary at its
position (soft labels, EAGLE), depth d weighted DEPTH_DECAY^(d-1) (later depths matter only if
the earlier ones were accepted). The rest of EAGLE's recipe -- regressing the target's hidden
state and noise on the state read -- is left out: it measures no better here (docs/drafter.md,
"How it is trained"). The K/V a depth-d query reads stop at position t-d, where the chain's
first token sits -- exactly what the drafter sees in the chat engine (engines/batch/mtp.py:
fixed query position, the target cache before the chain). No row is computed for chains that start
in a prompt (depth_outputs' `first`): the loss counts none of them."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from engines import cpu
from engines.mlx_chat.drafter import Drafter
from engines.training import data as D
from engines.training.config import TrainConfig

DEPTH_DECAY = 0.8


def teacher_top_k(drafter: Drafter, feats: D.Features, k: int, batch: int) -> tuple[mx.array, mx.array]:
    """The soft labels of every position, once: the target's k most likely tokens of the
    drafter's vocabulary ([N, L, k] indices into it: uint16, uint32 past 65,536 tokens) and their
    probabilities under the target's distribution over that vocabulary, renormalised over the k
    (float16). The drafter's
    vocabulary is fixed before this (draft_vocabulary) and the target's head is frozen, so these
    are the labels chained_loss would compute each step, less the tail past the k-th token.
    Keeping a teacher's top-k probabilities is the usual way to distil from a cache; Anshumann et
    al. 2025 ("Sparse Logit Sampling") show it biased (the tail's mass goes to the top k) and
    sample the labels instead; the k here is measured (TrainConfig.teacher_k)."""
    ids, probs = [], []
    d = drafter.args.hidden_size
    index_type = mx.uint16 if drafter.args.draft_vocab <= 1 << 16 else mx.uint32
    for i in range(0, feats.size, batch):
        final = feats.hidden[i:i + batch, :, -d:].astype(mx.float32)
        logits = drafter.sub_logits(final)
        top = mx.argpartition(-logits, kth=k - 1, axis=-1)[..., :k]
        p = mx.softmax(mx.take_along_axis(logits, top, axis=-1), axis=-1)  # renormalised over the k
        ids.append(top.astype(index_type))
        probs.append(p.astype(mx.float16))
        mx.eval(ids[-1], probs[-1])
    return mx.concatenate(ids), mx.concatenate(probs)


def depth_outputs(drafter: Drafter, batch: D.Features, depth: int, first: int = 0):
    """The chain over a batch, all positions at once: yields (d, states [B, L-d-first, D]) where
    row j is position t = first + j + d, whose label is batch.labels[:, t]. `first`: the
    first chain start computed, less one -- a row's query reads only its own input and the
    target's fixed K/V, so rows no loss counts (chains that start in the prompts) can be left
    out without changing any other row."""
    L = batch.tokens.shape[1]
    emb = drafter.target.embed(batch.tokens)
    h = batch.hidden[:, first:]  # depth 0: the target's own states, by position
    for d in range(1, depth + 1):
        if L - d - first < 1:
            break
        # position t = i + d (i = first + j) embeds token t and reads h at t-1 (row j of the
        # previous depth, which starts one position earlier); it sees K/V at positions <= t - d = i,
        # and its query sits at the chain's first position t - d + 1 = i + 1.
        x = drafter.inputs(emb[:, first + d:], h[:, : L - d - first])
        mask = mx.arange(L)[None, :] <= mx.arange(first, L - d)[:, None]
        h = drafter.layer(x, batch.keys, batch.values, mask, first + 1)
        yield d, h
        # next depth's row j (position first + j + d + 1) reads position first + j + d: this depth's row j


def chained_loss(drafter: Drafter, batch: D.Features, config: TrainConfig, per_batch: float | None = None) -> mx.array:
    """The depths' losses, depth d weighted DEPTH_DECAY^(d-1), padding left out. At position t
    the target's state h_t gives, through the target's head, the distribution the drafter should
    draft from (EAGLE's classification target: soft labels, which carry the target's whole
    ranking per token where a hard label carries one id -- more signal from the same
    teacher-forced data; DistillSpec, Zhou et al. 2024, also distils the target's distribution).
    Hard labels outside the draft vocabulary are left out, and so are chains that start in a
    prompt (batch.starts): the drafter only ever drafts answers. Each depth's sum
    is divided by `per_batch` (training: answer_rows_per_batch, the same for every batch) or, when
    None, by the rows it counts."""
    batch = batch.columns(int(batch.lengths.max()))  # padding past the longest row: no loss reads it
    L = batch.tokens.shape[1]
    real = mx.arange(L)[None, :] < batch.lengths[:, None]
    # the first row computed: no chain starts in a prompt (below), so depth_outputs leaves
    # the rows before the earliest answer out
    first = max(0, int(batch.starts.min()) - 1) if batch.starts is not None else 0
    final = batch.hidden[..., -drafter.args.hidden_size:]  # the final-norm state (the features end with it)
    kept = config.soft_labels and batch.teacher_ids is not None  # the top-k soft labels, computed once
    if config.soft_labels and not kept:
        teacher = mx.softmax(drafter.sub_logits(final), axis=-1)  # over the draft vocabulary, renormalised
    elif not config.soft_labels:
        lookup = mx.full((drafter.args.vocab_size,), -1, dtype=mx.int32)
        lookup = lookup.at[drafter.vocab_ids].add(mx.arange(drafter.vocab_ids.size, dtype=mx.int32) + 1)
        sub = lookup[batch.labels]
    total, weights = mx.array(0.0), 0.0
    for d, h in depth_outputs(drafter, batch, config.depth, first):
        at = slice(first + d, None)  # the positions of this depth's rows
        logits = drafter.sub_logits(h)
        real_d = real[:, at]
        if batch.starts is not None:  # only chains that start in an answer, as in chat (see above)
            # position t's depth-d draft belongs to the chain that starts at t - d + 1
            real_d = real_d & ((mx.arange(first + d, L) - d + 1)[None, :] >= batch.starts[:, None])
        if kept:
            keep = real_d
            loss = kept_labels_loss(logits, batch.teacher_ids[:, at], batch.teacher_probs[:, at])
            if config.confidence_weighting:
                loss = loss * batch.teacher_probs[:, at].max(-1)
        elif config.soft_labels:
            keep = real_d
            loss = -(teacher[:, at] * nn.log_softmax(logits, axis=-1)).sum(-1)
            if config.confidence_weighting:
                loss = loss * teacher[:, at].max(-1)
        else:
            keep = real_d & (sub[:, at] >= 0)
            loss = nn.losses.cross_entropy(logits, mx.maximum(sub[:, at], 0), reduction="none")
        w = DEPTH_DECAY ** (d - 1)
        total = total + w * (loss * keep).sum() / (per_batch or mx.maximum(keep.sum(), 1))
        weights += w
    return total / weights


def kept_labels_loss(logits: mx.array, ids: mx.array, probs: mx.array) -> mx.array:
    """Per row, the cross-entropy to the kept soft labels: -sum_k p_k log softmax(logits)_{ids_k}
    = logsumexp(logits) - sum_k p_k logits_{ids_k} (the p_k sum to 1). On the CPU through numpy
    (numpy_ops.kept_labels_loss), the same function with its own gradient."""
    if mx.default_device() == mx.cpu and cpu.enabled():  # (sub_logits are float32)
        from engines.cpu import numpy_ops

        return numpy_ops.kept_labels_loss(logits, ids, probs)
    picked = mx.take_along_axis(logits, ids, axis=-1)
    return mx.logsumexp(logits, axis=-1) - (probs * picked).sum(-1)
