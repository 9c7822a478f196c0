"""The fast PyTorch runtime: GLM-OCR on transformers' own modules, in their standard layouts,
for machines without Core ML (Linux, and a Mac before conversion). Faster on a CPU than the Core
ML twin (runtime_torch.py): exactly the rows a call is given (no fixed 8-row window, no
channels-first convolutions, no chunked LM head), the vision convolutions as products
(`PatchProduct`), weights held once in the compute dtype (weights.load_model: a float32 load
peaks at 5.0 GB). Its caches: `KVCache`, `BatchKV` (many sequences in one forward, batch.py),
one MTP cache per sequence (`new_mtp_cache`, for `MtpModule`). The engine's interface
(runtime.py) stays NumPy float32 rows; cos / sin are re-laid out here (`_rope`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from engines.types import EngineError
from engines.glm_ocr.config import GlmOcrConfig
from engines.glm_ocr.weights import load_model, load_with_mtp, mtp_missing_reason

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The compute dtype when the caller chooses none (`specscope ocr --dtype`). Why not bfloat16,
# though it decodes 1.24x faster here and holds the weights in 2.3 GB instead of 6.9
# (docs/benchmarks.md): in bfloat16 a verify forward of 1 + k rows rounds differently from a
# one-row step, so at published shapes speculation emits other tokens than plain bfloat16
# decoding -- it breaks the lossless promise (T=0 output equals plain greedy decoding). bfloat16
# is there for who accepts that.
DEFAULT_DTYPE = "float32"


class KVCache:
    """A rollback-safe KV cache in transformers' Cache protocol (the attention layers only call
    `update`). The runtime sets `position` before each forward; every layer writes its new
    rows there and attends to rows [0, position + n). Rows past that are never read and are
    overwritten by the next write: cropping is setting `position`."""

    def __init__(self, step: int = 256):
        self.step = step
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.position = 0

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        start, end = self.position, self.position + key_states.shape[2]
        keys, values = self.keys.get(layer_idx), self.values.get(layer_idx)
        if keys is None or keys.shape[2] < end:  # grow: amortised, and only the valid rows move
            capacity = max(end, 2 * (keys.shape[2] if keys is not None else 0), self.step)
            shape = key_states.shape[:2] + (capacity, key_states.shape[3])
            new_k, new_v = key_states.new_empty(shape), value_states.new_empty(shape)
            if keys is not None:
                new_k[:, :, :start] = keys[:, :, :start]
                new_v[:, :, :start] = values[:, :, :start]
            keys, values = self.keys[layer_idx], self.values[layer_idx] = new_k, new_v
        keys[:, :, start:end] = key_states
        values[:, :, start:end] = value_states
        return keys[:, :, :end], values[:, :, :end]

    def reset(self) -> None:
        self.keys.clear()
        self.values.clear()
        self.position = 0


class BatchKV:
    """The K/V of a batch of sequences, in transformers' Cache protocol: per layer one
    [B, H, capacity, D] buffer shared by the rows. Row b holds its verified rows in slots
    0 .. lengths[b] - 1. A forward of width W (the longest row's inputs; shorter rows
    right-padded) writes row b's inputs at slots lengths[b] .. lengths[b] + W - 1, and each
    input attends to its own row's slots up to itself (`begin`'s [B, 1, W, L] mask). After the
    verdict `settle` moves each row's length past the rows it keeps: the slots of its rejected
    drafts and of its padding are overwritten by its next write and never read before.

    Buffers start zeroed and grow zeroed: slots a row never wrote (another row is longer) sit
    under its mask, and a masked slot must hold a finite number -- SDPA adds the mask as
    -inf, and NaN + -inf is NaN."""

    def __init__(self, step: int = 256):
        self.step = step
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.lengths: list[int] = []
        self._slots: torch.Tensor | None = None  # this forward's write slots, [B, W]

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def begin(self, width: int) -> torch.Tensor:
        """A forward of `width` inputs per row: where each row writes, and the mask of what each
        input sees, [B, 1, W, L] with L = the longest row's length + W."""
        lengths = torch.tensor(self.lengths)
        self._slots = lengths[:, None] + torch.arange(width)[None, :]
        self._span = max(self.lengths) + width
        return (torch.arange(self._span)[None, None, :] <= self._slots[:, :, None])[:, None]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = self._room(layer_idx, key_states, value_states, self._span)
        rows = torch.arange(self.rows)[:, None]
        keys[rows, :, self._slots] = key_states.transpose(1, 2)  # [B, W, H, D] at [b, :, slot]
        values[rows, :, self._slots] = value_states.transpose(1, 2)
        return keys[:, :, : self._span], values[:, :, : self._span]

    def _room(self, layer_idx: int, key_states, value_states, end: int):
        """The layer's buffers, grown (zeroed, amortised) to hold `end` slots."""
        keys, values = self.keys.get(layer_idx), self.values.get(layer_idx)
        if keys is None or keys.shape[2] < end:
            capacity = max(end, 2 * (keys.shape[2] if keys is not None else 0), self.step)
            shape = (self.rows, key_states.shape[1], capacity, key_states.shape[3])
            new_k, new_v = key_states.new_zeros(shape), value_states.new_zeros(shape)
            if keys is not None:
                new_k[:, :, : keys.shape[2]] = keys
                new_v[:, :, : values.shape[2]] = values
            keys, values = self.keys[layer_idx], self.values[layer_idx] = new_k, new_v
        return keys, values

    def settle(self, kept: list[int]) -> None:
        """Each row keeps its first kept[b] inputs of the last forward."""
        self.lengths = [n + k for n, k in zip(self.lengths, kept)]

    def join(self, alone: KVCache, length: int) -> None:
        """A new last row: the first `length` rows of a sequence's own cache (its prompt,
        prefilled alone)."""
        for layer, k in alone.keys.items():
            v = alone.values[layer]
            keys, values = self.keys.get(layer), self.values.get(layer)
            if keys is not None:
                keys, values = self._room(layer, keys, values, length)
            capacity = keys.shape[2] if keys is not None else max(length, self.step)
            row_k = k.new_zeros((1, k.shape[1], capacity, k.shape[3]))
            row_v = v.new_zeros(row_k.shape)
            row_k[:, :, :length], row_v[:, :, :length] = k[:, :, :length], v[:, :, :length]
            self.keys[layer] = row_k if keys is None else torch.cat([keys, row_k])
            self.values[layer] = row_v if values is None else torch.cat([values, row_v])
        self.lengths.append(length)

    def select(self, keep: list[int]) -> None:
        """Only the rows `keep` stay (in that order): the others left the batch."""
        index = torch.tensor(keep, dtype=torch.long)
        for layer in self.keys:
            self.keys[layer] = self.keys[layer].index_select(0, index)
            self.values[layer] = self.values[layer].index_select(0, index)
        self.lengths = [self.lengths[b] for b in keep]


