"""The drafter's training step's element-wise work through numpy, on the CPU.

MLX's CPU exp is scalar on x86 and numpy's is vectorised, so a drafter's step would otherwise
spend about as long in exponentials as in its matrix products: the logsumexp over the draft
vocabulary and the softmax of its gradient, SiLU's sigmoid and attention's softmax (docs/
benchmarks.md, "A drafter trained here for SmolLM2"). Each runs here as an mx.custom_function
with its own gradient; a custom function's vjp sees only its inputs, the cotangent and its
output, so a gradient that needs a softmax either recomputes it or reads the output. A Mac's
GPU takes MLX's own ops: train.train swaps `silu` and `attention` into the drafter, and
losses.kept_labels_loss calls this one, on Linux's CPU backend only (unchecked on a GPU)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np


@mx.custom_function
def kept_labels_loss(logits, ids, probs):
    """Per row logsumexp(logits) - sum_k probs_k logits_{ids_k} (losses.kept_labels_loss)."""
    x = np.asarray(logits)
    top = x.max(-1, keepdims=True)
    lse = top[..., 0] + np.log(np.exp(x - top).sum(-1))
    picked = np.take_along_axis(x, np.asarray(ids).astype(np.intp), axis=-1)
    return mx.array(lse - (np.asarray(probs, dtype=np.float32) * picked).sum(-1))


@kept_labels_loss.vjp
def _kept_labels_loss_vjp(primals, cotangent, output):
    """d/dlogits = cotangent * (softmax(logits) - p at ids); the labels get no gradient. The
    softmax computed again: the output is the loss, not the softmax."""
    logits, ids, probs = primals
    x = np.asarray(logits)
    grad = np.exp(x - x.max(-1, keepdims=True))
    grad /= grad.sum(-1, keepdims=True)
    at = np.asarray(ids).astype(np.intp)
    np.put_along_axis(grad, at, np.take_along_axis(grad, at, axis=-1) - np.asarray(probs, dtype=np.float32), axis=-1)
    grad *= np.asarray(cotangent)[..., None]
    return mx.array(grad), mx.zeros_like(ids), mx.zeros_like(probs)


@mx.custom_function
def silu(x):
    a = np.asarray(x)
    return mx.array(a / (1 + np.exp(-a)))


@silu.vjp
def _silu_vjp(primals, cotangent, output):
    """d silu(x)/dx = s (1 + x (1 - s)), s = sigmoid(x). (One input: MLX passes it, not a tuple.)"""
    a = np.asarray(primals)
    s = 1 / (1 + np.exp(-a))
    return mx.array(np.asarray(cotangent) * s * (1 + a * (1 - s)))


@mx.custom_function
def softmax(x):
    """Over the last axis."""
    a = np.asarray(x)
    e = np.exp(a - a.max(-1, keepdims=True))
    e /= e.sum(-1, keepdims=True)
    return mx.array(e)


@softmax.vjp
def _softmax_vjp(primals, cotangent, output):
    """y (g - sum(g y)): from the output, no exponential (in MLX: a few products and a sum)."""
    return output * (cotangent - (cotangent * output).sum(-1, keepdims=True))


def attention(q: mx.array, keys: mx.array, values: mx.array, scale: float, mask: mx.array | None = None) -> mx.array:
    """mx.fast.scaled_dot_product_attention written out with numpy's softmax: q [B, H, L, d],
    keys / values [B, KV, n, d] (query head h reads kv head h // (H / KV)), mask [.., L, n]
    boolean (True: read) or additive."""
    B, H, L, d = q.shape
    kv, n = keys.shape[1], keys.shape[2]
    g = H // kv
    # the g query heads that share a kv head stacked as rows: one [gL, d] x [d, n] product per
    # (sequence, kv head), not g broadcast [L, d] ones; a boolean mask made additive at its own
    # size first, not a select over every score: fewer, larger operations
    q = (q * scale).reshape(B, kv, g * L, d)
    scores = (q @ keys.swapaxes(-1, -2)).reshape(B, kv, g, L, n)
    if mask is not None:
        if mask.dtype == mx.bool_:
            mask = mx.where(mask, mx.array(0.0, scores.dtype), mx.array(-1e30, scores.dtype))
        scores = scores + mask
    return (softmax(scores).reshape(B, kv, g * L, n) @ values).reshape(B, H, L, d)