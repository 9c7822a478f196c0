"""What chat's composed proposer keeps across requests (engines/mlx_chat/composed.py,
DraftingCosts): each source's acceptance, the next request's prior, apart for greedy and sampled
runs. Counted as choices on a cost model, no timings; each of these fails on the code before."""

import mlx.core as mx

from engines.mlx_chat.composed import ComposedProposer, DraftingCosts
from engines.mlx_chat.proposers import Draft, NGramProposer, ProposerContext
from engines.types import Sampling


class Drafter:
    """An MTP drafter's side of the protocol: it drafts `k` zeros, which the context (tokens
    100, 101, ...) never continues with -- every chain token is rejected."""

    name, needs_hidden, drafts_ahead = "mtp", True, False

    def __init__(self):
        self.chains = 0

    def start(self, ctx):
        pass

    def propose(self, ctx, k):
        self.chains += 1
        return Draft(mx.zeros((k,), dtype=mx.uint32))

    def commit(self, ctx):
        pass


def cheap_chains() -> DraftingCosts:
    """A machine where a chain pays if half its tokens are accepted: a verify 2 ms whatever its
    width, a chain token a tenth of one."""
    costs = DraftingCosts()
    for width in range(1, 9):
        costs.observe(0.002, width, chain=0)
    costs.observe(0.002 + 2 * 0.0002, 3, chain=2)
    return costs


def request(costs: DraftingCosts, rounds: int, sampling: Sampling = Sampling()) -> int:
    """One request of `rounds` rounds the loop's way (no n-gram match); the chains it drafted."""
    ctx = ProposerContext(list(range(10)), sampling, None, None, hidden=mx.zeros((4,)))
    proposer = ComposedProposer(Drafter(), NGramProposer(1, 4), costs)
    proposer.start(ctx)
    for i in range(rounds):
        draft = proposer.propose(ctx, 2)
        proposer.observe(0.002 + 0.0002 * draft.size)  # this machine's price of the round
        ctx.hidden = mx.zeros((4,))
        ctx.tokens.append(100 + i)  # the target's token: never a drafted zero
        proposer.commit(ctx)
    return proposer.model.chains


def test_a_later_request_starts_from_the_drafters_acceptance_so_far():
    costs = cheap_chains()
    first = request(costs, 6)
    assert first >= 1  # one half at first: a chain pays at these prices, and is rejected
    assert request(costs, 6) == 0  # was 1 or more: each request started from one half again
    assert sum(costs.acceptance[True]["mtp"].reached) == first  # its rounds counted across requests
    assert request(costs, 1, Sampling(temperature=1.0)) == 1  # sampled runs keep their own: one half
