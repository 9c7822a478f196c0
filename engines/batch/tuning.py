"""What `specscope tune` (and the window's Tune…) measures for a chat target on this machine
(the numbers engines/speculative/tuning.py chooses from): the target's forward latency by
width -- the batch's own forward, on its slot-table cache, as the round loop runs it -- and,
over a calibration set run at the deepest draft length, the drafter's cost per token and the
acceptance by draft position. `measure` does both and makes the Profile; both
callers report its progress and may stop it (TuneCancelled)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

from engines.types import Request, ShouldStop, SpecConfig
from engines.batch.cache import BatchCache
from engines.mlx_chat.prefill import PREFILL_CHUNK
from engines.speculative.schedule import MAX_STEPS
from engines.profiles import Profile, machine_id
from engines.speculative.replay import Rounds, replay_text

WIDTHS = range(1, MAX_STEPS + 2)  # 1 (plain) .. 1 + MAX_STEPS drafts
# The batch's forwards (engines/batch): B sequences of w tokens each. The batch controller
# prices a step by its B x w tokens (engines/speculative/costs.StepCosts); these give it this
# machine's curve from the first step instead of after the steps it has seen.
BATCHES = (2, 4, 8)
BATCH_WIDTHS = (1, 2, 4, 8)


class TuneCancelled(Exception):
    """The caller's should_stop said stop: nothing was measured to keep."""


def forward_latency(model, context: list[int], reps: int = 9, widths=WIDTHS,
                    on_pass: Callable[[int, int], None] | None = None,
                    should_stop: ShouldStop | None = None, batch: int = 1) -> dict[int, float]:
    """Seconds of one target forward of w tokens after `context` (its slots written over by the
    next, so every forward sees the same context): the fastest of `reps` passes, widths
    interleaved. The fastest, not the median: other work on the machine only adds time, and
    a burst of it moved the median's curve by 10% between two measurements in CI (the fastest
    stayed within 3% here with such a burst); the level a run sees is refined from its own
    rounds. `on_pass(i, n)` before each pass over the widths.
    `batch`: B rows of the same context, each forward B x w tokens (the batch's forwards)."""
    cache = BatchCache(model, batch)
    for start in range(0, len(context), PREFILL_CHUNK):  # the context read as the loop reads a prompt
        chunk = context[start:start + PREFILL_CHUNK]
        cache.begin(len(chunk))
        model(mx.array([chunk] * batch, dtype=mx.uint32), cache=cache.layers)
        mx.eval(cache.arrays())
        cache.settle([len(chunk)] * batch)
    token = context[-1]
    seen: dict[int, list[float]] = {w: [] for w in widths}
    for i in range(reps + 1):  # the first pass warms every shape up and is not counted
        if should_stop is not None and should_stop():
            raise TuneCancelled
        if on_pass is not None:
            on_pass(i, reps + 1)
        for w in widths:
            t0 = time.perf_counter()
            cache.begin(w)
            logits = model(mx.array([[token] * w] * batch, dtype=mx.uint32), cache=cache.layers)
            mx.eval(mx.argmax(logits, axis=-1))
            seen[w].append(time.perf_counter() - t0)
            cache.abandon()
    return {w: min(s[1:]) for w, s in seen.items()}


@dataclass
class Calibration:
    acceptance: list[float]  # by position 1..MAX_STEPS: accepted / reached
    reached: list[int]
    draft_s: float  # seconds per drafted token, as the host timed it around drafting
    rounds: int
    round_s: float = 0.0  # a round of MAX_STEPS drafts, settle to settle (the fastest, as forward_latency's)
    replayed: Rounds | None = None  # n-gram: every fixed k's rounds replayed on the outputs (replay.replay_text)


