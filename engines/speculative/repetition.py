"""Repetition loops: GLM-OCR's best-known failure (and a small chat model's) is emitting one
block of tokens over and over until max_tokens. The detector watches the emitted tokens, one
at a time, and flags the token at which the tail has become one block of `period` tokens
repeated `copies` times back to back (spanning at least `min_span` tokens, so a short rule like
"---" or a run of dots in a table of contents is not a loop).

Both round loops feed it every token they keep, in order, and clip the round right after the
flagged token, so a plain and a speculative run of the same request stop at the same token:
the detector sees the same token sequence whichever way it was produced. Pure Python, no
backend: run[p] counts the trailing tokens equal to the token p back, so a token costs
O(max_period)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MAX_REPEAT = 4  # copies of a block; the CLI's --max-repeat and Request.max_repeat
MIN_SPAN = 64  # tokens a loop must cover before it counts
MAX_PERIOD = 128  # longest block looked for (a table row, a paragraph)


@dataclass
class RepetitionDetector:
    copies: int = DEFAULT_MAX_REPEAT
    min_span: int = MIN_SPAN
    max_period: int = MAX_PERIOD
    tokens: list[int] = field(default_factory=list)
    run: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.copies < 2:
            raise ValueError(f"a repetition needs at least 2 copies, got {self.copies}")
        self.run = [0] * (self.max_period + 1)

    def push(self, token: int) -> int | None:
        """Adds a token; returns the repeating block's length if the tail is now a loop."""
        self.tokens.append(token)
        n = len(self.tokens)
        found = None
        for p in range(1, min(self.max_period, n - 1) + 1):
            self.run[p] = self.run[p] + 1 if token == self.tokens[-1 - p] else 0
            if found is None and self.run[p] + p >= max(self.copies * p, self.min_span):
                found = p
        return found


def detector_for(max_repeat: int) -> RepetitionDetector | None:
    """The detector a request asks for; max_repeat 0 turns detection off."""
    return RepetitionDetector(copies=max_repeat) if max_repeat else None


def clip_at_repetition(detector: RepetitionDetector | None, tokens: list[int]) -> tuple[list[int], str | None]:
    """The hook both round loops call on the tokens a round keeps: feeds them to the detector
    and cuts them right after the token that completes a loop. Returns (kept, note); a note
    means the run stops here with finish="repetition"."""
    if detector is None:
        return tokens, None
    for i, token in enumerate(tokens):
        period = detector.push(token)
        if period is not None:
            return tokens[: i + 1], f"stopped: the output repeats a block of {period} token{'s' * (period != 1)}"
    return tokens, None


def acceptance_jump(rounds, window: int = 8) -> tuple[float, float] | None:
    """The signal speculation gives for free when a run loops: the drafts (which are cheap
    guesses of what comes next) start being accepted almost always, because the text now
    predicts itself. Returns (acceptance over the last `window` drafting rounds, acceptance
    before them), or None when there are too few drafting rounds to compare."""
    drafting = [r for r in rounds if r.proposed > 0]
    if len(drafting) <= window:
        return None
    recent, before = drafting[-window:], drafting[:-window]
    rate = lambda rs: sum(r.accepted for r in rs) / sum(r.proposed for r in rs)  # noqa: E731
    return rate(recent), rate(before)
