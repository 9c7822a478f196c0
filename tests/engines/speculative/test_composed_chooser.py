"""The composed-drafting chooser (engines/speculative/composed.py): its price of a chain with
n-gram tokens after it equals the expectation worked out by enumerating every verdict; on
synthetic machines and acceptance curves it picks n-gram for a long match the output keeps
copying, the chain otherwise, no drafts where drafting costs more than it brings, and a tail
only where the wider verify pays for it; each source's acceptance is counted from its own
positions (a tail only when the chain before it was wholly accepted)."""

from __future__ import annotations

import itertools

import pytest

from engines.speculative.composed import NGRAM, Chooser
from engines.speculative.costs import StepCosts


def learned(model: list[float], ngram: list[float], rounds: int = 10_000, **kw) -> Chooser:
    """A chooser whose counts show these acceptance-by-position curves (a prior of 2 rounds
    is noise beside 10 000)."""
    c = Chooser("mtp", **kw)
    for name, curve in (("mtp", model), (NGRAM, ngram)):
        seen = c.seen[name]
        reach = rounds
        for i, a in enumerate(curve):
            seen.reached[i], seen.accepted[i] = reach, round(reach * a)
            reach = round(reach * a)
    return c


def enumerated(model: list[float], ngram: list[float], chain: int, tail: int) -> float:
    """E[accepted + 1] by summing over every accept/reject pattern of the round's drafts."""
    rates = model[:chain] + ngram[:tail]
    expected = 0.0
    for flags in itertools.product([True, False], repeat=len(rates)):
        p = 1.0
        for a, flag in zip(rates, flags):
            p *= a if flag else 1 - a
        accepted = next((i for i, f in enumerate(flags) if not f), len(flags))
        expected += p * (accepted + 1)
    return expected


@pytest.mark.parametrize("chain, tail", [(0, 3), (2, 0), (2, 3), (4, 3), (1, 6)])
def test_the_price_of_a_round_is_its_expected_tokens_over_its_cost(chain, tail):
    model, ngram = [0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2], [0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6]
    c = learned(model, ngram)
    costs = StepCosts()
    for width in range(1, 9):
        costs.observe(width, 0.01 + 0.002 * width)
    c.measured(costs, 0.003)
    expected = enumerated(c.seen["mtp"].estimate(), c.seen[NGRAM].estimate(), chain, tail)
    cost = 0.01 + 0.002 * (1 + chain + tail) + 0.003 * chain
    assert c.rate(chain, tail) == pytest.approx(expected / cost, rel=1e-9)


def test_a_long_match_of_an_output_that_copies_drafts_from_ngram():
    c = learned(model=[0.7] * 7, ngram=[0.95] * 7)
    assert c.plan(found=6, k=3) == (6, 0)
    assert c.plan(found=0, k=3) == (0, 3)  # no match: the chain
    c = learned(model=[0.7] * 7, ngram=[0.3] * 7)
    assert c.plan(found=6, k=3) == (0, 3)  # the output stopped copying: the chain


def test_no_drafts_where_drafting_costs_more_than_it_brings():
    costs = StepCosts()
    for width in range(1, 9):
        costs.observe(width, 0.001)  # a verify of 8 costs what one token does
    c = learned(model=[0.6] * 7, ngram=[0.2] * 7)
    c.measured(costs, 0.002)  # a chain token costs two forwards: a tiny model's MTP on a CPU
    assert c.plan(found=0, k=3) == (0, 0)
    assert c.plan(found=4, k=3)[1] == 0  # n-gram, free to draft, may still pay
    c.measured(costs, 0.0)
    assert c.plan(found=0, k=3) == (0, 3)
    assert c.plan(found=4, k=0) == (0, 0)  # the schedule asked for a plain round


def test_a_tail_is_appended_where_the_wider_verify_pays_for_it():
    c = learned(model=[0.9] * 7, ngram=[0.9] * 7)
    assert c.tail(chain=2, found=7) == 5  # flat latency (a GPU): fill the round
    assert c.tail(chain=2, found=3) == 3
    assert c.tail(chain=7, found=3) == 0  # no room left
    dear = StepCosts()
    for width in range(1, 9):
        dear.observe(width, 0.01 * width)  # every verified token costs a forward's worth
    c.measured(dear, 0.0)
    assert c.tail(chain=2, found=5) == 0
    c = learned(model=[0.05] * 7, ngram=[0.99] * 7)
    assert c.tail(chain=2, found=5) == 5  # flat: worth a little, costs nothing


