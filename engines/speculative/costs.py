"""What a target forward costs on this machine, as measured while it runs: the batch
controller's step costs (engines/batch/controller.py) and `--steps auto`'s round costs
(engines/speculative/tuning.py) both price a forward by how many tokens it reads."""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass
class StepCosts:
    """Measured seconds of a step per forward size (tokens = rows x width): the median of the
    last few steps of each size seen, linear between sizes, the slope of the largest two beyond
    them, and never cheaper for more tokens. Why not one straight line through all: on a CPU a
    forward of a few tokens costs about what one token does (reading the weights dominates) and
    grows linearly once compute dominates; a line would price small forwards too dear and large
    ones too cheap. Why a median: another process on the machine makes a step slow now and then,
    and a mean carries that spike for many steps, which stops drafting where it pays and keeps it
    where it does not.

    `from_below`: make the curve monotone from below instead -- each size no dearer than the
    cheapest larger size measured -- so a slow round raises only its own size's price. From
    above (the default), one size stuck high (a few slow rounds, under load) lifts every larger
    size with it; a chooser (composed drafting, engines/speculative/composed.py) then stops
    choosing them and never measures them again. Another process only ever slows a round down,
    so a larger size measured cheap bounds the smaller ones."""

    recent: int = 7  # steps kept per size
    from_below: bool = False  # the monotone curve under the measured sizes, not over them (see above)
    history: dict[int, deque] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)  # the median per size (set through observe)
    curve: tuple[list[int], list[float]] | None = field(default=None, repr=False, compare=False)  # sizes and
    # their non-decreasing costs, until the next observe (a chooser reads many sizes at once)

    def observe(self, tokens: int, seconds: float) -> None:
        seen = self.history.setdefault(tokens, deque(maxlen=self.recent))
        seen.append(seconds)
        self.seconds[tokens] = statistics.median(seen)
        self.curve = None

    def observe_many(self, steps: list[tuple[int, float]]) -> None:
        """observe() each (tokens, seconds) in turn, with one median per size at the end: the
        same prices, for a caller that collects its steps and reads the curve only now and then
        (a median of 7 in pure Python is a share of a tiny model's round)."""
        for tokens, seconds in steps:
            self.history.setdefault(tokens, deque(maxlen=self.recent)).append(seconds)
        for tokens in {t for t, _ in steps}:
            self.seconds[tokens] = statistics.median(self.history[tokens])
        self.curve = None

    @property
    def ready(self) -> bool:
        return len(self.seconds) >= 2

    def at(self, tokens: int) -> float:
        if self.curve is None:
            sizes = sorted(self.seconds)
            seconds = [self.seconds[t] for t in sizes]
            if self.from_below:  # non-decreasing: each size at most the cheapest larger one
                costs = list(itertools.accumulate(reversed(seconds), min))[::-1]
            else:  # non-decreasing: each size at least the dearest smaller one
                costs = list(itertools.accumulate(seconds, max))
            self.curve = sizes, costs
        sizes, costs = self.curve
        if tokens <= sizes[0]:
            return costs[0]
        if tokens >= sizes[-1]:
            slope = max(0.0, (costs[-1] - costs[-2]) / (sizes[-1] - sizes[-2])) if len(sizes) > 1 else 0.0
            return costs[-1] + slope * (tokens - sizes[-1])
        j = bisect.bisect_left(sizes, tokens)
        if sizes[j] == tokens:
            return costs[j]
        w = (tokens - sizes[j - 1]) / (sizes[j] - sizes[j - 1])
        return costs[j - 1] + w * (costs[j] - costs[j - 1])

    def cost(self, batch: int, width: int) -> float:
        return self.at(batch * width)


