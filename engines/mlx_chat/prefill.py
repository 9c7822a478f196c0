"""How much of a prompt the chat target reads per forward (prefill), so a long prompt reports
its progress and can be cancelled between chunks (engines/batch/engine.py `_admit`, and mlx-lm's
generate_step for a model the batch cannot hold)."""

from __future__ import annotations

import mlx.core as mx

# Prompt tokens per prefill forward. Cancel and progress happen between chunks, so a chunk must
# be short on the slowest backend: on MLX's CPU backend here 256 tokens take seconds late in a
# long prompt; Metal reads 2048 (mlx-lm's prefill step) in well under that. A fixed size per
# backend keeps the floating-point result of a prompt the same from run to run.
PREFILL_CHUNK = 2048 if mx.metal.is_available() else 256
