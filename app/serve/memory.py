"""Whether a batch's K/V caches fit this machine: `serve --max-batch N` refuses at start, in one
line, a batch whose caches at full context cannot sit beside the weights -- for chat models
(engines/batch/cache.kv_bytes_per_token measures a token) and GLM-OCR (its torch runtime's
kv_bytes_per_token counts one) alike."""

from __future__ import annotations

import os

from engines.types import EngineError


def check_memory(per_token: int, max_batch: int, context: int, weights_bytes: int, total_bytes: int) -> None:
    """Refuse a batch whose KV caches at full context cannot fit beside the weights in this
    machine's memory (three quarters of it: the OS and the server need the rest)."""
    need = max_batch * context * per_token
    room = 0.75 * total_bytes - weights_bytes
    if need > room:
        gb = lambda n: f"{n / 2**30:.1f} GB"  # noqa: E731
        raise EngineError(f"--max-batch {max_batch} x {context} tokens of context needs {gb(need)} of KV cache, "
                          f"but this machine ({gb(total_bytes)}, {gb(weights_bytes)} of it the weights and the prompt "
                          f"cache) has room for {gb(max(room, 0))}: lower --max-batch")


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