class EmbeddingRows:
    """The model's embedding table seen as the engine's (vocab, hidden) float32 array: rows
    come out as float32 NumPy, the table itself stays the model's (one copy, compute dtype)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.shape = tuple(weight.shape)

    def __getitem__(self, ids) -> np.ndarray:
        return self.weight[torch.as_tensor(np.asarray(ids), dtype=torch.long)].float().numpy()

    def __len__(self) -> int:
        return self.shape[0]


class PatchProduct(nn.Module):
    """A convolution whose kernel covers its whole input and whose stride is the kernel --
    GLM-OCR's patch embedding (3 x 2 x 14 x 14 pixels -> 1024) and its 2 x 2 patch merge
    (1024 x 2 x 2 -> 1536) -- as the one matrix product it computes, over the convolution's
    own weight (a view: no copy). Why: torch's CPU convolution takes a slow path for these
    shapes (the merge's input is a permuted view): at the 448 x 448 page the merge ran 106 ms
    and the patch embedding 44 ms, as products 9 and 6 ms; on the fixture page 12 + 3 ms vs
    2 + 1. The sums run in another order, so features differ from the convolution's in the
    last bits (4e-6 at most here), far below what moves a token."""

    def __init__(self, conv: nn.Conv2d | nn.Conv3d):
        super().__init__()
        assert conv.stride == conv.kernel_size and not any(conv.padding) and conv.groups == 1, conv
        self.kernel = tuple(conv.kernel_size)
        self.weight, self.bias = conv.weight, conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, in, *kernel) -> (N, out)
        assert tuple(x.shape[2:]) == self.kernel, (x.shape, self.kernel)
        return F.linear(x.reshape(x.shape[0], -1), self.weight.reshape(self.weight.shape[0], -1), self.bias)


class MtpModule(nn.Module):
    """GLM-OCR's MTP layer on transformers' modules (weights.build_mtp_reference): row i takes
    the previous hidden state and the next token's embedding; embeddings at cache row 0 are
    zeroed (vLLM's position-0 masking). Returns (block output, shared_head-normed output)."""

    def __init__(self, parts: dict):
        super().__init__()
        self.layer = parts["layer"]
        self.enorm, self.hnorm = parts["enorm"], parts["hnorm"]
        self.eh_proj = parts["eh_proj"]
        self.shared_head_norm = parts["shared_head_norm"]

    def forward(self, previous_hidden, embeds, cache_position: int, position_embeddings, mask, cache):
        if cache_position == 0:
            embeds = embeds.clone()
            embeds[:, 0] = 0.0
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(previous_hidden)], dim=-1))
        hidden = self.layer(x, position_embeddings=position_embeddings, attention_mask=mask, cache=cache)
        return hidden, self.shared_head_norm(hidden)


