"""The batch's KV cache: every row rolls back on its own, and nothing moves to do it.

Layout. Each attention layer keeps one buffer [B, H, S, D]: a row per sequence, a slot per
column. A `SlotTable` (one per kind of layer: full attention, or one sliding window) holds,
for every row and slot, the position in that row's sequence of the token stored there, or -1
for a slot the row must never read. The attention mask is computed from those positions
alone -- key visible iff it is live, not after the query, and (windowed layers) less than a
window behind it -- so a slot dies by writing -1 into the table:

- rows that join with shorter prompts are left-padded with dead slots;
- in a verify forward every row writes the same number of slots (1 + the longest draft);
  a row that drafted less, and a row whose drafts were rejected, marks its tail dead
  (`settle`). That is the per-sequence rollback: exact, O(B) host work, no copy;
- RoPE reads each row's own next position (`offset`, an array [B], as mlx-lm's
  BatchKVCache gives it), so positions stay those of plain decoding of the accepted tokens.

A step may be launched before the last step's verdict is read (a lone MTP stream, where the
device would otherwise wait for the host): that step's kept counts are then still in the graph.
`defer` holds them lazily -- its slots are live iff before the row's lazy count, and the next
forward's RoPE offsets and masks are built from them in the graph -- until `settle` hands over
the same counts as host ints. At most one forward is deferred at a time.

Dead slots cost attention work until `compact` gathers each row's live slots to the right of
a narrower buffer (and drops what a sliding window can no longer see). It runs only when the
dead share is large, so its copy is amortised over many steps. Columns every row's window has
left are not read meanwhile: a windowed table's layers read from the first column a query can
see (`first_read`).

Why not mlx-lm's BatchKVCache as it is: its mask is made from one write cursor and left
padding, so it cannot hide a rejected tail in the middle of a row (the mlx-lm server plan's
"conflict 2"); `trim(n)` cuts every row alike. The alternative the plan names -- trim every row
to the shortest accepted prefix and re-forward the rest -- costs a second forward on most
steps; docs/benchmarks.md has both measured (bench/batch_rollback.py).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from engines.types import EngineError

DEAD = -1
STEP = 256  # buffer growth, in slots (as mlx-lm's caches grow)


class UnbatchableModel(EngineError):
    """This model's caches (recurrent, quantized, attention sinks...) cannot be batched here."""


