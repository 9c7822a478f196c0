"""How many drafts to ask for each round: presets, the spec-step setting, the adaptive depth
controller and the skip-streak rule. Backend-agnostic; every round loop uses DraftSchedule."""

from __future__ import annotations

from dataclasses import dataclass

MAX_STEPS = 7  # the spec-step slider's range is 0..MAX_STEPS; 0 means plain decoding


@dataclass(frozen=True)
class Preset:
    """B (block size) counts the target's own token, so a block proposes B - 1 drafts;
    draft_max bounds the adaptive controller (capped at MAX_STEPS)."""

    name: str
    block_size: int
    draft_max: int

    @property
    def steps(self) -> int:
        return self.block_size - 1

    @property
    def max_steps(self) -> int:
        return min(self.draft_max, MAX_STEPS)


# The edge presets of the Gemma 4 MTP reference (MTP_PRESET). "lift" and "balanced" carry the
# same numbers there; we keep them as published.
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("throughput", 2, 6),
        Preset("lift", 3, 8),
        Preset("balanced", 3, 8),
        Preset("quality", 4, 16),
    )
}


# Drafts per round when the user names a method but no draft length (the CLI and the window
# alike). N-gram drafts cost almost nothing to make, so they go deeper than a model drafter's.
DEFAULT_STEPS = {"off": 0, "ngram": 5, "draft": 3, "mtp": PRESETS["balanced"].steps}


def preset_for_steps(steps: int, current: str | None = None) -> str | None:
    """The preset a spec-step value corresponds to (the current one if it still fits), or None
    when the value is custom. Keeps a preset combo and a step slider in sync."""
    if current in PRESETS and PRESETS[current].steps == steps:
        return current
    return next((p.name for p in PRESETS.values() if p.steps == steps), None)


def check_steps(steps: int) -> int:
    if not 0 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be between 0 and {MAX_STEPS}, got {steps}")
    return steps


@dataclass
class AdaptiveDepth:
    """An EMA of the per-round acceptance rate moves the draft length up when drafts keep
    being accepted and down when they keep failing, within [min_steps, max_steps]."""

    steps: int
    min_steps: int = 1
    max_steps: int = MAX_STEPS
    alpha: float = 0.3
    raise_above: float = 0.75
    lower_below: float = 0.35
    ema: float = 0.5

    def update(self, proposed: int, accepted: int) -> int:
        if proposed:
            self.ema = self.alpha * (accepted / proposed) + (1 - self.alpha) * self.ema
            if self.ema > self.raise_above and self.steps < self.max_steps:
                self.steps += 1
                self.ema = 0.5 * (self.raise_above + self.lower_below)  # let the new depth prove itself
            elif self.ema < self.lower_below and self.steps > self.min_steps:
                self.steps -= 1
                self.ema = 0.5 * (self.raise_above + self.lower_below)
        return self.steps


@dataclass
class SkipStreak:
    """After `threshold` consecutive zero-accept rounds, skip drafting for one round. The round
    after a skip always drafts, so threshold=1 cannot oscillate into a permanent skip."""

    threshold: int = 0  # 0 = off
    streak: int = 0
    skipped_last: bool = False

    def should_skip(self) -> bool:
        if self.threshold and self.streak >= self.threshold and not self.skipped_last:
            self.streak = 0
            self.skipped_last = True
            return True
        self.skipped_last = False
        return False

    def record(self, proposed: int, accepted: int) -> None:
        if proposed:
            self.streak = self.streak + 1 if accepted == 0 else 0


class DraftSchedule:
    """The round loop asks `next_steps(remaining)` before drafting and calls `record(...)`
    after verifying. 0 means: do a plain target step this round.

    `auto` (--steps auto, engines/speculative/tuning.py) picks each round's k from this
    machine's costs; until it knows them, the adaptive depth controller moves k from `steps`."""

    def __init__(self, steps: int, adaptive: bool = False, min_steps: int = 1,
                 max_steps: int = MAX_STEPS, skip_streak: int = 0, auto=None):
        check_steps(steps)
        self.enabled = steps > 0
        self.auto = auto  # tuning.AutoSteps, or None
        if auto is not None:
            adaptive = True  # the fallback while auto knows nothing yet
        self.depth = AdaptiveDepth(steps, max(1, min_steps), min(max_steps, MAX_STEPS)) if adaptive else None
        self.fixed_steps = steps
        self.skip = SkipStreak(skip_streak)
        self.note: str | None = None  # e.g. why a tuning profile was not used (the run's first Round says it)
        self.expected: tuple[list[float], list[float]] | None = None  # auto's tok/s and tokens per k, this choice

    @classmethod
    def of(cls, spec, profile=None, note: str | None = None) -> "DraftSchedule":
        """The schedule a SpecConfig asks for (a disabled one when it does not speculate).
        `profile`: the tuning profile --steps auto starts from (engines/profiles.py `for_spec`
        reads it; None: measured in the run), `note`: why the one asked for is not used."""
        if not spec.enabled:
            return cls(0)
        auto = None
        if spec.auto:
            from engines.speculative.tuning import AutoSteps

            auto = AutoSteps(min(spec.max_steps, MAX_STEPS))
            auto.profile = profile
        schedule = cls(spec.steps, spec.adaptive, spec.min_steps, spec.max_steps, spec.skip_streak, auto)
        schedule.note = note if spec.auto else None
        return schedule

    @property
    def steps(self) -> int:
        return self.depth.steps if self.depth else self.fixed_steps

    def next_steps(self, remaining: int) -> int:
        """Drafts to propose this round; never more than remaining - 1, since the target adds
        one token of its own and max_tokens must not be exceeded."""
        self.expected = None
        if not self.enabled or remaining <= 1 or self.skip.should_skip():
            return 0
        chosen = self.auto.choose() if self.auto is not None else None
        if chosen is not None:  # what the Round of this step reports (the next step overwrites auto's)
            self.expected = (list(self.auto.last_rates), list(self.auto.last_tokens))
        return min(self.steps if chosen is None else chosen, remaining - 1)

    def record(self, proposed: int, accepted: int, verify_s: float | None = None, draft_s: float | None = None,
               priced: bool = True, asked: int | None = None) -> None:
        """After a round: its drafts and accepted count, and (for auto) what its verify and
        drafting cost -- `priced` False: that time is not what a round of its k costs -- and the
        drafts next_steps asked of it, when the drafter may make fewer (tuning.AutoSteps.record)."""
        self.skip.record(proposed, accepted)
        if self.depth:
            self.depth.update(proposed, accepted)
        if self.auto is not None:
            self.auto.record(proposed, accepted, verify_s, draft_s, priced, asked)

    def disable(self) -> None:
        """Graceful degradation: the drafter failed, decode plainly from here on."""
        self.enabled = False

