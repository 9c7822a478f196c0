"""The interface both GLM-OCR runtimes implement (Core ML on macOS, PyTorch everywhere).

All arrays are NumPy, row-major (sequence, channels), float32; a runtime converts to its
own layout (channels-first for Core ML and its twin) and dtype. The round loop in engine.py only talks to this.

A runtime holds two KV caches: the main decoder's and the MTP layer's (the fast runtime also
makes one MTP cache per sequence, and batches many sequences in one decoder forward:
runtime_fast.BatchKV; Core ML and its twin hold one state each, so they read one sequence at a
time). `decode` writes rows
cache_position .. cache_position + n - 1 of the main cache (n <= prefill_len; Core ML and its
twin pad to their fixed chunk size) and returns the final-normed hidden states of the n rows; `mtp`
does the same for the MTP cache. Rows past what the caller considers valid are stale and
invisible: the causal mask hides them and later writes overwrite them.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engines.glm_ocr.config import GlmOcrConfig


class Runtime(Protocol):
    name: str  # "torch" (runtime_fast) | "coreml" | "coreml-twin" (runtime_torch)
    config: GlmOcrConfig
    seq_len: int  # rows per round forward (1 + drafts); the converted chunk size for Core ML
    prefill_len: int  # rows per prefill call: seq_len for Core ML and its twin, the whole prompt otherwise
    cache_length: int  # KV cache rows (main and MTP)
    embeddings: np.ndarray  # (vocab, hidden): indexed by token ids it gives float32 rows (runtime_fast: EmbeddingRows)
    mtp_unavailable: str | None  # None when the MTP layer is loaded, else why not

    def encode_image(self, pixel_values: np.ndarray, grid_thw: tuple[int, int, int]) -> np.ndarray:
        """(num_patches, 3*T*P*P) processor output -> (num_image_tokens, hidden)."""

    def reset(self) -> None:
        """Fresh caches for a new run."""

    def decode(self, embeds: np.ndarray, cache_position: int, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """(n, hidden) embeddings at cache rows cache_position.. -> (n, hidden) normed hidden."""

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """(n, hidden) -> (n, vocab)."""

    def new_mtp_cache(self):
        """A sequence's own MTP cache (each MtpDrafter keeps one), or None where the runtime has
        one MTP state (Core ML's stateful package and its twin: there the batch is a batch of one)."""

    def mtp(self, previous_hidden: np.ndarray, embeds: np.ndarray, cache_position: int,
            cos: np.ndarray, sin: np.ndarray, cache=None) -> tuple[np.ndarray, np.ndarray]:
        """(n, hidden) x2 at MTP cache rows cache_position.. of `cache` (None: the runtime's
        own) -> (raw hidden, normed hidden)."""


def pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """Zero-pad (n, d) to (rows, d)."""
    if x.shape[0] == rows:
        return x
    return np.concatenate([x, np.zeros((rows - x.shape[0],) + x.shape[1:], dtype=x.dtype)])
