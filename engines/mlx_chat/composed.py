"""Composed drafting for chat: n-gram lookup beside a model drafter (the Gemma 4 assistant, a
drafter trained here, a draft model) in one run. Each round asks the chooser of
engines/speculative/composed.py, which prices the three forms by expected tokens per unit of
verify latency -- the run's measured latency when `--steps auto` knows it, else a flat one --
and against a plain round (no drafts) when none of them pays:

    ngram        the n-gram continuation of the longest recurring suffix (found before
                 choosing: the lookup costs microseconds), up to 7 tokens whatever k
    model        the model's chain of k
    model+ngram  the chain, then the n-gram tokens that continue context + chain, as many as
                 pay for the wider verify (the chain's tokens are read on the host for the
                 lookup: with depth-2 overlap that waits for the anticipated chain, which the
                 verify would wait for anyway)

Drafting is priced from the run's own rounds (`observe`): rounds without a chain give the
verify's cost by width, and a chain round's time beyond the verify of its width, per chain
token, is what drafting costs -- its own chain if drafted then, and the next one anticipated
behind its verify (depth-2 overlap), wasted or not. Chains are anticipated only after a chain
round (the next round likely chains again; after an n-gram round it is drafted when chosen).
A run whose rounds all chain measures no verify alone, so the first round that would chain
runs plain, and so does one in every PROBE_AFTER chain rounds in a row: without it a drafter
that costs more than it brings -- the tiny Gemma 4 pair's assistant on a CPU -- would be chosen
forever by the flat prices it starts with. The other way, a drafter priced out drafts one token
after CHAIN_PROBE_AFTER rounds without a chain, so a slow start (a first chain's compile, a
busy machine) does not price it out for good.
At T>0 a tail's tokens are point masses beside the chain's sampled drafts: their rows of q
are one-hot, which rejection sampling reads as "accept with p(x), resample from p without x".
The choice depends only on the context and on past rounds, never on this round's draws:
lossless like either source alone.
"""

from __future__ import annotations

import statistics
from collections import deque

import mlx.core as mx

from engines.mlx_chat.proposers import Draft, LazyVerdict, NGramProposer, ProposerContext
from engines.speculative.composed import Chooser
from engines.speculative.costs import StepCosts

PROBE_AFTER = 8  # chain rounds in a row before one plain round measures the verify alone
CHAIN_PROBE_AFTER = 24  # rounds without a chain before one of a single draft re-measures drafting
MEASURED = True  # False: flat prices and no probes, the forms chosen by acceptance alone
# (tests that must see every form, whatever this machine's timings)
CHAIN_ROUNDS_KEPT = 7  # a chain token's cost: the median of the last few chain rounds


class ComposedProposer:
    def __init__(self, model, ngram: NGramProposer):
        self.model = model  # MTPProposer or DraftModelProposer
        self.ngram = ngram
        self.name = f"{model.name}+ngram"
        self.needs_hidden = model.needs_hidden
        self.drafts_ahead = model.drafts_ahead
        self.chooser = Chooser(model.name)
        self.last: tuple[int, Draft, int, list[int]] | None = None  # the round in flight: chain length, draft,
        # context length, and the n-gram continuation it did not draft
        self.target_forward = getattr(model, "target_forward", None)
        self.verify_costs = StepCosts()  # rounds without a chain: seconds by width
        self.chain_rounds: deque = deque(maxlen=CHAIN_ROUNDS_KEPT)  # (seconds, width, chain)
        self.chained_in_a_row = 0
        self.unchained_in_a_row = 0

    def start(self, ctx: ProposerContext) -> None:
        self.model.start(ctx)
        self.ngram.start(ctx)
        self.last = None

    def propose(self, ctx: ProposerContext, k: int) -> Draft:
        found = self.ngram.index.propose(self.chooser.max_drafts)
        m, chain = self.chooser.plan(len(found), k)
        if MEASURED and chain and (not self.verify_costs.seconds or self.chained_in_a_row >= PROBE_AFTER):
            m, chain = 0, 0  # a plain round: the verify's cost alone (see the module docstring)
        elif MEASURED and k and not chain and self.unchained_in_a_row >= CHAIN_PROBE_AFTER:
            m, chain = 0, 1  # one draft: what drafting costs now
        self.chained_in_a_row = self.chained_in_a_row + 1 if chain else 0
        self.unchained_in_a_row = 0 if chain else self.unchained_in_a_row + 1
        if chain:
            draft = self.model.propose(ctx, chain)
            chain = draft.size
            draft = self._with_tail(draft)
        else:  # the n-gram continuation, or no drafts (the loop verifies what it gets)
            draft = Draft(mx.array(found[:m], dtype=mx.uint32))
        draft.source = self.chooser.source(chain, draft.size)
        self.last = (chain, draft, len(ctx.tokens), [] if m else found)
        return draft

    def _with_tail(self, draft: Draft) -> Draft:
        """The chain, and after it the n-gram tokens that continue it if they pay."""
        room = self.chooser.max_drafts - draft.size
        found = self.ngram.index.propose(room, after=draft.tokens.tolist()) if room > 0 else []
        m = self.chooser.tail(draft.size, len(found))
        if not m:
            return draft
        tail = mx.array(found[:m], dtype=mx.uint32)
        q = draft.q
        if q is not None:  # point masses: one-hot rows beside the drafter's distributions
            q = mx.concatenate([q, (mx.arange(q.shape[-1])[None] == tail[:, None]).astype(q.dtype)])
        return Draft(mx.concatenate([draft.tokens, tail]), q, overlapped=draft.overlapped)

    def anticipate(self, ctx: ProposerContext, verdict: LazyVerdict) -> None:
        if self.last is not None and self.last[0]:  # after a chain round: the next likely chains too
            self.model.anticipate(ctx, verdict)

    def observe(self, seconds: float) -> None:
        """The round in flight took `seconds`, settle to settle (the loop's own measure): price
        the verify by width and a chain token's drafting from it (see the module docstring)."""
        if self.last is None or not MEASURED:
            return
        chain, draft = self.last[0], self.last[1]
        if chain:
            self.chain_rounds.append((seconds, 1 + draft.size, chain))
        else:
            self.verify_costs.observe(1 + draft.size, seconds)
        if self.verify_costs.seconds and self.chain_rounds:
            model_s = statistics.median((s - self.verify_costs.at(w)) / c for s, w, c in self.chain_rounds)
            self.chooser.measured(self.verify_costs, max(model_s, 0.0))

    def commit(self, ctx: ProposerContext) -> None:
        if self.last is not None:
            chain, draft, before, undrafted = self.last
            if undrafted:
                self.chooser.shadow(undrafted, ctx.tokens[before:])
            if draft.size:  # accepted: the drafts the emitted tokens begin with (at T>0 a
                # resampled token may equal the next draft: one more counted, statistics only)
                drafted, emitted = draft.tokens.tolist(), ctx.tokens[before:]
                accepted = next((i for i, (d, e) in enumerate(zip(drafted, emitted)) if d != e),
                                min(len(drafted), len(emitted)))
                self.chooser.record(chain, len(drafted), accepted)
            self.last = None
        self.model.commit(ctx)
        self.ngram.commit(ctx)
