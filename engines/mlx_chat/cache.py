"""Caches that roll back exactly, for speculative rounds.

A verify forward writes the last token and every draft into the target's cache; after the
verdict the rejected tail must go, leaving exactly what plain decoding of the accepted tokens
would hold (the Rollback contract).

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
- `SlotKVCache` (full-attention layers, MTP rounds launched before the last one's verdict is
  read): never rolled back. A rejected draft's slot stays in the buffer as a hole that every
  later query's mask hides, and the position a token is encoded at (RoPE) is its slot minus
  the holes before it -- both may still be in the graph, so the next verify can be built and
  queued while the device runs this one. What attention sees is exactly what plain decoding
  of the accepted tokens would hold; the buffer is longer by the holes.
- Anything else (recurrent ArraysCache, chunked caches...): not supported for speculation;
  `make_rollback_cache` raises UnsupportedCache naming the cache type, and the run
  decodes plainly.
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


class Holes:
    """Which slots of a run's SlotKVCaches hold live entries, shared by every layer (they all
    write the same slots). Slots past `declared` are live; `live` [declared] bool and `count`
    (the dead slots) may be lazy: a verdict the host has not read yet."""

    def __init__(self) -> None:
        self.live: mx.array | None = None
        self.declared = 0
        self.count: int | mx.array = 0

    def reject(self, first: int, drafts: int, accepted: mx.array) -> None:
        """A verify wrote its last token and `drafts` drafts at slots first.. ; the drafts past
        `accepted` (lazy or not) are holes."""
        parts = [] if self.live is None else [self.live]
        if first > self.declared:
            parts.append(mx.ones((first - self.declared,), dtype=mx.bool_))
        parts.append(mx.arange(drafts + 1) <= accepted)
        self.live = mx.concatenate(parts)
        self.declared = first + drafts + 1
        self.count = self.count + (drafts - accepted)

    def visible(self, written: int, length: int) -> mx.array:
        """[length] bool: the live slots among the first `written` (the rest: not written)."""
        parts = [] if self.live is None else [self.live[:written]]
        if written > self.declared:
            parts.append(mx.ones((written - self.declared,), dtype=mx.bool_))
        if length > written:
            parts.append(mx.zeros((length - written,), dtype=mx.bool_))
        return mx.concatenate(parts) if len(parts) > 1 else parts[0]


class SlotKVCache(KVCache):
    """A full-attention layer's cache whose rejected drafts stay as masked holes (see the
    module docstring). `slot` is the next slot written; `offset` -- what mlx-lm's attention
    reads as the next token's position -- is the slot minus the holes before it."""

    def __init__(self, holes: Holes):
        self.holes, self.slot = holes, 0
        super().__init__()

    @property
    def offset(self):
        return self.slot - self.holes.count

    @offset.setter
    def offset(self, value) -> None:  # KVCache.__init__ sets it; only ever 0
        if isinstance(value, int) and value == self.slot - self.holes.count:
            return
        raise RollbackError("a SlotKVCache's position follows its slots and holes")

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        first, n = self.slot, keys.shape[2]
        if self.keys is None or first + n > self.keys.shape[2]:
            B, heads, _, _ = keys.shape
            grow = (self.step + n - 1) // self.step * self.step
            new_k = mx.zeros((B, heads, grow, keys.shape[3]), keys.dtype)
            new_v = mx.zeros((B, heads, grow, values.shape[3]), values.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = mx.concatenate([self.keys[..., :first, :], new_k], axis=2)
                self.values = mx.concatenate([self.values[..., :first, :], new_v], axis=2)
        self.slot = first + n
        self.keys[..., first:self.slot, :] = keys
        self.values[..., first:self.slot, :] = values
        return self.keys[..., :self.slot, :], self.values[..., :self.slot, :]

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        """The N new queries (slots slot..slot+N-1, not yet written) see every live slot
        before them and each other causally."""
        if window_size is not None:
            raise UnsupportedCache("a SlotKVCache has no sliding window")
        if self.holes.live is None and not return_array:  # no holes yet: mlx-lm's own masks
            return None if N == 1 else "causal"
        causal = mx.tril(mx.ones((N, N), dtype=mx.bool_))
        before = mx.broadcast_to(self.holes.visible(self.slot, self.slot)[None], (N, self.slot))
        return mx.concatenate([before, causal], axis=1)

    def size(self) -> int:
        return self.slot

    def trim(self, n: int) -> int:
        raise RollbackError("a SlotKVCache is never rolled back: its rejected drafts are holes (Holes.reject)")

    def is_trimmable(self) -> bool:
        return False

    @property
    def state(self):
        return self.keys, self.values, self.slot

    @state.setter
    def state(self, v) -> None:
        raise RollbackError("a SlotKVCache is not restored from a state")


def make_slot_cache(model) -> list[SlotKVCache] | None:
    """Slot caches for a model whose every layer is plain full attention, else None (sliding
    windows, quantized or recurrent layers keep the rollback caches)."""
    layers = make_prompt_cache(model)
    if not layers or any(type(c) is not KVCache for c in layers):
        return None
    holes = Holes()
    return [SlotKVCache(holes) for _ in layers]


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
    if isinstance(c, KVCache):  # a SlotKVCache's holes: Holes.visible
        return c.keys, c.values, 0
    raise UnsupportedCache(f"MTP cannot read K/V from a {type(c).__name__} (quantized KV is not supported)")
