"""Repetition loops: GLM-OCR's best-known failure (and a small chat model's) is emitting one
block of tokens over and over until max_tokens. The detector watches the emitted tokens, one
at a time, and flags the token at which the tail has become one block of `period` tokens
repeated `copies` times back to back (spanning at least `min_span` tokens, so a short rule like
"---" or a run of dots in a table of contents is not a loop).

The round loop feeds it every token a sequence keeps, in order, and clips the round right after
the flagged token, so a plain and a speculative run of the same request stop at the same token:
the detector sees the same token sequence whichever way it was produced. Pure Python, no
backend: run[p] counts the trailing tokens equal to the token p back, kept only for the periods
where it is not 0 -- those at which the new token occurred before -- so a token costs as much as
its own occurrences among the last max_period tokens, not max_period (a look at every period
costs a small model's decoding step a tenth of its host work)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

DEFAULT_MAX_REPEAT = 4  # copies of a block; the CLI's --max-repeat and Request.max_repeat
MIN_SPAN = 64  # tokens a loop must cover before it counts
MAX_PERIOD = 128  # longest block looked for (a table row, a paragraph)


@dataclass
class RepetitionDetector:
    copies: int = DEFAULT_MAX_REPEAT
    min_span: int = MIN_SPAN
    max_period: int = MAX_PERIOD
    pushed: int = 0  # tokens so far: the next one's position
    recent: deque = field(default_factory=deque)  # the last max_period tokens, oldest first
    positions: dict[int, deque] = field(default_factory=dict)  # token -> its positions among `recent`
    run: dict[int, int] = field(default_factory=dict)  # period p -> trailing tokens equal to the token p back (> 0)

    def __post_init__(self):
        if self.copies < 2:
            raise ValueError(f"a repetition needs at least 2 copies, got {self.copies}")

    def push(self, token: int) -> int | None:
        """Adds a token; returns the repeating block's length if the tail is now a loop."""
        n = self.pushed
        before = self.positions.setdefault(token, deque())
        self.run = {n - q: self.run.get(n - q, 0) + 1 for q in before}  # every other period's run ends here
        before.append(n)
        self.recent.append(token)
        self.pushed = n + 1
        if len(self.recent) > self.max_period:  # position n - max_period is out of every later token's reach
            gone = self.recent.popleft()
            self.positions[gone].popleft()
            if not self.positions[gone]:
                del self.positions[gone]
        loops = [p for p, run in self.run.items() if run + p >= max(self.copies * p, self.min_span)]
        return min(loops) if loops else None


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
