"""Attention and SwiGLU for MLX's CPU backend, with exp taken as a power of two.

MLX's CPU `exp` is scalar; its `power` is not. Two steps of every layer are made of exps: the
attention's softmax (rows x heads x width x context elements) and SwiGLU's sigmoid (rows x
width x the MLP's width). For one token they are small; for a verify of a batch they are a
large share of the forward, and written as 2^(x log2 e) they cost a fraction of that
(docs/benchmarks.md, "The CPU kernels: exp as a power of two"; bench/cpu_kernels.py).

The numbers differ from MLX's own in the last bits (logits within ~5e-5 of mx.fast's on
SmolLM2), so a model runs with these everywhere in the process or nowhere: plain decoding,
drafting and verification all see the same function, which is what lossless needs.

Installed only where MLX computes on the CPU (no Metal): a Mac's GPU runs mx.fast's own
kernels, untouched. Anything these do not cover (quantized caches, attention sinks, other
dtypes) goes to mlx-lm's own function.
"""

from __future__ import annotations

import sys
import threading

import mlx.core as mx

LOG2E = 1.4426950408889634


def exp(x: mx.array) -> mx.array:
    return mx.power(2.0, x * LOG2E)


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x = gate * x / (1 + e^-gate), mlx-lm's activations.swiglu."""
    return gate * x / (1.0 + exp(-gate))


def attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask) -> mx.array:
    """softmax(q k^T * scale + mask) v for grouped-query heads: [B, H, L, D] queries against
    [B, H_kv, S, D] keys and values; mask None, "causal", or [.., L, S] bool or additive."""
    B, H, L, D = queries.shape
    kv_heads, S = keys.shape[1], keys.shape[2]
    group = H // kv_heads
    # A query head h reads kv head h // group: its group's queries stack as one matrix. The
    # scores come out in log2 units (scale * log2 e folded into the queries), so the softmax's
    # exp is a bare power of two.
    q = (queries * (scale * LOG2E)).reshape(B, kv_heads, group * L, D)
    scores = (q @ keys.swapaxes(-1, -2)).reshape(B, kv_heads, group, L, S)
    if isinstance(mask, str):  # "causal": the L queries are the last L of the S positions
        scores = scores + causal_mask(L, S)
    elif mask is not None:
        mask = additive(mask, scores.dtype)
        # Broadcast as mx.fast does against [B, H, L, S]; H then splits into (kv head, group).
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        mask = mask.reshape(mask.shape[0], 1, 1, L, S) if mask.shape[1] == 1 else \
            mask.reshape(mask.shape[0], kv_heads, group, L, S)
        scores = scores + mask
    e = mx.power(2.0, scores - scores.max(axis=-1, keepdims=True)).reshape(B, kv_heads, group * L, S)
    # Normalised after the product with the values: D divisions a query instead of S.
    out = (e @ values) / e.sum(axis=-1, keepdims=True)
    return out.reshape(B, H, L, D)


_causal = threading.local()  # per thread: a server decodes in its own thread (see loading.materialize)
_additive = threading.local()


def additive(mask: mx.array, dtype: mx.Dtype) -> mx.array:
    """A mask as `attention` adds it to its scores, in log2 units (a bool mask: 0 or -inf; an
    additive one is in natural-log units). Made once per mask, not once per layer: the layers of a
    forward that attend alike are handed the same mask (mlx-lm makes one per kind of layer), and
    on the CPU each op costs more in dispatch than in arithmetic. The last two masks are kept,
    one per kind of layer (full, sliding) as they alternate."""
    held = getattr(_additive, "held", ())
    for known, dt, made in held:
        if known is mask and dt == dtype:
            return made
    if mask.dtype == mx.bool_:
        made = mx.where(mask, mx.array(0.0, dtype), mx.array(-mx.inf, dtype))
    else:
        made = mask * LOG2E
    _additive.held = (*held[-1:], (mask, dtype, made))
    return made


def causal_mask(L: int, S: int) -> mx.array:
    """The causal mask as `attention` adds it to its scores, [1, 1, 1, L, S], 0 or -inf (the
    same in any log base), made once per forward rather than once per layer: every layer of a
    forward asks for the same one, and on the CPU each of the few ops that make it costs more in
    dispatch than in arithmetic (bench/cpu_blas.py)."""
    if getattr(_causal, "shape", None) != (L, S):
        visible = mx.arange(S - L, S)[:, None] >= mx.arange(S)[None]
        mask = mx.where(visible, mx.array(0.0, mx.float32), mx.array(-mx.inf, mx.float32))
        _causal.mask, _causal.shape = mask.reshape(1, 1, 1, L, S), (L, S)
    return _causal.mask


def _mlx_lm_sdpa():
    from mlx_lm.models import base

    return base.scaled_dot_product_attention


def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx_lm.models.base.scaled_dot_product_attention's signature and cases."""
    if sinks is not None or hasattr(cache, "bits") or queries.dtype != mx.float32:
        return _mlx_lm_sdpa()(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
    return attention(queries, keys, values, scale, mask)


def install() -> bool:
    """Point every loaded mlx-lm model module at these (once per model load: a module imported
    later is covered by the next load). True when installed: MLX on the CPU only."""
    if mx.metal.is_available():
        return False
    from mlx_lm.models import activations, base

    for name, module in list(sys.modules.items()):
        if not name.startswith("mlx_lm.models.") or module is None:
            continue
        if getattr(module, "scaled_dot_product_attention", None) is base.scaled_dot_product_attention \
                and module is not base:
            module.scaled_dot_product_attention = scaled_dot_product_attention
        if getattr(module, "swiglu", None) is activations.swiglu and module is not activations:
            module.swiglu = swiglu
    return True
