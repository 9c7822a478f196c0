"""Composed drafting: n-gram lookup beside a model drafter (an MTP chain, a draft model) in
one run, priced per round by the throughput model of tuning.py (the MtPC paper's accepted
tokens per unit of latency). Backend-agnostic: the chat proposer (engines/mlx_chat/composed.py)
and the OCR drafter (engines/glm_ocr/engine.py, ComposedDrafter) both ask this chooser.

A round drafts one of three ways, or not at all when none of them pays for itself:

    ngram        the n-gram continuation of the longest recurring suffix (m tokens; known
                 before choosing, since the lookup costs microseconds)
    model        the model drafter's chain of k
    model+ngram  the chain, then the n-gram continuation of context + chain: the tail only
                 counts if the whole chain is accepted, so its worth is discounted by the
                 chain's chance of getting there

priced as

    rate = E[accepted + 1] / (latency(1 + width) + chain * model_s)
    E[chain k, tail m] = E_model(k) + P(all k accepted) * (E_ngram(m) - 1)

with E_x(k) = expected_tokens(x's acceptance by position, k), latency(w) the verify forward
of w tokens and model_s what drafting one chain token costs (n-gram drafting is taken as
free). Acceptance by position is counted per source from the rounds it drafted: a chain's
positions for the model, the n-gram continuation's positions for n-gram, whether it drafted
alone or after a chain (a tail is counted only in rounds whose chain was wholly accepted:
only those reached it); n-gram's also from the rounds it did not draft, its continuation
scored against what they emitted (`shadow`: free, and unbiased). Why the tail is priced like
a lone n-gram draft: once the chain is accepted, context + chain is the real context, and the
tail is what a lone lookup there would have proposed.

Units: until the caller knows real costs, latency is flat (1.0 per forward: verifying is
nearly free, a GPU's case) and drafting costs nothing; `measured` costs (seconds) replace
both at once, so the two are never mixed. The choice depends only on the context, past rounds
and measured times, never on this round's draws: lossless like either source alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engines.speculative.costs import StepCosts
from engines.speculative.expected import expected_by_count
from engines.speculative.schedule import MAX_STEPS
from engines.speculative.tuning import PositionAcceptance

NGRAM = "ngram"
REPRICE_EVERY = 8  # rounds between re-readings of measured costs (each re-reading prices every width)


@dataclass
class Prices:
    """What pricing a round's options needs, by count: expected tokens of the model's first k
    drafts and of n-gram's first k (k = 0..max_drafts), and the verify of 1 + w tokens."""

    model: list[float]
    ngram: list[float]
    latency: list[float]
    plans: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)  # plan()'s
    # answers by (found, k) under these prices: a composed round asks one or two, the same ones round
    # after round while nothing changes (the loop over widths was ~4 us a round in place)


def flat(width: int) -> float:
    return 1.0


