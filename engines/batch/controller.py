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

import math
from dataclasses import dataclass, field

from engines.speculative.costs import StepCosts
from engines.speculative.expected import expected_tokens
from engines.speculative.schedule import MAX_STEPS

@dataclass
class DraftBudget:
    costs: StepCosts = field(default_factory=StepCosts)
    cap: int = MAX_STEPS  # the cap now (what /v1/spec_decode/metrics and the rounds report)

    @classmethod
    def tuned(cls, spec, model: str) -> "DraftBudget":
        """Priced from the first step by this machine's tuning profile for the model (`specscope
        tune` measures forwards of 2, 4 and 8 sequences), when the spec names one (--steps auto);
        otherwise -- or for a profile that cannot serve, which each request's run says once --
        learned from the steps as they run. The steps' own times take over as they come."""
        from engines.profiles import Profile, ProfileError, profile_file

        if not spec.profile:
            return cls()
        drafter = spec.draft_model or ""
        try:
            profile = Profile.load(profile_file(spec.profile, model, spec.method, drafter), model, spec.method, drafter)
        except ProfileError:
            return cls()
        return cls(profile.batch_costs()) if profile.batch_s else cls()

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
        return 1.0 + self.offers * (expected_tokens([self.acceptance], k) - 1.0)


def row_acceptance(accepted: int, rejections: int) -> float:
    """A row's per-position acceptance a: each drafted position is accepted with probability a
    until the first rejection, so a round yields its accepted drafts and at most one rejection;
    the estimate is accepted / (accepted + rejections), with a uniform prior (1/2 at first)."""
    return (accepted + 1) / (accepted + rejections + 2)


def row_odds(accepted: int, rejections: int, asked: int, offered: int) -> RowOdds:
    """A row's odds from its counts: rounds asked to draft and rounds that offered drafts (with
    the same uniform prior)."""
    return RowOdds(row_acceptance(accepted, rejections), (offered + 1) / (asked + 2))
