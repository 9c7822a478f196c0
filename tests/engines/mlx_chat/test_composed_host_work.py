"""A composed round whose drafter is priced out should cost the host what an n-gram round does
(engines/speculative/composed.py): on the tiny Gemma 4 pair a round is ~2 ms and each 20 us of
Python a percent. Counted here as work done, not timed: a round observed takes no median (the
verify's curve is read only when the chooser is re-priced), and the chooser prices a choice once
while nothing it reads changes -- with the same answers as pricing every round."""

import random

from engines.speculative.composed import REPRICE_UNCHAINED_EVERY, ComposedProposer, DraftingCosts
from engines.speculative.proposer import Context
from engines.speculative.sequence import Step
from engines.speculative.ngram import NGramProposer
from engines.speculative import composed as chooser_module
from engines.speculative import costs as costs_module
from engines.speculative.composed import Chooser
from engines.speculative.costs import LoadScaledCosts, StepCosts
from engines.types import Sampling


class PricedOut:
    """The model drafter's side of a composed run whose chain never pays."""

    name, needs_hidden = "mtp", False

    def start(self, ctx):
        pass

    def commit(self, ctx):
        pass


def priced_out() -> DraftingCosts:
    costs = DraftingCosts()
    for width in range(1, 9):
        costs.observe(0.002 + 0.0001 * width, width, chain=0)
    costs.observe(0.010, 3, chain=2)  # a chain token costs two verifies: priced out
    return costs


def rounds(proposer: ComposedProposer, ctx: Context, n: int) -> None:
    """`n` rounds the loop's way on a context the n-gram lookup finds nothing in."""
    for _ in range(n):
        proposer.propose(ctx, 2)
        proposer.observe(Step(0, wall_s=0.002))
        ctx.tokens.append(1000 + len(ctx.tokens))  # never seen before
        proposer.commit(ctx)


def test_a_round_without_a_chain_takes_no_median(monkeypatch):
    proposer = ComposedProposer(PricedOut(), NGramProposer(1, 4), priced_out())
    ctx = Context(list(range(10)), Sampling())
    proposer.start(ctx)
    medians = []
    real = costs_module.statistics.median
    monkeypatch.setattr(costs_module.statistics, "median", lambda xs: medians.append(1) or real(xs))
    rounds(proposer, ctx, 2 * REPRICE_UNCHAINED_EVERY)
    assert proposer.chooser.plan(0, 2) == (0, 0)  # priced out all along: no chain, no probe yet
    assert len(medians) == 2 * 2  # at each of the two re-pricings one width's (1) and the chain token's;
    # it was 64 + 2


def test_a_choice_is_priced_once_while_nothing_it_reads_changes(monkeypatch):
    proposer = ComposedProposer(PricedOut(), NGramProposer(1, 4), priced_out())
    ctx = Context(list(range(10)), Sampling())
    proposer.start(ctx)
    rounds(proposer, ctx, 1)
    priced = []
    real = Chooser.rate
    monkeypatch.setattr(chooser_module.Chooser, "rate", lambda self, *a: priced.append(a) or real(self, *a))
    rounds(proposer, ctx, REPRICE_UNCHAINED_EVERY - 2)  # (no re-pricing among them)
    assert priced == []  # each round priced plain against the chain again before


def test_costs_taken_in_later_price_as_taken_in_at_once():
    """DraftingCosts keeps the rounds until the curve is read (StepCosts.observe_many): the same
    curve as observing each round, for chat's StepCosts and --steps auto's LoadScaledCosts."""
    rng = random.Random(1)
    for make in (lambda: StepCosts(from_below=True), LoadScaledCosts):
        at_once, later = make(), make()
        for _ in range(50):
            steps = [(rng.randrange(1, 9), rng.uniform(0.001, 0.004)) for _ in range(rng.randrange(0, 40))]
            for width, seconds in steps:
                at_once.observe(width, seconds)
            later.observe_many(steps)
            assert later.seconds == at_once.seconds
            assert [later.at(w) for w in range(1, 12)] == [at_once.at(w) for w in range(1, 12)]
    costs, fresh = DraftingCosts(), StepCosts(from_below=True)
    assert not costs.verify_measured
    for _ in range(100):
        width, seconds = rng.randrange(1, 9), rng.uniform(0.001, 0.004)
        costs.observe(seconds, width, chain=0)
        fresh.observe(width, seconds)
        assert costs.verify_measured
        if rng.random() < 0.1:
            assert costs.verify_costs().seconds == fresh.seconds


def test_load_scaled_costs_taken_in_later_through_a_changing_load():
    """LoadScaledCosts.observe_many notes a size's peers only where a later step can read them:
    the same prices as observe() step by step where sizes go stale within a batch (a short
    `fresh`) and the load moves between batches -- the steps that scale stale sizes."""
    rng = random.Random(2)
    for fresh in (1, 4, 32):
        at_once, later = LoadScaledCosts(fresh=fresh, from_below=True), LoadScaledCosts(fresh=fresh, from_below=True)
        for _ in range(200):
            load = rng.choice([1.0, 1.0, 2.0, 3.5])
            steps = [(1 if rng.random() < 0.8 else rng.randrange(2, 9), load * rng.uniform(0.001, 0.0012))
                     for _ in range(rng.randrange(0, 80))]
            for width, seconds in steps:
                at_once.observe(width, seconds)
            later.observe_many(steps)
            assert later.seconds == at_once.seconds
            assert later.peers == at_once.peers  # what a stale size's next step, or the prices, read