class SlotTable:
    """Token positions per (row, slot) for the layers that share one attention pattern."""

    def __init__(self, rows: int, window: int | None = None):
        self.window = window  # None = full attention
        self.pos = np.full((rows, 0), DEAD, dtype=np.int64)  # a view of `held`, once settled
        self.held = self.pos
        self.next_pos = np.zeros(rows, dtype=np.int64)  # per row: the next token's position
        self.width = 0  # slots written by the forward in flight (0 between forwards)
        self.deferred: tuple[int, mx.array] | None = None  # (width, kept [B] lazy) of a forward written before it
        self.deferred_keys: mx.array | None = None  # key_positions() while deferred
        self.compactions = 0
        self.offsets: mx.array | None = None  # next_pos as an array, for the forward in flight
        self.first = 0  # the first column the forward in flight reads (see first_read)
        self.first_floor: int | None = None  # a column at or before the next first_read (None: unknown)
        self.layers: list[SlotKVCache] = []

    @property
    def rows(self) -> int:
        return self.pos.shape[0]

    @property
    def size(self) -> int:
        """Slots written before the forward in flight (a deferred forward's included)."""
        return self.pos.shape[1] + (self.deferred[0] if self.deferred else 0)

    # -- one forward ------------------------------------------------------------------------
    def begin(self, width: int, offsets: mx.array | None = None) -> None:
        """A forward of `width` tokens per row is about to run. Its RoPE offsets are made
        once here, not by each layer that asks (`offsets`: made already, by another table:
        every table of a cache holds the same rows at the same positions)."""
        self.width = width
        self.offsets = offsets if offsets is not None else \
            mx.array(self.next_pos, dtype=mx.int32) + (self.deferred[1] if self.deferred else 0)
        self.first = self.first_read()

    def first_read(self) -> int:
        """The first column any query of the next forward can see. In a windowed table the
        columns before it hold only positions every row's window has left behind: the layers
        read from here on, so a lone stream past its window attends to the window alone,
        unmasked, as mlx-lm's rotating cache has it (not to dead columns hidden by a mask).

        Found by stepping on from the last one found (`first_floor`): a row's live positions
        rise from column to column and next_pos only grows between forwards, so that column
        stays a lower bound -- until rows join, a row rolls back or columns move (compact),
        which forget it. A step then looks at one or two columns; searching every column took a
        tenth of a lone stream's host work per step."""
        if not self.window or not self.pos.shape[1]:
            return 0
        # (a deferred forward's queries come after next_pos: what next_pos's window has left, theirs has)
        left_behind = self.next_pos - self.window  # per row: a position at or below it is not seen
        if self.first_floor is None:
            seen = (self.pos > left_behind[:, None]).any(axis=0)
            self.first_floor = int(seen.argmax()) if seen.any() else self.pos.shape[1]
            return self.first_floor
        column, columns = self.first_floor, self.pos.shape[1]
        if self.rows == 1:
            row, threshold = self.pos[0], int(left_behind[0])
            while column < columns and row[column] <= threshold:
                column += 1
        else:
            while column < columns and not (self.pos[:, column] > left_behind).any():
                column += 1
        self.first_floor = column
        return column

    def new_positions(self) -> np.ndarray:
        return self.next_pos[:, None] + np.arange(self.width)[None]

    def key_positions(self) -> np.ndarray | mx.array:
        """[B, size]: the position held by each written slot, or DEAD -- in the graph while a
        forward is deferred."""
        if self.deferred is None:
            return self.pos
        if self.deferred_keys is None:  # made once a deferred forward: the masks and an MTP view read it
            width, kept = self.deferred
            j = mx.arange(width)[None]
            held = mx.where(j < kept[:, None], mx.array(self.next_pos)[:, None] + j, DEAD)
            self.deferred_keys = mx.concatenate([mx.array(self.pos), held], axis=1)
        return self.deferred_keys

    def mask(self, n: int, window: int | None) -> mx.array | str | None:
        """[B, 1, n, size - first + n] bool: which keys each query of the forward may read. When
        every slot read is live and inside the window, every query reads all keys before it: no
        mask for one token, "causal" for more (as mlx-lm's own caches say), so the attention
        adds nothing -- a lone request's plain decoding, and any batch between rejections."""
        assert n == self.width, "a forward's width must be announced with begin()"
        window = window or self.window
        pos = self.pos[:, self.first:]
        if self.deferred is None and (pos.size == 0 or pos.min() >= 0) \
                and (not window or pos.shape[1] + n <= window):
            return None if n == 1 else "causal"
        if self.deferred is None:
            q = self.new_positions()  # [B, n]
            k = np.concatenate([pos, q], axis=1)  # [B, S - first + n]
        else:
            q = self.offsets[:, None] + mx.arange(n)[None]
            k = mx.concatenate([self.key_positions()[:, self.first:], q], axis=1)
        k, q = k[:, None, :], q[:, :, None]
        ok = (k >= 0) & (k <= q)
        if window:
            ok = ok & (k > q - window)
        return mx.array(ok[:, None]) if isinstance(ok, np.ndarray) else ok[:, None]

    def rollback(self, counts: list[int]) -> None:
        """Row b forgets its last counts[b] tokens (a drafter's rejected drafts)."""
        counts = np.asarray(counts)
        self.pos[self.pos >= (self.next_pos - counts)[:, None]] = DEAD
        self.next_pos = self.next_pos - counts
        self.first_floor = None

    def settle(self, kept: list[int]) -> None:
        """After the forward (the deferred one, if any): row b keeps the first kept[b] of the
        slots it wrote (its pending token and accepted drafts); the rest -- rejected drafts,
        padding -- die. A step's slots are made without numpy's broadcasting: on MLX's CPU
        backend the step's compute evicts that code from the caches, and the first broadcast
        after a forward cost 0.1-0.2 ms of host CPU in each lone MTP round (bench/mtp_overlap.py's
        small Gemma 4), against ~0.05 ms for the whole settle made so."""
        if self.deferred is not None:
            (width, _), self.deferred, self.deferred_keys = self.deferred, None, None
        else:
            width, self.width = self.width, 0
        if width == 1 and all(kept):  # a plain step: every row keeps its one slot
            new = self.next_pos[:, None]
        else:  # in Python (see above); a prompt's chunk too, whose forward costs far more
            new = np.array([[start + i if i < keep else DEAD for i in range(width)]
                            for start, keep in zip(self.next_pos.tolist(), kept)], dtype=np.int64).reshape(-1, width)
        self._append(new)
        self.next_pos = self.next_pos + np.asarray(kept)

    def _append(self, columns: np.ndarray) -> None:
        """`columns` written after pos's, in place in a buffer grown STEP columns at a time (as
        the layers' K/V are): a step's few slots are one copy, not a copy of the whole table."""
        size, width = self.pos.shape[1], columns.shape[1]
        if self.pos.base is not self.held or size + width > self.held.shape[1]:  # (pos replaced: compact, a join...)
            capacity = (size + width + STEP - 1) // STEP * STEP
            self.held = np.full((self.pos.shape[0], capacity), DEAD, dtype=np.int64)
            self.held[:, :size] = self.pos
        self.held[:, size:size + width] = columns
        self.pos = self.held[:, :size + width]

    def defer(self, kept: mx.array) -> None:
        """The forward in flight keeps kept[b] slots per row, a count still in the graph: the
        next forward may begin now; `settle` takes the same counts once read."""
        assert self.deferred is None, "one forward at a time is deferred"
        self.deferred, self.width, self.deferred_keys = (self.width, kept), 0, None

    def abandon(self) -> None:
        """The forward in flight is dropped unread: its slots are written over by the next."""
        self.width = 0

    # -- rows and slots ----------------------------------------------------------------------
    def keep_mask(self) -> np.ndarray:
        """Slots some future query may still read. A windowed row keeps one position more than
        its next query sees: an MTP drafter's sliding layers read the window of the row's
        last kept token (engines/batch/mtp.py)."""
        live = self.pos >= 0
        if self.window:
            live &= self.pos >= (self.next_pos[:, None] - self.window)
        return live

    def reclaimable(self) -> int:
        """Columns a compaction would free: the width beyond the row that keeps most slots.
        Counted from next_pos, not the table: a row's live slots hold each of its positions
        once (settle appends the kept ones, rollback kills the last ones, compaction drops only
        dead slots and positions no query sees again), so a row keeps next_pos slots, at most
        `window` in a windowed table. Fewer where a rollback reached past a compaction (the
        prompt cache's): compacting later then, never wrongly."""
        most = max(self.next_pos.tolist(), default=0)
        return self.size - (min(most, self.window) if self.window else most)

    def compact(self) -> None:
        """Gather every row's live slots, in order, to the right of a buffer just wide enough
        for the longest row (left padding dead). One gather per layer."""
        assert not self.width and self.deferred is None, "no compaction under a forward in flight"
        keep = self.keep_mask()
        width = int(keep.sum(axis=1).max()) if self.rows else 0
        index = np.zeros((self.rows, width), dtype=np.int64)
        pos = np.full((self.rows, width), DEAD, dtype=np.int64)
        for b in range(self.rows):
            slots = np.flatnonzero(keep[b])
            index[b, width - len(slots):] = slots
            pos[b, width - len(slots):] = self.pos[b, slots]
        gather = mx.array(index)
        for layer in self.layers:
            layer.gather(gather)
        self.pos = pos
        self.first_floor = None
        self.compactions += 1

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (sequences that left are dropped), then drop all-dead columns."""
        self.pos, self.next_pos, self.first_floor = self.pos[rows], self.next_pos[rows], None
        for layer in self.layers:
            layer.select(mx.array(rows))
        if self.rows:
            self.compact()

    def append_rows(self, other: "SlotTable") -> None:
        """Join `other`'s rows (a sequence prefilled on its own) below ours."""
        assert not self.width and self.deferred is None, "rows join between forwards"
        width = max(self.size, other.size)
        for layer, theirs in zip(self.layers, other.layers):
            layer.append_rows(theirs, width - self.size, width - other.size)
        pad = lambda p, n: np.concatenate([np.full((p.shape[0], n), DEAD, dtype=np.int64), p], axis=1)
        self.pos = np.concatenate([pad(self.pos, width - self.size), pad(other.pos, width - other.size)])
        self.next_pos = np.concatenate([self.next_pos, other.next_pos])
        self.first_floor = None


