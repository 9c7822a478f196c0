"""Chat's composed proposer asks a forward for the target's hidden state only when the round
after it may chain (engines/speculative/composed.py, ComposedProposer.needs_hidden): with the
drafter priced out, plain and n-gram rounds run without it, the round before a due probe and
every chain round with it, and a chain is never started from an older round's state. On a
cost model, no timings. (The end-to-end runs -- lossless, priced out, probed -- are in
tests/engines/training/test_composed.py.)"""

import mlx.core as mx

from engines.speculative.composed import ComposedProposer, DraftingCosts
from engines.speculative.proposer import Context
from engines.speculative.ngram import NGramProposer
from engines.speculative.proposer import Draft
from engines.types import Sampling


class Drafter:
    """An MTP drafter's side of the protocol: it reads the hidden state and drafts `k` zeros."""

    name, needs_hidden = "mtp", True

    def __init__(self):
        self.chains = 0

    def start(self, ctx):
        assert ctx.hidden is not None

    def propose(self, ctx, k):
        assert ctx.hidden is not None, "a chain from a state the last forward did not return"
        self.chains += 1
        return Draft(mx.zeros((k,), dtype=mx.uint32))

    def commit(self, ctx):
        pass


def priced(chain_token_s: float) -> DraftingCosts:
    costs = DraftingCosts()
    for width in range(1, 9):
        costs.observe(0.002, width, chain=0)  # a verify costs 2 ms whatever its width
    costs.observe(0.002 + 2 * chain_token_s, 3, chain=2)
    return costs


def run(costs: DraftingCosts, rounds: int) -> tuple[ComposedProposer, list[tuple[bool, bool]]]:
    """`rounds` rounds on a context the n-gram lookup finds nothing in, the loop's way: propose,
    then the forward (returning the hidden state if needs_hidden says so), then commit. Returns
    (needs_hidden at each forward, whether that round chained)."""
    ctx = Context(list(range(10)), Sampling(), hidden=mx.zeros((4,)))
    proposer = ComposedProposer(Drafter(), NGramProposer(1, 4), costs)
    proposer.start(ctx)
    seen = []
    for i in range(rounds):
        chains = proposer.model.chains
        proposer.propose(ctx, 2)
        seen.append((proposer.needs_hidden, proposer.model.chains > chains))
        ctx.hidden = mx.zeros((4,)) if proposer.needs_hidden else None  # as the loop's _commit sets it
        ctx.tokens.append(100 + i)  # never seen before: no n-gram match
        proposer.last = None
        proposer.commit(ctx)
    return proposer, seen


def test_a_priced_out_drafter_leaves_plain_rounds_without_the_hidden_state():
    proposer, seen = run(priced(chain_token_s=0.01), 40)  # a chain token costs 5 verifies
    assert proposer.model.chains == 0
    assert [wanted for wanted, _ in seen] == [False] * 40  # the old proposer asked every forward


def test_the_round_before_a_probe_and_every_chain_round_return_it():
    costs = priced(chain_token_s=0.01)
    proposer, seen = run(costs, 200)
    probes = [i for i, (_, chained) in enumerate(seen) if chained]
    assert probes == [64, 193], probes  # every probe drafted (none found the state stale), as without the gating
    wanted = [i for i, (w, _) in enumerate(seen) if w]
    assert wanted == sorted({p - 1 for p in probes} | set(probes)), (wanted, probes)


def test_a_chain_the_chooser_wants_again_waits_one_round_for_the_state():
    costs = priced(chain_token_s=0.01)
    proposer, seen = run(costs, 5)
    cheap = priced(chain_token_s=0.0)  # drafting got cheap: the chooser chains from now on
    proposer.costs, proposer.chooser.expected = cheap, {}
    proposer._price()
    ctx = Context(list(range(30)), Sampling(), hidden=None)  # the last forward had none
    first = proposer.propose(ctx, 2)
    assert first.size == 0 and proposer.needs_hidden  # plain, and this forward returns the state
    ctx.hidden = mx.zeros((4,))
    ctx.tokens.append(999)
    proposer.commit(ctx)
    assert proposer.propose(ctx, 2).size >= 2 and proposer.model.chains == 1
