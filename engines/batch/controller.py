"""The batch-aware draft controller (the mlx-lm server plan's dynamic controller, measured).

Alone, a sequence's drafts are nearly free to verify on a GPU and cost ~1.5x a plain step for
six tokens on this CPU. In a batch every row pays for the widest row (the forward is padded),
and the forward's cost grows with B x width, so drafts that pay at B=1 may not at B=8. The
controller caps every row's draft length at the k that maximises expected tokens per second
for the batch as it is now:

    k* = argmax_k  sum over rows of E[tokens | k, a_row]  /  cost(B, 1 + k)

with E[tokens | k, a] = 1 + a + ... + a^k (a = the row's acceptance so far, each drafted
position accepted with probability a given the previous ones -- the MtPC paper's throughput
model, tokens per round over round latency) and cost(B, w) the measured step time of a forward
of B x w tokens (StepCosts: per size, interpolated, following the machine). Until two
different forward sizes have been seen it does not cap (it has nothing to go on), and a
sequence alone in the batch drafts what its own settings ask (the controller answers for
what the batch costs, not for the user's choice of k). Speculation stays lossless whatever the
cap: it only changes how many drafts are offered.
"""

from __future__ import annotations

import bisect
import math
import itertools
import statistics
from collections import deque
from dataclasses import dataclass, field

from engines.speculative.schedule import MAX_STEPS


@dataclass
class StepCosts:
    """Measured seconds of a step per forward size (tokens = rows x width): the median of the
    last few steps of each size seen, linear between sizes, the slope of the largest two beyond
    them, and never cheaper for more tokens. Why not one straight line through all: on a CPU a
    forward of a few tokens costs about what one token does (reading the weights dominates) and
    grows linearly once compute dominates; a line would price small forwards too dear and large
    ones too cheap. Why a median: another process on the machine makes a step slow now and then,
    and a mean would carry that spike for many steps -- on a loaded 2-core machine it stopped
    drafting where drafting paid, and kept it where it did not."""

    recent: int = 7  # steps kept per size
    history: dict[int, deque] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)  # the median per size

    def observe(self, tokens: int, seconds: float) -> None:
        seen = self.history.setdefault(tokens, deque(maxlen=self.recent))
        seen.append(seconds)
        self.seconds[tokens] = statistics.median(seen)

    @property
    def ready(self) -> bool:
        return len(self.seconds) >= 2

    def at(self, tokens: int) -> float:
        sizes = sorted(self.seconds)
        costs = list(itertools.accumulate((self.seconds[t] for t in sizes), max))  # non-decreasing
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


def expected_tokens(k: int, acceptance: float) -> float:
    """1 + a + ... + a^k: the target's token plus the accepted prefix of k drafts."""
    return sum(acceptance ** i for i in range(k + 1))


@dataclass
class DraftBudget:
    costs: StepCosts
    cap: int = MAX_STEPS  # the cap now (what /v1/spec_decode/metrics and the rounds report)

    @classmethod
    def new(cls) -> "DraftBudget":
        return cls(StepCosts())

    def observe(self, batch: int, width: int, seconds: float) -> None:
        self.costs.observe(batch * width, seconds)

    def choose(self, rows: list["RowOdds | float | None"]) -> int:
        """The cap for the next step. `rows`: each running row's odds (a bare float is an
        acceptance with drafts always offered), or None for a row that does not draft (it still
        pays for the padded width)."""
        drafting = [r if isinstance(r, RowOdds) else RowOdds(r) for r in rows if r is not None]
        if not drafting or len(rows) < 2 or not self.costs.ready:
            self.cap = MAX_STEPS
            return self.cap
        batch = len(rows)
        # A step is as wide as its longest row: 1 + k if any row offers drafts, else 1 (n-gram
        # rows with no match offer none).
        none_offer = math.prod(1.0 - r.offers for r in drafting)

        def rate(k: int) -> float:
            tokens = sum(r.expected_tokens(k) for r in drafting) + (batch - len(drafting))
            cost = (1 - none_offer) * self.costs.cost(batch, 1 + k) + none_offer * self.costs.cost(batch, 1)
            return tokens / cost

        self.cap = max(range(MAX_STEPS + 1), key=rate)
        return self.cap


@dataclass(frozen=True)
class RowOdds:
    """A drafting row as the controller sees it: its per-position acceptance, and how often it
    offers drafts at all when asked (n-gram lookup finds no match on some rounds, and such a
    round still pays for the batch's padded width)."""

    acceptance: float
    offers: float = 1.0

    def expected_tokens(self, k: int) -> float:
        return 1.0 + self.offers * (expected_tokens(k, self.acceptance) - 1.0)


def row_acceptance(accepted: int, rejections: int) -> float:
    """A row's per-position acceptance a: each drafted position is accepted with probability a
    until the first rejection, so a round yields its accepted drafts and at most one rejection;
    the estimate is accepted / (accepted + rejections), with a uniform prior (1/2 at first)."""
    return (accepted + 1) / (accepted + rejections + 2)


def row_odds(accepted: int, rejections: int, asked: int, offered: int) -> RowOdds:
    """A row's odds from its counts: rounds asked to draft and rounds that offered drafts (with
    the same uniform prior)."""
    return RowOdds(row_acceptance(accepted, rejections), (offered + 1) / (asked + 2))
