"""Reading the prompt into the chat target (prefill) in chunks, so a long prompt reports its
progress and can be cancelled between chunks."""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx

from engines.types import OnPrefill, PrefillProgress, ShouldStop
from engines.mlx_chat.cache import cache_arrays

# Prompt tokens per prefill forward. Cancel and progress happen between chunks, so a chunk must
# be short on the slowest backend: on MLX's CPU backend here 256 tokens take seconds late in a
# long prompt; Metal reads 2048 (mlx-lm's prefill step) in well under that. A fixed size per
# backend keeps the floating-point result of a prompt the same from run to run.
PREFILL_CHUNK = 2048 if mx.metal.is_available() else 256


def feed_prompt(model, cache: list[Any], prompt: mx.array, should_stop: ShouldStop,
                on_prefill: OnPrefill | None, chunk: int = PREFILL_CHUNK) -> bool:
    """Run `prompt` [n] through the target into `cache`, `chunk` tokens per forward, evaluating
    each chunk so progress is real. False if `should_stop` said stop between chunks."""
    t0, total, done = time.perf_counter(), int(prompt.size), 0
    while done < total:
        if done and should_stop():  # between chunks: a prompt read in one chunk is not polled
            return False
        n = min(chunk, total - done)
        model(prompt[done:done + n][None], cache=cache)
        mx.eval(cache_arrays(cache))
        done += n
        if on_prefill is not None:
            on_prefill(PrefillProgress(done, total, time.perf_counter() - t0))
    return True