@dataclass
class Chooser:
    """Which source drafts this round (see the module docstring). `model` names the model
    drafter ("mtp", "draft"): its rounds' draft_source is that name, "ngram" for n-gram rounds,
    f"{model}+ngram" for a chain with the n-gram tail."""

    model: str
    max_drafts: int = MAX_STEPS  # a round's drafts, chain and tail together
    latency: Callable[[int], float] = flat  # the verify of w tokens (see Units above)
    model_s: float = 0.0  # drafting one chain token, in latency's unit
    seen: dict[str, PositionAcceptance] = field(default_factory=dict)  # changed by record and shadow only
    expected: dict[str, list[float]] = field(default_factory=dict)  # each source's expected tokens by count,
    # until its counts change (a model priced out is not re-estimated every round)
    keep: bool = False  # keep prices() between rounds: set by measured() (a latency function set by the
    # caller may change under them; a measured table changes only through measured())
    kept: Prices | None = field(default=None, repr=False)  # until a count or a measured cost changes

    def __post_init__(self):
        self.seen = {NGRAM: PositionAcceptance(self.max_drafts), self.model: PositionAcceptance(self.max_drafts)}

    @property
    def composed(self) -> str:
        return f"{self.model}+{NGRAM}"

    def measured(self, costs: StepCosts, model_s: float) -> None:
        """Price rounds in seconds from now on: the verify by width, a chain token's drafting."""
        widths = {w: costs.at(w) for w in range(1, self.max_drafts + 2)}  # read once, not per option priced
        self.latency, self.model_s = widths.__getitem__, model_s
        self.keep, self.kept = True, None

    def rate(self, chain: int, tail: int, prices: "Prices | None" = None) -> float:
        """Expected tokens per unit of latency of a round with `chain` model drafts and then
        `tail` n-gram drafts (chain 0: n-gram alone; both 0: a plain round)."""
        p = prices or self.prices()
        if chain:
            reach = p.model[chain] - p.model[chain - 1]  # P(all of the chain accepted)
            tokens = p.model[chain] + reach * (p.ngram[tail] - 1)
        else:
            tokens = p.ngram[tail]
        return tokens / (p.latency[chain + tail] + chain * self.model_s)

    def prices(self) -> "Prices":
        """This round's figures, computed once for all its options (a round prices up to nine:
        on a tiny model each microsecond of the host's is a share of the round), and kept across
        rounds once the costs are measured, until something they read changes."""
        if self.kept is not None:
            return self.kept
        prices = Prices(self._expected(self.model), self._expected(NGRAM),
                        [self.latency(1 + w) for w in range(self.max_drafts + 1)])
        if self.keep:
            self.kept = prices
        return prices

    def _expected(self, source: str) -> list[float]:
        if source not in self.expected:
            self.expected[source] = expected_by_count(self.seen[source].estimate(), self.max_drafts)
        return self.expected[source]

    def plan(self, found: int, k: int) -> tuple[int, int]:
        """Before drafting: (n-gram tokens, chain length) of the round that pays best of the
        `found` n-gram tokens alone (m, 0), the model's chain (0, k), or no drafts (0, 0) --
        where drafting costs more than it brings, as a tiny model's MTP layer can on a CPU.
        The n-gram continuation may be longer than k: it costs nothing to draft, so only the
        wider verify prices it. Ties go to the cheaper form."""
        if not k:
            return 0, 0
        p = self.prices()
        planned = p.plans.get((found, k))
        if planned is None:
            best, best_rate = (0, 0), self.rate(0, 0, p)
            for m in range(1, min(found, self.max_drafts) + 1):  # in order of cost: a tie keeps the cheaper
                if (r := self.rate(0, m, p)) > best_rate:
                    best, best_rate = (m, 0), r
            chain = min(k, self.max_drafts)
            planned = p.plans[found, k] = (0, chain) if self.rate(chain, 0, p) > best_rate else best
        return planned

    def tail(self, chain: int, found: int) -> int:
        """After a chain of `chain` drafts: how many of the `found` n-gram tokens that continue
        it to append (0: the chain alone pays best)."""
        room = min(found, self.max_drafts - chain)
        if not chain or room <= 0:
            return 0
        prices = self.prices()
        return max(range(room + 1), key=lambda m: (self.rate(chain, m, prices), -m))  # ties: the narrower verify

    def record(self, chain: int, proposed: int, accepted: int) -> None:
        """A round's verdict: `chain` of its `proposed` drafts came from the model (the rest
        from n-gram), `accepted` of them were accepted."""
        if chain:
            self.seen[self.model].record(chain, min(accepted, chain))
            self._changed(self.model)
        if proposed > chain and accepted >= chain:
            self.seen[NGRAM].record(proposed - chain, accepted - chain)
            self._changed(NGRAM)

    def shadow(self, found: list[int], emitted: list[int]) -> None:
        """A round that did not draft the n-gram continuation `found`: score it against the
        tokens the round emitted. Whatever drafted, the emitted tokens follow the target's law,
        so found[i] equals emitted[i] (given the positions before it did) with probability
        p(found[i]) -- exactly the chance it would have been accepted as a draft: the counts
        stay unbiased, at any temperature. Why: counted only from the rounds it drafted, a
        source priced out by a few misses is never tried again, even once the output starts
        copying (a page's first lines, then its repeated rows)."""
        compared = min(len(found), len(emitted))
        hits = next((i for i in range(compared) if found[i] != emitted[i]), compared)
        self.seen[NGRAM].record(compared, hits)
        self._changed(NGRAM)

    def _changed(self, source: str) -> None:
        """`source`'s counts changed: its expected tokens, and the kept prices, are stale."""
        self.expected.pop(source, None)
        self.kept = None

    def source(self, chain: int, proposed: int) -> str | None:
        """Round.draft_source of a round that drafted `chain` model tokens of `proposed`."""
        if not proposed:
            return None
        return NGRAM if not chain else self.model if chain == proposed else self.composed