@contextlib.contextmanager
def intra_op_threads(n: int | None):
    """torch's intra-op threads for one stage (None: leave them as they are -- torch's own, one
    per core: 1.6x (decode) and 1.9x (vision) one thread's speed on an idle 2-core machine; on a
    machine kept busy by other work each op waits for its slower half, and one thread is the
    safer choice, docs/benchmarks.md; `specscope ocr --threads`)."""
    if not n or n == torch.get_num_threads():
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class FastRuntime:
    name = "torch"
    compute_units = "cpu"

    def __init__(self, model: nn.Module, config: GlmOcrConfig, mtp: MtpModule | None, mtp_reason: str | None,
                 cache_length: int, dtype: torch.dtype, threads: int | None):
        self.model = model
        self.visual = model.model.visual
        self.visual.patch_embed.proj = PatchProduct(self.visual.patch_embed.proj)
        self.visual.downsample = PatchProduct(self.visual.downsample)
        self.lm = model.model.language_model
        self.lm_head = model.lm_head
        self.mtp_module = mtp
        self.config = config
        self.dtype = dtype
        self.dtype_name = str(dtype).removeprefix("torch.")
        # rows per round forward: 1 + up to 7 drafts (the engine caps k at seq_len - 1)
        self.seq_len = 8
        # the prompt goes through in one forward: a growing cache has no chunk size to respect
        self.prefill_len = cache_length
        self.cache_length = cache_length
        self.embeddings = EmbeddingRows(self.lm.embed_tokens.weight)
        self.mtp_unavailable = mtp_reason
        self.threads = threads  # torch's intra-op threads for each stage; None: torch's own
        self.cache, self.mtp_cache = KVCache(), KVCache()

    def kv_bytes_per_token(self) -> int:
        """K/V bytes one token of one sequence takes: every decoder layer's keys and values in the
        compute dtype, and the MTP layer's when it drafts (each sequence keeps its own MTP cache)."""
        t = self.config.text
        layers = t.num_hidden_layers + (self.mtp_module is not None)
        return layers * 2 * t.num_key_value_heads * t.head_dim * self.dtype.itemsize

    def weights_bytes(self) -> int:
        modules = [self.model] + ([self.mtp_module] if self.mtp_module is not None else [])
        return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())

    @classmethod
    def load(cls, model_dir: str | os.PathLike, cache_length: int = 8192, dtype: str | None = None,
             threads: int | None = None, **_twin_options) -> "FastRuntime":
        """`dtype`: float32 | bfloat16 | float16 (default: DEFAULT_DTYPE). `threads`: torch's
        intra-op threads for decode and the vision tower, the process's own count restored after
        each (default: torch's own). `seq_len`, a Core ML twin option, is accepted and ignored:
        this runtime has no fixed window."""
        model_dir = Path(model_dir)
        if not any(model_dir.glob("*.safetensors")):
            raise EngineError(f"the torch runtime needs a Hugging Face GLM-OCR checkpoint; {model_dir} has no safetensors")
        dtype = dtype or DEFAULT_DTYPE
        if dtype not in DTYPES:
            raise EngineError(f"unknown dtype {dtype!r} (expected {', '.join(DTYPES)})")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise EngineError(f"threads must be a whole number, at least 1; got {threads!r}")
        config = GlmOcrConfig.load(model_dir)
        model, reference = load_with_mtp(model_dir, config, lambda: load_model(model_dir, DTYPES[dtype]))
        mtp = None
        if reference is not None:
            mtp = MtpModule(reference).to(DTYPES[dtype]).eval()
            mtp.requires_grad_(False)
        return cls(model, config, mtp, mtp_missing_reason(model_dir, config, mtp is not None), cache_length,
                   DTYPES[dtype], threads)

    # -- the Runtime interface ------------------------------------------------------------------

    @torch.no_grad()
    def encode_image(self, pixel_values, grid_thw):
        grid = torch.tensor([[int(x) for x in grid_thw]])
        with intra_op_threads(self.threads):
            out = self.visual(torch.from_numpy(np.asarray(pixel_values, dtype=np.float32)).to(self.dtype), grid_thw=grid)
        return out.pooler_output.float().numpy()

    def reset(self) -> None:
        self.cache.reset()
        self.mtp_cache.reset()

    def new_mtp_cache(self) -> KVCache:
        """A sequence's own MTP cache (MtpDrafter keeps one): drafters of a batch's rows never
        share rows."""
        return KVCache()

    @torch.no_grad()
    def decode(self, embeds, cache_position, cos, sin, cache: KVCache | None = None):
        """`cache`: the one to write (default: the runtime's own, OcrEngine.prefill / forward's)."""
        n = embeds.shape[0]
        assert 1 <= n and cache_position + n <= self.cache_length, (n, cache_position)
        cache = self.cache if cache is None else cache
        x = self._rows(embeds)
        rope, mask = self._rope(cos, sin), self._mask(cache_position, n)
        cache.position = cache_position  # the rollback: rows from here on are rewritten
        with intra_op_threads(self.threads):
            for layer in self.lm.layers:
                x = layer(x, position_embeddings=rope, attention_mask=mask, cache=cache)
            return self.lm.norm(x)[0].float().numpy()

    # -- the batch (batch.py): many sequences, one forward -----------------------------------

    def prefill(self, embeds, cos, sin) -> tuple[np.ndarray, KVCache]:
        """A joining sequence's prompt read alone, in a cache of its own (BatchKV.join copies it
        into the batch): the same forward whether the page is read alone or beside others, so the
        same first token."""
        cache = KVCache()
        return self.decode(embeds, 0, cos, sin, cache), cache

    @torch.no_grad()
    def decode_rows(self, kv: BatchKV, embeds: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """One forward of the decoder stack over every row of `kv`: embeds [B, W, C] (ragged rows
        right-padded), per-row rope tables [B, W, R] -> final-normed hidden [B, W, C]. Row b's
        inputs are written at its slots lengths[b].. ; `kv.settle` keeps what the verdicts keep."""
        assert embeds.shape[0] == kv.rows and max(kv.lengths) + embeds.shape[1] <= self.cache_length
        x = torch.from_numpy(np.ascontiguousarray(embeds, dtype=np.float32)).to(self.dtype)
        rope, mask = self._rope(cos, sin), kv.begin(embeds.shape[1])
        with intra_op_threads(self.threads):
            for layer in self.lm.layers:
                x = layer(x, position_embeddings=rope, attention_mask=mask, cache=kv)
            return self.lm.norm(x).float().numpy()

    @torch.no_grad()
    def logits(self, hidden):
        with intra_op_threads(self.threads):
            return self.lm_head(self._rows(hidden))[0].float().numpy()

    @torch.no_grad()
    def mtp(self, previous_hidden, embeds, cache_position, cos, sin, cache: KVCache | None = None):
        """`cache`: the sequence's own MTP cache (new_mtp_cache), default the runtime's."""
        if self.mtp_module is None:
            raise EngineError(self.mtp_unavailable or "MTP unavailable")
        n = embeds.shape[0]
        assert cache_position + n <= self.cache_length
        cache = self.mtp_cache if cache is None else cache
        cache.position = cache_position
        with intra_op_threads(self.threads):
            raw, head = self.mtp_module(self._rows(previous_hidden), self._rows(embeds), cache_position,
                                        self._rope(cos, sin), self._mask(cache_position, n), cache)
        return raw[0].float().numpy(), head[0].float().numpy()

    # -- helpers --------------------------------------------------------------------------------

    def _rows(self, x: np.ndarray) -> torch.Tensor:  # (n, C) float32 -> (1, n, C) compute dtype
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.dtype)[None]

    def _rope(self, cos: np.ndarray, sin: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The host's split-half tables [c_0 .. c_{R/2-1}, c_0 .. c_{R/2-1}] in transformers'
        interleaved form [c_0, c_0, c_1, c_1, ...] (GlmOcrTextRotaryEmbedding's layout): (n, R)
        -> (1, n, R), or a batch's per-row (B, W, R) -> (B, W, R)."""
        half = cos.shape[-1] // 2

        def interleaved(t):
            t = torch.from_numpy(np.ascontiguousarray(t[..., :half])).repeat_interleave(2, dim=-1)
            return (t if t.ndim == 3 else t[None]).to(self.dtype)

        return interleaved(cos), interleaved(sin)

    @staticmethod
    def _mask(start: int, n: int) -> torch.Tensor | None:
        """Row i sees cache rows 0 .. start + i. One row sees every row it is given (no mask),
        which lets SDPA take its grouped-query path."""
        if n == 1:
            return None
        rows = torch.arange(n)[:, None] + start
        return (torch.arange(start + n)[None, :] <= rows)[None, None]