class SlotKVCache:
    """One attention layer's keys and values, laid out by its SlotTable. mlx-lm's attention
    calls update_and_fetch / make_mask and reads offset, as with its own caches."""

    def __init__(self, table: SlotTable):
        self.table = table
        table.layers.append(self)
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def offset(self) -> mx.array:
        return self.table.offsets  # [B]: each row's own RoPE position (set by begin)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **_):
        return self.table.mask(N, window_size)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        start, n = self.table.size, keys.shape[2]
        if self.keys is None or start + n > self.keys.shape[2]:
            self._grow(keys, values, start + n)
        self.keys[..., start:start + n, :] = keys
        self.values[..., start:start + n, :] = values
        first = self.table.first
        return self.keys[..., first:start + n, :], self.values[..., first:start + n, :]

    def _grow(self, keys: mx.array, values: mx.array, needed: int) -> None:
        capacity = (needed + STEP - 1) // STEP * STEP
        B, H, _, Dk = keys.shape
        new_k = mx.zeros((B, H, capacity, Dk), keys.dtype)
        new_v = mx.zeros((B, H, capacity, values.shape[3]), values.dtype)
        if self.keys is not None:
            old = self.table.size
            new_k[..., :old, :] = self.keys[..., :old, :]
            new_v[..., :old, :] = self.values[..., :old, :]
        self.keys, self.values = new_k, new_v

    def gather(self, index: mx.array) -> None:
        """index [B, W]: slot j of row b becomes slot index[b, j]."""
        if self.keys is None:
            return
        idx = index[:, None, :, None]
        self.keys = mx.take_along_axis(self.keys[..., :self.table.size, :], idx, axis=2)
        self.values = mx.take_along_axis(self.values[..., :self.table.size, :], idx, axis=2)

    def select(self, rows: mx.array) -> None:
        if self.keys is not None:
            self.keys, self.values = self.keys[rows], self.values[rows]

    def append_rows(self, other: "SlotKVCache", pad_ours: int, pad_theirs: int) -> None:
        def used(c: SlotKVCache, pad: int):
            k, v = c.keys[..., :c.table.size, :], c.values[..., :c.table.size, :]
            if pad:
                widths = [(0, 0), (0, 0), (pad, 0), (0, 0)]
                k, v = mx.pad(k, widths), mx.pad(v, widths)
            return k, v

        if other.keys is None:
            if self.keys is None:  # a layer this process does not run (a pipeline stage's others)
                return
            raise ValueError("a sequence joins the batch only after its prompt is read")
        if self.keys is None:  # the batch was empty
            self.keys, self.values = used(other, pad_theirs)
            return
        k1, v1 = used(self, pad_ours)
        k2, v2 = used(other, pad_theirs)
        self.keys, self.values = mx.concatenate([k1, k2]), mx.concatenate([v1, v2])

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class BatchCache:
    """The model's cache list for a batch: one SlotKVCache per layer, grouped by SlotTable."""

    def __init__(self, model: Any, rows: int):
        self.tables: list[SlotTable] = []
        self.layers: list[SlotKVCache] = []
        by_window: dict[int | None, SlotTable] = {}
        for c in make_prompt_cache(model):
            window = _window_of(c)
            if window not in by_window:
                by_window[window] = SlotTable(rows, window)
                self.tables.append(by_window[window])
            self.layers.append(SlotKVCache(by_window[window]))

    @property
    def rows(self) -> int:
        return self.tables[0].rows

    def begin(self, width: int) -> None:
        offsets = None
        for t in self.tables:
            t.begin(width, offsets)
            offsets = t.offsets

    def settle(self, kept: list[int]) -> None:
        for t in self.tables:
            t.settle(kept)

    def defer(self, kept: mx.array) -> None:
        for t in self.tables:
            t.defer(kept)

    def abandon(self) -> None:
        for t in self.tables:
            t.abandon()

    @property
    def deferred(self) -> bool:
        return self.tables[0].deferred is not None

    def rollback(self, counts: list[int]) -> None:
        for t in self.tables:
            t.rollback(counts)

    def compact_if_sparse(self, share: float = 0.25, min_slots: int = 64) -> None:
        """Compact a table once a quarter of its width (and at least 64 columns) is dead in
        every row: each step's attention then stops paying for slots no query reads. Never
        under a forward in flight (a step launched ahead): its slots are not in the table yet.
        Looked at every step: reclaimable() reads no table."""
        if self.tables[0].width or self.deferred:
            return
        for t in self.tables:
            free = t.reclaimable()
            if free >= min_slots and free >= share * t.size:
                t.compact()

    def select(self, rows: list[int]) -> None:
        for t in self.tables:
            t.select(rows)

    def append_rows(self, other: "BatchCache") -> None:
        for mine, theirs in zip(self.tables, other.tables):
            mine.append_rows(theirs)

    def arrays(self) -> list[mx.array]:
        return [a for c in self.layers if c.keys is not None for a in (c.keys, c.values)]

    def clone(self, model: Any) -> "BatchCache":
        """An independent copy (n choices of one request share its prompt's prefill). A cache
        write rebinds the writer's array, so the copies may share buffers until then."""
        twin = BatchCache(model, self.rows)
        for mine, theirs in zip(self.tables, twin.tables):
            theirs.pos, theirs.next_pos = mine.pos.copy(), mine.next_pos.copy()
        for mine, theirs in zip(self.layers, twin.layers):
            if mine.keys is not None:
                theirs.keys, theirs.values = mine.keys[...], mine.values[...]
        return twin

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.layers)


def _window_of(c: Any) -> int | None:
    if type(c) is KVCache:
        return None
    if type(c) is RotatingKVCache and not c.keep:
        return c.max_size
    raise UnbatchableModel(f"this model's {type(c).__name__} cache cannot be batched "
                           "(batching supports attention layers with a KV or sliding-window cache)")


def kv_bytes_per_token(model: Any) -> int:
    """KV-cache bytes one token of one sequence takes, measured: one token through a one-row
    batch cache (every layer, in the dtype the model writes)."""
    cache = BatchCache(model, 1)
    cache.begin(1)
    model(mx.array([[0]], dtype=mx.uint32), cache=cache.layers)
    cache.settle([1])
    mx.eval(cache.arrays())
    return sum(c.keys[..., :1, :].nbytes + c.values[..., :1, :].nbytes for c in cache.layers if c.keys is not None)


def check_batchable(model: Any) -> None:
    """Raises UnbatchableModel, naming the cache, for a model the batch cannot hold."""
    for c in make_prompt_cache(model):
        _window_of(c)
