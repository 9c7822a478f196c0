"""Positions and RoPE tables, computed on the host in float32 (NumPy, no torch).

The converted modules take cos/sin tables as inputs rather than position ids: angles reach
thousands of radians, which float16 arithmetic inside a Core ML graph cannot represent
precisely; computing them here in float32 keeps every runtime exact.

Text RoPE is GLM's multimodal RoPE: three position rows (temporal, height, width); each
rotary frequency takes its position from one row according to `mrope_section`. Text tokens
have three equal rows; image tokens get (start, start + row, start + col). The modules use
split-half rotation (q/k weights were permuted from GLM's interleaved layout), so a table
row is [c_0 .. c_{R/2-1}, c_0 .. c_{R/2-1}].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engines.glm_ocr.config import TextConfig, VisionConfig


def prompt_positions(input_ids: list[int], image_token_id: int, grid_thw: tuple[int, int, int] | None,
                     merge_size: int) -> tuple[np.ndarray, int]:
    """(3, P) mRoPE positions of a prompt with at most one image, and the offset to add to a
    sequence index to get the text position of any later token (transformers' rope_deltas).
    Mirrors GlmOcrModel.get_rope_index: after an image, positions continue from
    start + max(h, w) / merge, not from start + number of image tokens."""
    rows: list[np.ndarray] = []
    pos = 0
    i = 0
    n = len(input_ids)
    while i < n:
        if input_ids[i] == image_token_id and grid_thw is not None:
            t, h, w = grid_thw[0], grid_thw[1] // merge_size, grid_thw[2] // merge_size
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            rows.append(np.stack([tt.ravel() + pos, hh.ravel() + pos, ww.ravel() + pos]))
            i += t * h * w
            pos += max(h, w)
        else:
            j = i
            while j < n and not (input_ids[j] == image_token_id and grid_thw is not None):
                j += 1
            rows.append(np.broadcast_to(np.arange(pos, pos + j - i), (3, j - i)))
            pos += j - i
            i = j
    positions = np.concatenate(rows, axis=1).astype(np.int64)
    return positions, int(positions.max()) + 1 - n


def text_positions(start_index: int, count: int, delta: int) -> np.ndarray:
    """(3, count) positions of generated tokens at sequence indices start_index.. ."""
    return np.broadcast_to(np.arange(start_index, start_index + count) + delta, (3, count)).astype(np.int64)


def text_inv_freq(cfg: TextConfig) -> np.ndarray:
    dim = cfg.rotary_dim
    return 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def text_rope(positions: np.ndarray, cfg: TextConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape (S, rotary_dim) for (3, S) positions."""
    inv_freq = text_inv_freq(cfg)  # (R/2,)
    freqs = positions[:, :, None].astype(np.float64) * inv_freq  # (3, S, R/2)
    section_row = np.repeat(np.arange(len(cfg.mrope_section)) % 3, cfg.mrope_section)  # (R/2,)
    chosen = freqs[section_row, :, np.arange(len(inv_freq))].T  # (S, R/2): freq j from row section_row[j]
    table = np.concatenate([chosen, chosen], axis=-1)
    return np.cos(table).astype(np.float32), np.sin(table).astype(np.float32)


def vision_rope(grid_thw: tuple[int, int, int], cfg: VisionConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape (num_patches, head_dim) for the vision encoder's axial 2D RoPE, with
    patches in the processor's order (2x2 merge windows, row-major within and across)."""
    t, h, w = grid_thw
    m = cfg.spatial_merge_size
    hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    hpos = hpos.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).ravel()
    wpos = wpos.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).ravel()
    hpos, wpos = np.tile(hpos, t), np.tile(wpos, t)
    spatial_dim = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, spatial_dim, 2, dtype=np.float64) / spatial_dim))
    freqs = np.concatenate([hpos[:, None] * inv_freq, wpos[:, None] * inv_freq], axis=-1)
    table = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(table).astype(np.float32), np.sin(table).astype(np.float32)


@dataclass
class Positions:
    """mRoPE positions by sequence index: the prompt's own (image tokens are 3-D), then text
    positions shifted by the prompt's delta."""

    prompt: np.ndarray  # (3, P)
    delta: int

    def rows(self, start: int, count: int) -> np.ndarray:
        p = self.prompt.shape[1]
        if start + count <= p:
            return self.prompt[:, start : start + count]
        head = self.prompt[:, start:p] if start < p else np.zeros((3, 0), np.int64)
        tail_start = max(start, p)
        return np.concatenate([head, text_positions(tail_start, start + count - tail_start, self.delta)], axis=1)
