"""Sampling and lossless rejection sampling inside the MLX graph.

The MLX twin of engines/speculative/sampling.py (the NumPy specification; tests compare the
two on random logits). Everything here stays lazy: the round loop evaluates a handful of
ints per round (argmax ids, or accept flags + residual samples + bonus), never a
full-vocabulary row on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from engines import Sampling


def target_probs(logits: mx.array, sampling: Sampling) -> mx.array:
    """Probabilities over the last axis after temperature, then top-k, then top-p (the
    reference's order and tie rules), in float32."""
    x = logits.astype(mx.float32) / max(sampling.temperature, 1e-6)
    vocab = x.shape[-1]
    if sampling.top_k and 0 < sampling.top_k < vocab:
        kth = mx.sort(x, axis=-1)[..., vocab - sampling.top_k][..., None]
        x = mx.where(x >= kth, x, -mx.inf)
    p = mx.softmax(x, axis=-1)
    if sampling.top_p < 1.0:
        order = mx.argsort(-p, axis=-1)
        sorted_p = mx.take_along_axis(p, order, axis=-1)
        before = mx.cumsum(sorted_p, axis=-1) - sorted_p  # mass strictly before each token
        keep_sorted = before < sampling.top_p
        inverse = mx.argsort(order, axis=-1)  # scatter back: keep[i] = keep_sorted[rank of i]
        keep = mx.take_along_axis(keep_sorted, inverse, axis=-1)
        p = mx.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    return p


def sample(probs: mx.array) -> mx.array:
    """One sample per row of `probs` (zeros are never drawn)."""
    return mx.random.categorical(mx.log(probs), axis=-1)


def pick(logits: mx.array, sampling: Sampling) -> mx.array:
    """The next token(s) for plain decoding: argmax at T=0, a sample of target_probs else."""
    if sampling.greedy:
        return mx.argmax(logits, axis=-1)
    return sample(target_probs(logits, sampling))


@dataclass
class SampledVerdict:
    """Lazy per-round results of rejection sampling (k drafts): accept[i] is u_i < p_i/q_i,
    residual[i] a sample from normalise(max(p_i - q_i, 0)), bonus a sample from p_k."""

    accept: mx.array  # [k] bool
    residual: mx.array  # [k] int
    bonus: mx.array  # [] int


def lossless_accept(p_draft: mx.array, q_draft: mx.array, u: mx.array) -> mx.array:
    """The rejection test of speculative sampling: accept x with probability
    min(1, p(x) / q(x)), written u * q < p so that q(x) = 0 never divides."""
    return u * q_draft < p_draft


def residual_probs(p: mx.array, q: mx.array | None, drafts: mx.array) -> mx.array:
    """normalise(max(p - q, 0)) per drafted position; for a point mass, p without the draft.
    Where p == q the residual is empty and never sampled (rejection has probability 0)."""
    if q is None:
        r = mx.where(mx.arange(p.shape[-1])[None] == drafts[:, None], 0.0, p)
    else:
        r = mx.maximum(p - q, 0.0)
    total = r.sum(axis=-1, keepdims=True)
    return mx.where(total > 0, r / mx.maximum(total, 1e-30), p)


def rejection_verify(
    p: mx.array,
    q: mx.array | None,
    drafts: mx.array,
) -> SampledVerdict:
    """p: [k+1, V] target probabilities at each drafted position and after the last draft;
    q: [k, V] the drafter's probabilities, or None for a point-mass proposal (n-gram,
    greedy draft): then q(x) = 1 and the residual is p with x removed."""
    k = drafts.shape[0]
    rows = mx.arange(k)
    p_draft = p[rows, drafts]
    q_draft = mx.ones_like(p_draft) if q is None else q[rows, drafts]
    residual = residual_probs(p[:k], q, drafts)
    u = mx.random.uniform(shape=(k,))
    return SampledVerdict(
        accept=lossless_accept(p_draft, q_draft, u),
        residual=sample(residual),
        bonus=sample(p[k]),
    )


def verdict_in_graph(
    drafts: mx.array,
    argmax: mx.array | None = None,
    sampled: SampledVerdict | None = None,
    token: mx.array | None = None,
) -> tuple[mx.array, mx.array]:
    """A launched round's verdict before the host reads it, lazily: (accepted [] int32, the
    token after the accepted drafts [1] uint32). The in-graph twin of verify_greedy (argmax
    [k+1]) and verify_sampled (sampled); `token` is a plain round's sample (no drafts).
    Depth-2 overlap drafts the next round from it while the host is still waiting."""
    k = drafts.shape[0]
    if argmax is not None:
        if k == 0:
            return mx.array(0, dtype=mx.int32), argmax[-1:].astype(mx.uint32)
        matches = (argmax[:k] == drafts).astype(mx.int32)
        accepted = mx.cumprod(matches).sum()  # the agreeing prefix
        return accepted, mx.take(argmax, accepted).reshape(1).astype(mx.uint32)
    if sampled is not None:
        accepted = mx.cumprod(sampled.accept.astype(mx.int32)).sum()
        residual = mx.take(sampled.residual, mx.minimum(accepted, k - 1))
        last = mx.where(accepted < k, residual, sampled.bonus)
        return accepted, last.reshape(1).astype(mx.uint32)
    return mx.array(0, dtype=mx.int32), token.reshape(1).astype(mx.uint32)
