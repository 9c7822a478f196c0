"""What `specscope tune` measures for a chat target on this machine (the numbers
engines/speculative/tuning.py chooses from): the target's forward latency by width, and, over
a calibration set run at the deepest draft length, the drafter's cost per token and the
acceptance by draft position."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

from engines.types import Request, SpecConfig
from engines.mlx_chat.cache import cache_arrays, make_rollback_cache, rollback
from engines.mlx_chat.prefill import feed_prompt
from engines.speculative.schedule import MAX_STEPS

WIDTHS = range(1, MAX_STEPS + 2)  # 1 (plain) .. 1 + MAX_STEPS drafts


def forward_latency(model, context: list[int], reps: int = 9, widths=WIDTHS) -> dict[int, float]:
    """Median seconds of one target forward of w tokens after `context` (the cache rolled
    back after each, so every forward sees the same context), widths interleaved so a change
    in the machine's load touches them alike."""
    cache = make_rollback_cache(model)
    feed_prompt(model, cache, mx.array(context, dtype=mx.uint32), lambda: False, None)
    mx.eval(cache_arrays(cache))
    token = context[-1]
    seen: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(reps + 1):  # the first pass warms every shape up and is not counted
        for w in widths:
            t0 = time.perf_counter()
            logits = model(mx.array([[token] * w], dtype=mx.uint32), cache=cache)
            mx.eval(mx.argmax(logits[0], axis=-1))
            seen[w].append(time.perf_counter() - t0)
            rollback(cache, w)
    return {w: statistics.median(s[1:]) for w, s in seen.items()}


@dataclass
class Calibration:
    acceptance: list[float]  # by position 1..MAX_STEPS: accepted / reached
    reached: list[int]
    draft_s: float  # seconds per drafted token
    rounds: int


def calibrate(engine, prompts: list[str], spec: SpecConfig, max_tokens: int,
              on_prompt: Callable[[int, int], None] | None = None) -> Calibration:
    """Run the prompts at the deepest draft length and count, per draft position, how often
    it was reached (every position before it accepted) and accepted."""
    spec = SpecConfig(**{**spec.__dict__, "steps": MAX_STEPS, "adaptive": False, "auto": False, "profile": None})
    reached, accepted = [0] * MAX_STEPS, [0] * MAX_STEPS
    draft_s, drafted, rounds = 0.0, 0, 0
    for i, prompt in enumerate(prompts):
        if on_prompt is not None:
            on_prompt(i, len(prompts))
        for rnd in engine.generate(Request(prompt=prompt, max_tokens=max_tokens, spec=spec)):
            if rnd.prefill or not rnd.proposed:
                continue
            rounds += 1
            drafted += rnd.proposed
            draft_s += rnd.draft_s
            for j in range(min(rnd.proposed, MAX_STEPS)):
                reached[j] += 1
                if j < rnd.accepted:
                    accepted[j] += 1
                else:
                    break
    acceptance = [(a + 0.5) / (r + 1) for a, r in zip(accepted, reached)]  # half a round of prior: no 0/0
    return Calibration(acceptance, reached, draft_s / drafted if drafted else 0.0, rounds)