def calibrate(engine, prompts: list[str], spec: SpecConfig, max_tokens: int,
              on_prompt: Callable[[int, int], None] | None = None,
              should_stop: ShouldStop | None = None) -> Calibration:
    """Run the prompts at the deepest draft length and count, per draft position, how often
    it was reached (every position before it accepted) and accepted. `should_stop` is polled
    between rounds: a stopped calibration raises TuneCancelled (a partial count is no profile)."""
    spec = SpecConfig(**{**spec.__dict__, "steps": MAX_STEPS, "adaptive": False, "auto": False, "profile": None})
    reached, accepted = [0] * MAX_STEPS, [0] * MAX_STEPS
    draft_s, drafted, rounds, walls = 0.0, 0, 0, []
    replayed = Rounds(MAX_STEPS) if spec.method == "ngram" else None
    for i, prompt in enumerate(prompts):
        if on_prompt is not None:
            on_prompt(i, len(prompts))
        request = Request(prompt=prompt, max_tokens=max_tokens, spec=spec)
        output = []
        for rnd in engine.generate(request, should_stop):
            if rnd.finish == "cancelled":
                raise TuneCancelled
            output += rnd.tokens
            if rnd.prefill or not rnd.proposed:
                continue
            rounds += 1
            drafted += rnd.proposed
            draft_s += rnd.draft_s
            if rnd.proposed == MAX_STEPS:
                walls.append(rnd.wall_s)
            for j in range(min(rnd.proposed, MAX_STEPS)):
                reached[j] += 1
                if j < rnd.accepted:
                    accepted[j] += 1
                else:
                    break
        if replayed is not None:  # what each fixed k would have done on this output (the lookup is the text's)
            prompt_ids = engine.prompt_ids(request)
            replayed.merge(replay_text(prompt_ids + output, len(prompt_ids) + 1, MAX_STEPS, spec.ngram_min, spec.ngram_max))
    acceptance = [(a + 0.5) / (r + 1) for a, r in zip(accepted, reached)]  # half a round of prior: no 0/0
    return Calibration(acceptance, reached, draft_s / drafted if drafted else 0.0, rounds,
                       min(walls) if walls else 0.0, replayed)


def drafting_s(cal: Calibration, latency: dict[int, float]) -> float:
    """Seconds per drafted token: the host's timer around drafting, or what a calibration round
    cost beyond the target's forward of its width, per draft -- the larger. Why both: an MTP
    drafter whose steps launch ahead drafts in the graph behind the last verify, so the host's timer
    sees almost nothing while on a CPU the chain lengthens the round (engines/speculative/
    tuning.py); a profile that said ~0 priced its drafts as free until the run measured them."""
    width = 1 + MAX_STEPS
    beyond = (cal.round_s - latency[width]) / MAX_STEPS if cal.round_s and width in latency else 0.0
    return max(cal.draft_s, beyond)


@dataclass(frozen=True)
class TuneProgress:
    stage: str  # "latency" | "batch" | "acceptance"
    done: int  # passes over the widths / prompts done
    total: int
    text: str  # one line: what is being measured


def measure(engine, spec: SpecConfig, prompts: list[str], max_tokens: int = 256, context: int = 256, reps: int = 9,
            on_progress: Callable[[TuneProgress], None] | None = None,
            should_stop: ShouldStop | None = None) -> tuple[Profile, Calibration]:
    """The profile of (this machine, engine's target, spec's method and drafter): the forward
    latency after `context` tokens of the prompts' own text, then the acceptance over the
    prompts. Raises TuneCancelled when `should_stop` says so."""
    say = on_progress or (lambda _p: None)
    filler = engine.tokenizer.encode(" ".join(prompts))
    tokens = (filler * (context // max(len(filler), 1) + 1))[:context]
    latency = forward_latency(
        engine.model, tokens, reps=reps, should_stop=should_stop,
        on_pass=lambda i, n: say(TuneProgress("latency", i, n, f"the target's forward latency for 1..{MAX_STEPS + 1} "
                                              f"tokens after {len(tokens)} tokens of context: pass {i + 1} of {n}")))
    batch_s = {}
    for i, b in enumerate(BATCHES):
        say(TuneProgress("batch", i, len(BATCHES), f"a batch's forward latency: {b} sequences of "
                                                   f"{', '.join(map(str, BATCH_WIDTHS))} tokens"))
        batch_s[b] = forward_latency(engine.model, tokens, reps=max(3, reps // 3), widths=BATCH_WIDTHS,
                                     should_stop=should_stop, batch=b)
    cal = calibrate(engine, prompts, spec, max_tokens, should_stop=should_stop,
                    on_prompt=lambda i, n: say(TuneProgress("acceptance", i, n, f"acceptance by draft position at "
                                                            f"{MAX_STEPS} drafts per round: prompt {i + 1} of {n}")))
    profile = Profile(machine=machine_id(), model=engine.model_path, method=spec.method, drafter=spec.draft_model or "",
                      target_s=latency, draft_s=drafting_s(cal, latency), acceptance=cal.acceptance,
                      context=len(tokens), batch_s=batch_s, replayed=cal.replayed.record() if cal.replayed else {})
    return profile, cal
