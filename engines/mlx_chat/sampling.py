"""Sampling and lossless rejection sampling inside the MLX graph.

The target distribution is mlx-lm's: built with mlx_lm.sample_utils' own filter functions in
make_sampler's order, so `--temp 0.7 --top-p 0.9` means here what it means in mlx-lm. The
NumPy twin in engines/speculative/sampling.py is the specification the tests hold this to. Everything here stays lazy: the round loop evaluates a handful of
ints per round (argmax ids, or accept flags + residual samples + bonus), never a
full-vocabulary row on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, categorical_sampling

from engines.speculative.schedule import MAX_STEPS
from engines.types import Sampling


def filtered_logprobs(logits: mx.array, sampling: Sampling) -> mx.array:
    """Log-probabilities after mlx-lm's own filters, in make_sampler's order and on the
    unscaled log-probabilities as it applies them: top-p, then min-p, then top-k (a filtered
    token is -inf). Temperature comes after (categorical_sampling divides by it)."""
    x = logits.astype(mx.float32)
    x = x - mx.logsumexp(x, axis=-1, keepdims=True)
    if 0 < sampling.top_p < 1.0:
        x = apply_top_p(x, sampling.top_p)
    if sampling.min_p > 0:
        x = apply_min_p(x, sampling.min_p)
    if 0 < sampling.top_k < x.shape[-1]:  # mlx-lm refuses top_k >= vocab; it filters nothing
        x = apply_top_k(x, sampling.top_k)
    return x


def target_probs(logits: mx.array, sampling: Sampling) -> mx.array:
    """The distribution mlx-lm's make_sampler samples from for the same flags, over the last
    axis: softmax(filtered log-probabilities / temperature), in float32. Plain sampling and
    verification both use it, so speculation keeps exactly this distribution."""
    return mx.softmax(filtered_logprobs(logits, sampling) / sampling.temperature, axis=-1)


def sample(probs: mx.array, key: mx.array | None = None) -> mx.array:
    """One sample per row of `probs` (zeros are never drawn). `key`: a sequence's own RNG
    (the batch loop); None draws from MLX's global generator, as mlx-lm does."""
    return mx.random.categorical(mx.log(probs), axis=-1, key=key)


def pick(logits: mx.array, sampling: Sampling, key: mx.array | None = None) -> mx.array:
    """The next token(s) for plain decoding, as mlx-lm's sampler picks them: argmax at T=0,
    else its categorical_sampling of the filtered log-probabilities (with `key`, the same
    expression on that key: mlx-lm's own function has no key argument)."""
    if sampling.greedy:
        return mx.argmax(logits, axis=-1)
    if key is None:
        return categorical_sampling(filtered_logprobs(logits, sampling), sampling.temperature)
    return mx.random.categorical(filtered_logprobs(logits, sampling) * (1.0 / sampling.temperature), key=key)


def draft_rows(logits: mx.array, samplings: list[Sampling], keys: list, position: int) -> tuple[mx.array, mx.array | None]:
    """A batched drafter's draft per row at chain position `position`, and the q each was drawn
    from (None when every row is greedy): argmax at T=0; at T>0 a sample of the row's own q on
    its RNG key for this step (one subkey per position); a greedy row among sampled ones gets a
    point mass as its q."""
    if all(s.greedy for s in samplings):
        return mx.argmax(logits, axis=-1), None
    ys, qs = [], []
    for b, (s, key) in enumerate(zip(samplings, keys)):
        if s.greedy:
            ys.append(mx.argmax(logits[b], axis=-1))
            qs.append(mx.zeros_like(logits[b]).at[ys[-1]].add(1.0))
            continue
        q = target_probs(logits[b], s)
        if key is not None:
            key = mx.random.split(key, MAX_STEPS)[position]
        ys.append(mx.random.categorical(mx.log(q), key=key))
        qs.append(q)
    return mx.stack(ys), mx.stack(qs)


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


@dataclass
class VerifyLaw:
    """What rejection sampling draws from, per round: accept draft i with probability
    min(1, p_draft[i] / q_draft[i]); at the first rejection emit a sample of residual[i]; if
    every draft is accepted, a sample of bonus."""

    p_draft: mx.array  # [k] the target's probability of each draft
    q_draft: mx.array  # [k] the drafter's (1 for a point mass)
    residual: mx.array  # [k, V] normalise(max(p_i - q_i, 0))
    bonus: mx.array  # [V] p after the last draft


def verify_law(p: mx.array, q: mx.array | None, drafts: mx.array) -> VerifyLaw:
    """p: [k+1, V] target probabilities at each drafted position and after the last draft;
    q: [k, V] the drafter's probabilities, or None for a point-mass proposal (n-gram,
    greedy draft): then q(x) = 1 and the residual is p with x removed."""
    k = drafts.shape[0]
    rows = mx.arange(k)
    p_draft = p[rows, drafts]
    q_draft = mx.ones_like(p_draft) if q is None else q[rows, drafts]
    return VerifyLaw(p_draft, q_draft, residual_probs(p[:k], q, drafts), p[k])


def rejection_verify(p: mx.array, q: mx.array | None, drafts: mx.array,
                     key: mx.array | None = None) -> SampledVerdict:
    """One speculative round's random draws, lazily (see verify_law for p and q). `key`: the
    sequence's own RNG (three independent streams are split from it), else MLX's global one."""
    law = verify_law(p, q, drafts)
    keys = mx.random.split(key, 3) if key is not None else (None, None, None)
    u = mx.random.uniform(shape=(drafts.shape[0],), key=keys[0])
    return SampledVerdict(
        accept=lossless_accept(law.p_draft, law.q_draft, u),
        residual=sample(law.residual, keys[1]),
        bonus=sample(law.bonus, keys[2]),
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
    An MTP row's next chain is drafted from it while the host is still waiting."""
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
