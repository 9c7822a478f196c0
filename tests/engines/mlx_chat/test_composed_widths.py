"""Chat's composed verify prices (engines/speculative/composed.py): a width measured slow does not
price every wider width out (the curve is monotone from below: StepCosts.from_below), and a
width no longer chosen is measured again -- after REMEASURE_AFTER rounds in a row that cut the
n-gram continuation short, one drafts all of it. On a cost model, no timings."""

from engines.speculative.composed import CHAIN_PROBE_AFTER, REMEASURE_AFTER, ComposedProposer, DraftingCosts
from engines.speculative.proposer import Context
from engines.speculative.sequence import Step
from engines.speculative.ngram import NGramProposer
from engines.speculative.composed import NGRAM
from engines.speculative.costs import StepCosts
from engines.types import Sampling

# a machine whose verify costs 2.0 ms for one token and 2.2 ms for 2-8 (the tiny Gemma 4 pair on
# this CPU), where the rounds of width 3 happened to run while another process was busy
MACHINE = {1: 0.0020, 2: 0.0022, 3: 0.0030, 4: 0.0022, 5: 0.0022, 6: 0.0022, 8: 0.0022}


def test_a_slow_width_raises_only_its_own_price():
    below, above = StepCosts(from_below=True), StepCosts()
    for width, seconds in MACHINE.items():
        below.observe(width, seconds)
        above.observe(width, seconds)
    assert [round(below.at(w), 4) for w in range(1, 9)] == [0.002] + [0.0022] * 7
    assert [round(above.at(w), 4) for w in range(1, 9)] == [0.002, 0.0022] + [0.003] * 6  # the old curve
    for sizes in ([1, 4, 8], [2, 3, 5, 16]):  # either way never cheaper for more tokens
        costs = StepCosts(from_below=True)
        for s in sizes:
            costs.observe(s, 0.001 * (len(sizes) - sizes.index(s)))  # measured dearer for fewer tokens
        curve = [costs.at(t) for t in range(1, 20)]
        assert curve == sorted(curve)


class PricedOut:
    """The model drafter's side of a composed run whose chain never pays (only its names are
    read, and `propose` by the probes)."""

    name, needs_hidden = "mtp", False

    def start(self, ctx):
        pass

    def commit(self, ctx):
        pass


def copying_run(costs: DraftingCosts) -> tuple[ComposedProposer, Context]:
    """A composed proposer over a context whose n-gram lookup finds a 7-token continuation, with
    n-gram's counts showing an acceptance of 0.3 at every position: seven drafts pay for a
    verify of 8 if it costs what one of 2 does, one draft if the wider ones cost half as much again."""
    ctx = Context([1, 2, 3, 4, 5, 6, 7, 8, 9] * 4, Sampling())
    proposer = ComposedProposer(PricedOut(), NGramProposer(1, 4), costs)
    proposer.start(ctx)
    seen = proposer.chooser.seen[NGRAM]
    for i in range(7):
        seen.reached[i], seen.accepted[i] = 1000 * 0.3**i, 1000 * 0.3 ** (i + 1)
    proposer.chooser.expected.clear()
    return proposer, ctx


def measured_costs(machine: dict[int, float]) -> DraftingCosts:
    costs = DraftingCosts()
    for width, seconds in machine.items():
        costs.observe(seconds, width, chain=0)
    costs.observe(0.0080, 3, chain=2)  # a chain token costs more than a forward: priced out
    return costs


def test_a_width_measured_slow_does_not_cut_every_wider_ngram_draft():
    proposer, ctx = copying_run(measured_costs(MACHINE))
    proposer._price()
    draft = proposer.propose(ctx, 2)
    assert draft.source == NGRAM and draft.size == 7  # the old curve priced 2..7 drafts at 3.0 ms: one draft


def test_a_continuation_cut_short_is_drafted_whole_every_so_often():
    dear = {w: 0.0020 + 0.0010 * (w > 2) for w in range(1, 9)}  # widths past 2 measured dear (stale, say)
    costs = measured_costs(dear)
    proposer, ctx = copying_run(costs)
    proposer._price()
    sizes = []
    for _ in range(2 * REMEASURE_AFTER):  # (fewer than CHAIN_PROBE_AFTER: no chain probe in the way)
        sizes.append(proposer.propose(ctx, 2).size)
        proposer.last = None  # not committed: the same context again
    assert 2 * REMEASURE_AFTER <= CHAIN_PROBE_AFTER
    whole = [i for i, s in enumerate(sizes) if s == 7]
    assert whole == [REMEASURE_AFTER - 1, 2 * REMEASURE_AFTER - 1], sizes
    assert set(sizes) == {1, 7}  # the chooser's own choice, one draft, the rest of the time


def test_a_chooser_that_drafts_the_whole_continuation_is_not_counted_as_cutting_it_short():
    costs = DraftingCosts()
    assert not any(costs.whole_continuation_due(7, 7) for _ in range(3 * REMEASURE_AFTER))
    assert [costs.whole_continuation_due(0, 7) for _ in range(REMEASURE_AFTER)][-1]
    assert costs.cut_short_in_a_row == 0


def test_rounds_without_a_chain_reprice_every_32():
    """Re-reading the measured costs prices every width (~100 us in place on the tiny Gemma 4
    pair): rounds without a chain do it every REPRICE_UNCHAINED_EVERY rounds (it was every 8);
    a chain round at once."""
    from engines.speculative.composed import REPRICE_UNCHAINED_EVERY, EMPTY

    proposer, _ = copying_run(measured_costs(MACHINE))
    readings = []
    proposer._price = lambda: readings.append(proposer.observed)
    for _ in range(64):
        proposer.last = (0, EMPTY, 0, [], [])  # a plain round in flight
        proposer.observe(Step(0, wall_s=0.002))
    assert REPRICE_UNCHAINED_EVERY == 32 and readings == [32, 64]
    proposer.last = (2, EMPTY, 0, [], None)  # a chain round
    proposer.observe(Step(0, wall_s=0.006))
    assert readings == [32, 64, 65]
