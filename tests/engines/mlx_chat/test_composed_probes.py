"""Chat's composed probes (engines/speculative/composed.py, DraftingCosts.form): a drafter priced
out is re-tried with a one-draft round after CHAIN_PROBE_AFTER rounds without a chain, each
probe after which it is still priced out doubles that wait (up to CHAIN_PROBE_MAX), and a
chain chosen on its merits -- or right after a probe -- brings the wait back to the start."""

from engines.speculative.composed import CHAIN_PROBE_AFTER, CHAIN_PROBE_MAX, PROBE_AFTER, DraftingCosts


def measured() -> DraftingCosts:
    costs = DraftingCosts()
    costs.observe(0.001, 1, 0)  # a verify measured: no plain round forced
    return costs


def probes(costs: DraftingCosts, rounds: int, chain: int = 0) -> list[int]:
    """The rounds (0-based) the probes turned into one-draft chains, the chooser asking for
    `chain` drafts every round."""
    return [i for i in range(rounds) if costs.form(chain, k=2) == 1]


def test_a_drafter_still_priced_out_is_probed_ever_more_rarely():
    at = probes(measured(), 6000)
    gaps = [b - a for a, b in zip([-1] + at, at)]
    waits = [CHAIN_PROBE_AFTER * 2**i for i in range(5)]  # 64 .. 1024
    assert waits[-1] == CHAIN_PROBE_MAX
    assert gaps == [w + 1 for w in waits] + [CHAIN_PROBE_MAX + 1] * (len(gaps) - 5), gaps
    assert len(at) <= 8  # once every 65 rounds would be 92


def test_a_chain_chosen_on_its_merits_brings_the_probes_back_soon():
    costs = measured()
    assert probes(costs, 200) == [64, 193]  # the second wait was doubled
    assert costs.form(2, k=2) is None  # the chooser chains: drafting pays again
    assert probes(costs, 100) == [64]
    assert costs.form(2, k=2) is None  # the round after that probe chains: the wait stays at the start
    assert probes(costs, 100) == [64]


def test_a_chooser_that_always_chains_gets_a_plain_round_in_every_few():
    costs = DraftingCosts()
    forced = [costs.form(2, k=2) for _ in range(3 * (PROBE_AFTER + 1))]
    assert forced[0] == 0  # no verify measured yet: the first round that would chain runs plain
    costs.observe(0.001, 1, 0)
    forced = [costs.form(2, k=2) for _ in range(3 * (PROBE_AFTER + 1))]
    plain = [i for i, f in enumerate(forced) if f == 0]
    assert [b - a for a, b in zip(plain, plain[1:])] == [PROBE_AFTER + 1] * (len(plain) - 1) and len(plain) >= 2
