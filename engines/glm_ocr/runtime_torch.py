"""The Core ML twin (`--runtime coreml-twin`): executes, in PyTorch, the very channels-first
modules that the converter turns into Core ML packages (modules.py), loaded from a Hugging
Face checkpoint directory. It proves the Core ML pipeline where Core ML cannot run (parity
tests, the conversion check); it is slow on a CPU by design -- fixed 8-row window,
convolutions for linears, chunked LM head. Machines without Core ML run runtime_fast.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from engines.types import EngineError
from engines.glm_ocr.runtime import pad_rows
from engines.glm_ocr.weights import GlmOcrModules, load_modules


def _cf(x: np.ndarray) -> torch.Tensor:  # (S, C) -> (1, C, 1, S)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32).T)[None, :, None, :]


def _rows(x: torch.Tensor) -> np.ndarray:  # (1, C, 1, S) -> (S, C)
    return x[0, :, 0, :].T.float().numpy()


class TorchRuntime:
    name = "coreml-twin"

    def __init__(self, modules: GlmOcrModules, seq_len: int = 8):
        self.modules = modules
        self.config = modules.config
        self.seq_len = seq_len
        self.prefill_len = seq_len  # the converted decoder takes seq_len rows per call
        self.cache_length = modules.decoder.cache_length
        self.embeddings = modules.embeddings
        self.mtp_unavailable = modules.mtp_missing_reason

    @classmethod
    def load(cls, model_dir: str | os.PathLike, seq_len: int = 8, cache_length: int = 2048, **_fast_options) -> "TorchRuntime":
        model_dir = Path(model_dir)
        if not any(model_dir.glob("*.safetensors")):
            raise EngineError(f"the Core ML twin needs a Hugging Face GLM-OCR checkpoint; {model_dir} has no safetensors")
        if not 1 <= seq_len <= cache_length:
            raise EngineError(f"seq_len must be between 1 and cache_length ({cache_length}), got {seq_len}")
        return cls(load_modules(model_dir, cache_length), seq_len)

    @torch.no_grad()
    def encode_image(self, pixel_values, grid_thw):
        from engines.glm_ocr.positions import vision_rope

        v = self.config.vision
        patches = torch.from_numpy(np.asarray(pixel_values, dtype=np.float32)).view(
            -1, v.in_channels * v.temporal_patch_size, v.patch_size, v.patch_size)
        cos, sin = vision_rope(tuple(int(x) for x in grid_thw), v)
        return _rows(self.modules.vision(patches, torch.from_numpy(cos), torch.from_numpy(sin)))

    def reset(self) -> None:
        self.modules.decoder.reset()
        if self.modules.mtp is not None:
            self.modules.mtp.reset()

    @torch.no_grad()
    def decode(self, embeds, cache_position, cos, sin):
        n = embeds.shape[0]
        assert 1 <= n <= self.seq_len and cache_position + self.seq_len <= self.cache_length, (n, cache_position)
        out = self.modules.decoder(
            _cf(pad_rows(embeds, self.seq_len)), torch.from_numpy(pad_rows(cos, self.seq_len)),
            torch.from_numpy(pad_rows(sin, self.seq_len)), torch.tensor([cache_position], dtype=torch.int32))
        return _rows(out)[:n]

    @torch.no_grad()
    def logits(self, hidden):
        return _rows(self.modules.lm_head(_cf(hidden)))

    def new_mtp_cache(self) -> None:
        """One MTP state, as the Core ML package it twins: one sequence at a time (a batch of one)."""
        return None

    @torch.no_grad()
    def mtp(self, previous_hidden, embeds, cache_position, cos, sin, cache=None):
        assert cache is None, "the Core ML twin holds one MTP state"
        if self.modules.mtp is None:
            raise EngineError(self.mtp_unavailable or "MTP unavailable")
        assert cache_position + embeds.shape[0] <= self.cache_length
        raw, head = self.modules.mtp(_cf(previous_hidden), _cf(embeds), torch.from_numpy(np.ascontiguousarray(cos)),
                                     torch.from_numpy(np.ascontiguousarray(sin)),
                                     torch.tensor([cache_position], dtype=torch.int32))
        return _rows(raw), _rows(head)
