"""What chat's composed proposer keeps of a machine whose load changes (engines/speculative/composed.py,
DraftingCosts): a verify width priced at the load now, not at the load it was last measured under;
a chain token's drafting priced as a share of a plain verify, not as seconds beyond a verify
measured later. Counted as choices on a cost model, no timings; each fails on the code before."""

from engines.speculative.composed import DraftingCosts
from engines.speculative.composed import NGRAM, Chooser


def test_a_width_priced_under_a_passing_load_follows_the_load_now():
    """Every width measured at 2 ms, then 6 under a passing load (the widths n-gram drafted
    then), then only plain rounds, back at 2 ms: the wider verifies are priced at the load now."""
    costs = DraftingCosts()
    for seconds in (0.002, 0.006):
        for _ in range(7):
            for width in range(1, 9):
                costs.observe(seconds, width, chain=0)
    for _ in range(40):
        costs.observe(0.002, 1, chain=0)
    verify = costs.verify_costs()
    assert verify.at(1) == 0.002
    assert verify.at(8) < 0.0021  # was 0.006: the last median measured, three times a plain round now
    chooser = Chooser("mtp")
    for _ in range(40):
        chooser.record(0, 7, 3)  # n-gram's continuation: three of seven accepted, every round
    chooser.measured(verify, 0.001)
    assert chooser.plan(found=7, k=2)[0] > 0  # was (0, 0): n-gram priced out until a width was re-measured


def test_a_chain_token_is_priced_at_the_load_now():
    """A chain round measured at 2 ms verifies (its chain token 1 ms, half a verify), then every
    width re-measured at 6 ms under a load: the chain token costs 3 ms now, not 6 - 3 < 0 = free."""
    costs = DraftingCosts()
    for width in range(1, 9):
        costs.observe(0.002, width, chain=0)
    costs.observe(0.003, 2, chain=1)
    assert abs(costs.chain_token_s - 0.001) < 1e-12
    for _ in range(7):
        for width in range(1, 9):
            costs.observe(0.006, width, chain=0)
    assert abs(costs.chain_token_s - 0.003) < 1e-12  # was 0.0
    chooser = Chooser("mtp")  # one half at every position: a chain pays only where drafting is cheap
    chooser.measured(costs.verify_costs(), costs.chain_token_s)
    assert chooser.plan(found=0, k=2) == (0, 0)  # was (0, 2): a chain of 2 at ~3 plain rounds' cost
    assert chooser.seen[NGRAM].reached == [0] * 7
