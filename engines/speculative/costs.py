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
    and a mean would carry that spike for many steps -- on a loaded 2-core machine it stopped
    drafting where drafting paid, and kept it where it did not.

    `from_below`: make the curve monotone from below instead -- each size no dearer than the
    cheapest larger size measured -- so a slow round raises only its own size's price. From
    above (the default), one size stuck high (a few slow rounds, under load) lifts every larger
    size with it; a chooser then stops choosing them and never measures them again (composed
    drafting, engines/mlx_chat/composed.py, drafted 2 of a 7-token n-gram continuation for a
    whole pass). Another process only ever slows a round down, so a larger size measured
    cheap bounds the smaller ones."""

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
    """StepCosts whose sizes follow the machine's load together: each step is kept divided by
    the load level it ran at and priced at the level now. The level is the median, over the
    last `recent` steps of any size, of each step's cost against its size's kept price: another
    process on the machine slows every size by about the same factor, so the sizes measured
    now tell what the others cost now. `seconds` holds the prices at the level now.

    Why (`--steps auto`, engines/speculative/tuning.py): a size is measured only while it is
    chosen or probed, and the chat engine keeps the costs across requests, so kept as measured
    they were a patchwork of loads -- a size measured before a load rose stayed cheap, one
    measured under a passing load stayed dear after it passed. What a size costs against the
    others, which a load does not change, is what the choice of k depends on."""

    level: float = 1.0  # the load now, against the level the kept steps were divided by
    levels: deque = field(default_factory=deque)  # the last `recent` steps' cost / their size's kept price
    base: dict[int, float] = field(default_factory=dict)  # size -> the median of its kept steps (level 1)

    def __post_init__(self):
        self.levels = deque(self.levels, maxlen=self.recent)

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens in self.base:  # a size already priced: this step says how loaded the machine is now
            self.levels.append(seconds / self.base[tokens])
            self.level = statistics.median(self.levels)
        # divided by the level this step helped set: a load that lasts moves the level within
        # recent // 2 + 1 steps, before it moves a size's median (each size gets at most every
        # step), so the kept steps of the size being chosen stay at level 1
        seen = self.history.setdefault(tokens, deque(maxlen=self.recent))
        seen.append(seconds / self.level)
        self.base[tokens] = statistics.median(seen)
        self.seconds = {t: b * self.level for t, b in self.base.items()}
        self.curve = None
