"""The batch-aware draft controller (engines/batch/controller.py) on synthetic machines whose
step cost and acceptance are known: its pick equals the brute-force best k, its cost fit
recovers the machine, and it caps drafting as the batch grows or acceptance falls."""

from __future__ import annotations

import itertools

import pytest

from engines.batch.controller import DraftBudget, RowOdds, row_acceptance, row_odds
from engines.speculative.costs import StepCosts
from engines.speculative.expected import expected_tokens
from engines.speculative.schedule import MAX_STEPS


def budget_for(c0: float, c1: float) -> DraftBudget:
    b = DraftBudget()
    for batch, width in itertools.product((1, 2, 4, 8), (1, 3, 6, 8)):
        b.observe(batch, width, c0 + c1 * batch * width)
    return b


def test_the_costs_recover_the_machine_between_and_beyond_the_sizes_measured():
    costs = budget_for(0.05, 0.004).costs
    for tokens in (1, 5, 7, 24, 48, 64, 100):
        assert costs.at(tokens) == pytest.approx(0.05 + 0.004 * tokens, rel=1e-9)


def test_a_flat_then_linear_machine_is_priced_as_it_is():
    """A CPU: a forward costs the same up to 8 tokens (the weights' read), then grows."""
    costs = StepCosts()
    machine = lambda t: 0.06 if t <= 8 else 0.06 + 0.01 * (t - 8)  # noqa: E731
    for t in (1, 4, 8, 16, 32):
        costs.observe(t, machine(t))
    assert costs.at(6) == pytest.approx(0.06) and costs.at(24) == pytest.approx(machine(24))
    assert costs.at(48) == pytest.approx(machine(48))


@pytest.mark.parametrize("c0,c1", [(0.05, 0.0), (0.05, 0.002), (0.05, 0.02), (0.01, 0.05)])
@pytest.mark.parametrize("rows", [[0.9, 0.9], [0.6, 0.3], [0.2, 0.2, 0.2, 0.2], [0.8, None, 0.5, None, 0.1, 0.7, 0.9, 0.4]])
def test_the_pick_is_the_best_k(c0, c1, rows):
    b = budget_for(c0, c1)
    batch = len(rows)

    def rate(k):
        tokens = sum(expected_tokens([a], k) if a is not None else 1.0 for a in rows)
        return tokens / (c0 + c1 * batch * (1 + k))

    best = max(rate(k) for k in range(MAX_STEPS + 1))
    assert rate(b.choose(rows)) == pytest.approx(best, rel=1e-9)


def test_free_verification_drafts_fully_and_dear_verification_stops_drafting():
    assert budget_for(0.05, 0.0).choose([0.3, 0.3]) == MAX_STEPS
    assert budget_for(0.001, 0.05).choose([0.2] * 8) == 0


def test_a_bigger_batch_drafts_less():
    b = budget_for(0.02, 0.003)
    caps = [b.choose([0.6] * n) for n in (2, 4, 8, 16)]
    assert caps == sorted(caps, reverse=True) and caps[0] > caps[-1]


def test_no_cap_before_two_forward_sizes_were_measured():
    b = DraftBudget()
    b.observe(4, 2, 0.1)
    b.observe(4, 2, 0.2)
    assert not b.costs.ready and b.choose([0.1, 0.1]) == MAX_STEPS


def test_row_acceptance_is_the_per_position_rate():
    # a row that accepted 3 of 4 positions in one round, then rejected its first draft twice
    assert row_acceptance(accepted=3, rejections=3) == pytest.approx(4 / 8)
    assert row_acceptance(0, 0) == 0.5


def test_a_sequence_alone_drafts_what_it_asks():
    assert budget_for(0.001, 0.05).choose([0.2]) == MAX_STEPS


def test_rows_that_rarely_offer_drafts_make_drafting_pay_less():
    """n-gram rows that find no match half the time still pay for the padded width: with the
    same acceptance, such a batch drafts no more than one whose rows always offer."""
    b = budget_for(0.02, 0.003)
    always = b.choose([RowOdds(0.6, 1.0)] * 6)
    half = b.choose([RowOdds(0.6, 0.5)] * 6)
    rare = b.choose([RowOdds(0.6, 0.05)] * 6)
    assert always >= half >= rare and always > rare


def test_row_odds_count_offers_among_the_rounds_asked():
    odds = row_odds(accepted=3, rejections=3, asked=8, offered=2)
    assert odds.acceptance == pytest.approx(0.5) and odds.offers == pytest.approx(3 / 10)


def test_one_slow_step_does_not_move_the_costs():
    """Another process makes one step of a size 10x slower: the median per size ignores it."""
    b = budget_for(0.02, 0.003)
    b.observe(4, 1, 0.02 + 0.003 * 4)  # the plain size seen a few times, as in a run
    b.observe(4, 1, 0.02 + 0.003 * 4)
    before = b.choose([0.6] * 4)
    b.observe(4, 1, 0.2)  # a spike at the plain size would make drafting look free
    assert b.costs.cost(4, 1) == pytest.approx(0.02 + 0.003 * 4)
    assert b.choose([0.6] * 4) == before


def test_a_step_is_priced_at_the_width_its_rows_make():
    """Rows that never offer drafts leave the step one token wide whatever the cap."""
    b = budget_for(0.02, 0.003)
    assert b.choose([RowOdds(0.6, 0.0)] * 4) in range(MAX_STEPS + 1)  # no division by a zero gain
    rows = [RowOdds(0.9, 0.5)] * 2
    p_none = 0.25
    k = b.choose(rows)

    def rate(k):
        cost = (1 - p_none) * (0.02 + 0.003 * 2 * (1 + k)) + p_none * (0.02 + 0.003 * 2)
        return sum(r.expected_tokens(k) for r in rows) / cost

    assert rate(k) == pytest.approx(max(rate(j) for j in range(MAX_STEPS + 1)), rel=1e-9)
