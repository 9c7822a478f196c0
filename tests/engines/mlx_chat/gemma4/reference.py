"""What the drafter should read, worked out the plain way, for the tests to compare against:
exact K/V slices in temporal order from mlx-lm's own caches (ring buffer included), where the
product reads whole buffers through masks (engines/batch/mtp.py, BatchMTP.view)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

from engines.mlx_chat.mtp import Gemma4Target


def cache_keys_values(c) -> tuple[mx.array, mx.array]:
    """A layer cache's keys/values [1, heads, n, dim] in temporal order, oldest first."""
    if isinstance(c, RotatingKVCache):
        # mlx-lm's ring buffer: only its private _temporal_order knows where the ring starts, and
        # mlx-lm has no public accessor. Kept on purpose: the reference must be mlx-lm's own
        # window; a release that renames it fails here with AttributeError, not silently.
        return c._temporal_order(c.keys), c._temporal_order(c.values)
    return c.keys[..., : c.offset, :], c.values[..., : c.offset, :]  # KVCache


def drafter_kv(target: Gemma4Target, cache: list) -> dict[str, tuple[mx.array, mx.array]]:
    """K/V the drafter reads after the last cached token, per attention type: every cached
    position for full attention, the last `sliding_window` of them for sliding attention."""
    kv = {}
    for kind, idx in target.kv_layers.items():
        keys, values = cache_keys_values(cache[idx])
        if kind == "sliding_attention":
            keys, values = keys[..., -target.sliding_window :, :], values[..., -target.sliding_window :, :]
        kv[kind] = (keys, values)
    return kv
