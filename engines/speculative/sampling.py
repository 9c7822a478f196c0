"""Reference maths for sampling and lossless rejection sampling, in NumPy.

This is the specification the backends implement in their own graphs (MLX in
engines/mlx_chat, torch in engines/glm_ocr); tests check each backend against these
functions. The target distribution is mlx-lm's (make_sampler: top-p, min-p, top-k on the
log-probabilities, then temperature), exactly as here, wherever target probabilities are
formed -- for plain sampling and for verification alike, otherwise the speculative output
distribution would differ from plain sampling.
"""

from __future__ import annotations

import numpy as np

from engines.speculative.verify import Verdict


def target_probs(
    logits: np.ndarray, temperature: float, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0
) -> np.ndarray:
    """Probabilities over the vocabulary (last axis) as mlx-lm's make_sampler draws them: on
    the log-probabilities, top-p, then min-p, then top-k, then softmax(x / temperature).

    top-p keeps every token whose probability is at least that of the token at which the
    descending cumulative mass first reaches top_p (so the crossing token is kept, and ties
    with it); min-p keeps tokens with p >= min_p * max p; top-k keeps the k largest (a tie at
    the k-th value is kept whole here, mlx-lm's argpartition keeps k of them)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    x = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    if 0 < top_p < 1.0:
        p = np.exp(x)
        order = np.argsort(-x, axis=-1, kind="stable")
        before = np.cumsum(np.take_along_axis(p, order, axis=-1), axis=-1) - np.take_along_axis(p, order, axis=-1)
        last = (before < top_p).sum(axis=-1, keepdims=True) - 1  # the crossing token's rank
        threshold = np.take_along_axis(np.take_along_axis(x, order, axis=-1), last, axis=-1)
        x = np.where(x >= threshold, x, -np.inf)
    if min_p > 0:
        x = np.where(x >= x.max(axis=-1, keepdims=True) + np.log(min_p), x, -np.inf)
    if top_k and 0 < top_k < x.shape[-1]:
        kth = np.sort(x, axis=-1)[..., -top_k][..., None]
        x = np.where(x >= kth, x, -np.inf)
    z = x / max(temperature, 1e-6)
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def residual_distribution(p: np.ndarray, q: np.ndarray | None, draft: int) -> np.ndarray:
    """normalise(max(p - q, 0)). A point-mass proposal (n-gram, greedy draft) is q = one-hot
    at the draft, which makes this p with the draft removed."""
    r = p.copy()
    if q is None:
        r[draft] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p  # p == q: rejection has probability 0 anyway


def rejection_verify(
    p: np.ndarray, q: np.ndarray | None, drafts: list[int], rng: np.random.Generator
) -> Verdict:
    """Lossless speculative sampling (Leviathan et al.; Chen et al.).

    p: [K+1, V] target probabilities at each drafted position and after the last draft.
    q: [K, V] the drafter's probabilities, or None for point-mass proposals.
    Accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection
    emit a sample from the residual; if all are accepted emit a sample from p_K."""
    for i, x in enumerate(drafts):
        qx = 1.0 if q is None else q[i, x]
        if rng.random() * qx < p[i, x]:  # u < p/q without dividing by a zero q
            continue
        r = residual_distribution(p[i], None if q is None else q[i], x)
        return Verdict(i, list(drafts[:i]) + [int(rng.choice(len(r), p=r))])
    return Verdict(len(drafts), list(drafts) + [int(rng.choice(p.shape[-1], p=p[len(drafts)]))])
