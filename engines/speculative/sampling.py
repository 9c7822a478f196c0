"""Reference maths for sampling and lossless rejection sampling, in NumPy.

This is the specification the backends implement in their own graphs (MLX in
engines/mlx_chat, torch in engines/glm_ocr); tests check each backend against these
functions. Temperature, then top-k, then top-p, exactly as here, wherever target
probabilities are formed -- for plain sampling and for verification alike, otherwise the
speculative output distribution would differ from plain sampling.
"""

from __future__ import annotations

import numpy as np

from engines.speculative.verify import Verdict


def target_probs(
    logits: np.ndarray, temperature: float, top_p: float = 1.0, top_k: int = 0
) -> np.ndarray:
    """Probabilities over the vocabulary (last axis) after temperature, top-k and top-p.

    top-k keeps the k largest logits; top-p keeps the smallest prefix of the sorted
    distribution whose mass reaches top_p (the token that crosses the threshold included,
    the most likely token always kept). Ties at a cut-off are broken by sort order."""
    x = np.asarray(logits, dtype=np.float64) / max(temperature, 1e-6)
    if top_k and 0 < top_k < x.shape[-1]:
        kth = np.sort(x, axis=-1)[..., -top_k][..., None]
        x = np.where(x >= kth, x, -np.inf)
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass strictly before each token
        keep_sorted = before < top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


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