@dataclass
class LoadScaledCosts(StepCosts):
    """StepCosts whose sizes not measured lately follow the machine's load: a size not observed
    in the last `fresh` steps is priced at its median then, times how much the sizes measured
    both then and now have changed since (the median of their ratios, now to then); observed
    again, its kept steps are scaled so. Another process on the machine slows every size by
    about the same factor, so the sizes measured now tell what the others cost now.

    Why: a size is measured only while it is chosen or probed, and the costs are kept across
    requests (`--steps auto`'s, tuning.round_costs; composed drafting's, DraftingCosts), so kept
    as measured they would be a patchwork of loads -- a size measured before a load rose stays
    cheap, one measured under a passing load stays dear after it passed. Why ratios of medians as
    measured, not every step divided by a load level estimated from the steps: with one size
    measured most of the time, the level and that size's price are estimated from each other,
    and the steps' noise walks them away from the sizes not measured; a ratio of two medians of
    the same size carries no error from step to step (tests/engines/speculative/test_tuning.py).
    """

    fresh: int = 32  # steps: a size observed within them is priced as measured (--steps auto observes a
    # probe's width every 9 rounds, a shallower probe's every 29)
    steps: int = 0  # steps observed so far
    measured: dict[int, float] = field(default_factory=dict)  # size -> the median of its kept steps, as measured
    last: dict[int, int] = field(default_factory=dict)  # size -> the step it was last observed at
    peers: dict[int, dict[int, float]] = field(default_factory=dict)  # size -> the sizes fresh then and
    # their medians, when it was last observed

    stale: set[int] = field(default_factory=set, repr=False)  # sizes observed since their median was taken:
    # taken when read (a peer's, or the prices'), so a caller that observes many steps at once takes a
    # median per size read, not per step (composed drafting, engines/speculative/composed.py)

    def observe(self, tokens: int, seconds: float) -> None:
        self._take(tokens, seconds)
        self._reprice()

    def observe_many(self, steps: list[tuple[int, float]]) -> None:
        """observe() each step in turn (each moves what counts as fresh), the prices made once at
        the end: the same prices, with the work of one step taken by each. A size's peers are
        noted only at its last step here, or at one its next step here finds stale: a step's note
        is read only by the size's next step if that finds it stale, or by the prices at the end
        (a note per step would be most of composed's re-pricing)."""
        next_at: dict[int, int] = {}
        noted = [True] * len(steps)
        for i in range(len(steps) - 1, -1, -1):
            tokens = steps[i][0]
            noted[i] = tokens not in next_at or next_at[tokens] - i >= self.fresh
            next_at[tokens] = i
        for (tokens, seconds), note in zip(steps, noted):
            self._take(tokens, seconds, note)
        self._reprice()

    def _take(self, tokens: int, seconds: float, note: bool = True) -> None:
        self.steps += 1
        seen = self.history.setdefault(tokens, deque(maxlen=self.recent))
        if tokens in self.last and not self._fresh(tokens):  # back after a while: its kept steps at the load now,
            scale = self._since(tokens)  # or its median would stay a stale one until most of them were new
            seen = self.history[tokens] = deque((s * scale for s in seen), maxlen=self.recent)
        seen.append(seconds)
        self.stale.add(tokens)
        self.last[tokens] = self.steps
        if note:
            self.peers[tokens] = {t: self._median(t) for t in self.last if t != tokens and self._fresh(t)}

    def _reprice(self) -> None:
        self.seconds = {t: m if self._fresh(t) else m * self._since(t)
                        for t, m in ((t, self._median(t)) for t in self.last)}
        self.curve = None

    def _median(self, tokens: int) -> float:
        """`tokens`' median as measured (kept in `measured`), taken again only if it was observed since."""
        if tokens in self.stale:
            self.stale.discard(tokens)
            self.measured[tokens] = statistics.median(self.history[tokens])
        return self.measured[tokens]

    def _fresh(self, tokens: int) -> bool:
        return self.steps - self.last[tokens] < self.fresh

    def _since(self, tokens: int) -> float:
        """How much the load changed since `tokens` was last observed: the median ratio, now to
        then, of the sizes fresh then and now (1 when there is none)."""
        ratios = [self._median(t) / then for t, then in self.peers[tokens].items() if self._fresh(t)]
        if len(ratios) < 2:  # none: 1; one -- the usual case, a size measured most of the time -- is its own median
            return ratios[0] if ratios else 1.0
        return statistics.median(ratios)
