"""Caches of one sequence that roll back exactly: what `specscope tune` measures forwards of
many widths on (each one rolled back before the next), and what a drafter's training reads.
(The batch's rows roll back in its slot table: engines/batch/cache.py.)

A forward writes its tokens into the target's cache; a rollback drops the last n again, leaving
exactly what the cache held before (the Rollback contract).

- KVCache and QuantizedKVCache: `trim(n)` only moves the write offset back; the stale entries
  beyond it are never read and are overwritten by the next write. Exact.
- RotatingKVCache (sliding-window layers): `trim` is NOT exact once the window has wrapped.
  Its ring buffer keeps only `max_size` entries, so the verify chunk overwrites entries that
  a rolled-back sequence still needs, and after a multi-token update it keeps the rejected
  tail as if it were live. We replace it by `WindowKVCache`: a linear buffer in temporal
  order that keeps the last `window - 1 + slack` entries (slack >= the longest rollback), with
  a window mask built from absolute positions. Trimming then only moves the offset back, and
  `trim` refuses (raises) a rollback the kept entries could not honour, so it can never be
  silently inexact.
- Anything else (recurrent ArraysCache, chunked caches...): not supported;
  `make_rollback_cache` raises UnsupportedCache naming the cache type.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    CacheList,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from engines.types import EngineError

DEFAULT_SLACK = 16  # >= the longest rollback: MAX_STEPS drafts + the pending token(s)


class UnsupportedCache(EngineError):
    """This model's cache cannot roll back exactly: the run decodes plainly (the reason is
    the Round's note)."""


class RollbackError(RuntimeError):
    """A rollback was asked that the cache cannot perform exactly."""


class WindowKVCache:
    """A sliding-window KV cache that trims exactly (see module docstring).

    Positions are absolute: entry j of the buffer holds position `start + j`; `offset` is the
    next position (the count of tokens seen, as for every mlx-lm cache, so RoPE offsets are
    unchanged). A query at position p sees keys at positions (p - window, p].
    """

    step = 256

    def __init__(self, max_size: int, slack: int = DEFAULT_SLACK):
        self.max_size = max_size  # the attention window
        self.slack = slack
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.start = 0
        self.offset = 0

    # -- the plan of the next write, shared by make_mask and update_and_fetch ------------------
    def _drop_for(self, n_new: int) -> int:
        """How many of the oldest entries the next write of n_new tokens will drop. We drop
        only when the buffer is full, and keep the last window - 1 + slack entries: what the
        new queries need, plus room for any rollback of up to `slack` tokens afterwards."""
        live = self.offset - self.start
        if self.keys is not None and live + n_new <= self.keys.shape[2]:
            return 0
        return max(0, live - (self.max_size - 1 + self.slack))

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        n_new = keys.shape[2]
        drop = self._drop_for(n_new)
        live = self.offset - self.start
        if self.keys is None or live + n_new > self.keys.shape[2]:
            kept = live - drop
            capacity = (kept + n_new + self.step - 1) // self.step * self.step + self.step
            B, H, _, Dk = keys.shape
            new_k = mx.zeros((B, H, capacity, Dk), keys.dtype)
            new_v = mx.zeros((B, H, capacity, values.shape[3]), values.dtype)
            if self.keys is not None and kept > 0:
                new_k[..., :kept, :] = self.keys[..., drop:live, :]
                new_v[..., :kept, :] = self.values[..., drop:live, :]
            self.keys, self.values = new_k, new_v
            self.start += drop
            live = kept
        self.keys[..., live : live + n_new, :] = keys
        self.values[..., live : live + n_new, :] = values
        self.offset += n_new
        live += n_new
        if n_new == 1:  # one query: hand back exactly its window, so no mask is needed
            first = max(0, live - self.max_size)
            return self.keys[..., first:live, :], self.values[..., first:live, :]
        return self.keys[..., :live, :], self.values[..., :live, :]

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        window = window_size or self.max_size
        if N == 1 and window >= self.max_size:
            return None  # update_and_fetch returns only the window
        start = self.start + self._drop_for(N)
        if N == 1:
            start = max(start, self.offset + 1 - self.max_size)
        query_pos = mx.arange(self.offset, self.offset + N)[:, None]
        key_pos = mx.arange(start, self.offset + N)[None]
        return (key_pos <= query_pos) & (key_pos > query_pos - window)

    def trim(self, n: int) -> int:
        n = min(n, self.offset - self.start)
        new_offset = self.offset - n
        # the next query (at new_offset) needs positions from new_offset - window + 1 on
        if self.start > 0 and new_offset - self.max_size + 1 < self.start:
            raise RollbackError(
                f"sliding-window rollback of {n} tokens exceeds the kept slack ({self.slack})"
            )
        self.offset = new_offset
        return n

    def is_trimmable(self) -> bool:
        return True

    def size(self) -> int:
        return min(self.offset, self.max_size)

    def empty(self) -> bool:
        return self.keys is None

    @property
    def state(self):
        live = self.offset - self.start
        return self.keys[..., :live, :], self.values[..., :live, :]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


def _convert(c: Any, slack: int) -> Any:
    if isinstance(c, (KVCache, QuantizedKVCache, WindowKVCache)):
        return c
    if isinstance(c, RotatingKVCache):
        if c.keep:
            raise UnsupportedCache(
                f"speculation needs exact rollback; a sliding-window cache with keep={c.keep} "
                "(attention sinks) is not supported"
            )
        return WindowKVCache(c.max_size, slack)
    if isinstance(c, CacheList):
        return CacheList(*[_convert(x, slack) for x in c.caches])
    raise UnsupportedCache(
        f"this model's {type(c).__name__} cache (recurrent or hybrid layers) cannot roll back "
        "exactly, so it decodes plainly"
    )


def make_rollback_cache(model, slack: int = DEFAULT_SLACK) -> list[Any]:
    """The model's own cache layout with every layer's cache made exactly trimmable."""
    return [_convert(c, slack) for c in make_prompt_cache(model)]


def rollback(cache: list[Any], n: int) -> None:
    """Drop the last n positions of every layer (the rejected drafts)."""
    if n <= 0:
        return
    for c in cache:
        c.trim(n)


def cache_arrays(cache: list[Any]) -> list[mx.array]:
    """Arrays to evaluate so the cache is materialised (after prefill chunks)."""
    out = []
    for c in cache:
        for x in (c.caches if isinstance(c, CacheList) else [c]):
            if getattr(x, "keys", None) is not None:
                out.extend([x.keys, x.values] if not isinstance(x.keys, (tuple, list)) else [*x.keys, *x.values])
    return out


def cache_buffer(c) -> tuple[mx.array, mx.array, int]:
    """A rollback cache's whole K/V buffers, as written (rejected drafts and unused capacity
    included), and the position held by their first entry."""
    if isinstance(c, WindowKVCache):  # entry j holds position start + j
        return c.keys, c.values, c.start
    if isinstance(c, KVCache):
        return c.keys, c.values, 0
    raise UnsupportedCache(f"MTP cannot read K/V from a {type(c).__name__} (quantized KV is not supported)")