def test_each_source_counts_its_own_positions():
    c = Chooser("mtp")
    c.record(chain=3, proposed=6, accepted=2)  # the chain broke at its third draft: the tail was never reached
    assert c.seen["mtp"].reached[:3] == [1, 1, 1] and c.seen["mtp"].accepted[:3] == [1, 1, 0]
    assert c.seen[NGRAM].reached == [0] * 7
    c.record(chain=3, proposed=6, accepted=4)  # the chain accepted, the tail's second draft rejected
    assert c.seen[NGRAM].reached[:3] == [1, 1, 0] and c.seen[NGRAM].accepted[:2] == [1, 0]
    c.record(chain=0, proposed=2, accepted=2)
    assert c.seen[NGRAM].reached[:3] == [2, 2, 0]
    assert [c.source(0, 2), c.source(3, 3), c.source(3, 6), c.source(0, 0)] == ["ngram", "mtp", "mtp+ngram", None]


def test_rounds_that_did_not_draft_from_ngram_still_score_it():
    c = Chooser("mtp")
    c.shadow(found=[1, 2, 3], emitted=[1, 2])  # two emitted, both as n-gram would have drafted
    c.shadow(found=[5, 6], emitted=[7, 8, 9])  # its first draft would have been rejected
    assert c.seen[NGRAM].reached[:3] == [2, 1, 0] and c.seen[NGRAM].accepted[:2] == [1, 1]


def test_ngram_priced_out_by_early_misses_comes_back_once_the_output_copies():
    costs = StepCosts()
    for width in range(1, 9):
        costs.observe(width, 0.001 + 0.0002 * width)
    c = learned(model=[0.6] * 7, ngram=[0.05] * 7, rounds=20)
    c.measured(costs, 0.002)
    assert c.plan(found=7, k=2) == (0, 0)  # neither pays: plain rounds, no n-gram drafts to learn from
    for _ in range(40):  # the output starts repeating rows: plain rounds emit what n-gram proposed
        c.shadow(found=[4, 4, 4, 4, 4, 4, 4], emitted=[4])
    assert c.plan(found=7, k=2)[0] > 0


def test_kept_prices_follow_every_change_of_counts_and_costs():
    """Once measured, the chooser keeps its prices between rounds (rebuilding them each round costs
    a share of a tiny model's round), and its plans with them; whatever happens -- a verdict
    recorded, n-gram scored on a round it did not draft, new costs -- they equal prices and plans
    computed afresh."""
    import copy
    import random

    from engines.speculative.composed import Prices
    from engines.speculative.expected import expected_by_count

    rng = random.Random(0)
    c = Chooser("mtp")
    for step in range(400):
        op = rng.randrange(4)
        if op == 0 or step == 0:
            costs = StepCosts()
            for width in range(1, 9):
                costs.observe(width, 0.001 + rng.random() * 0.0005 * width)
            c.measured(costs, rng.random() * 0.002)
        elif op == 1:
            proposed = rng.randrange(1, 8)
            chain = rng.randrange(0, proposed + 1)
            c.record(chain, proposed, rng.randrange(0, proposed + 1))
        elif op == 2:
            c.shadow(found=[1, 2, 3, 4][: rng.randrange(1, 5)], emitted=[1, 2, 9][: rng.randrange(1, 4)])
        fresh = Prices(expected_by_count(c.seen["mtp"].estimate(), c.max_drafts),
                       expected_by_count(c.seen[NGRAM].estimate(), c.max_drafts),
                       [c.latency(1 + w) for w in range(c.max_drafts + 1)])
        assert c.prices() == fresh, step
        afresh = copy.copy(c)
        afresh.kept, afresh.expected = None, {}
        for found, k in [(rng.randrange(0, 8), rng.randrange(0, 4)) for _ in range(3)]:  # (32 plans: many kept)
            assert c.plan(found, k) == afresh.plan(found, k), step
