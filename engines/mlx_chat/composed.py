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

Drafting cost is not priced here (OCR's ComposedDrafter times its MTP chains; here a chain
is drafted lazily, behind the previous verify with depth-2 overlap, and --steps auto's
latency is a round's cost net of drafting). What that costs where drafting is dear: with
overlap the next chain is anticipated behind every verify, the rounds that then draft from
n-gram included, and on a CPU the tiny Gemma 4 pair's assistant costs more than it brings
(bench/composed.py: composed gives the most tokens per forward there, not the most tok/s).
At T>0 a tail's tokens are point masses beside the chain's sampled drafts: their rows of q
are one-hot, which rejection sampling reads as "accept with p(x), resample from p without x".
The choice depends only on the context and on past rounds, never on this round's draws:
lossless like either source alone.
"""

from __future__ import annotations

import mlx.core as mx

from engines.mlx_chat.proposers import Draft, LazyVerdict, NGramProposer, ProposerContext
from engines.speculative.composed import Chooser


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

    def start(self, ctx: ProposerContext) -> None:
        self.model.start(ctx)
        self.ngram.start(ctx)
        self.last = None

    def propose(self, ctx: ProposerContext, k: int) -> Draft:
        found = self.ngram.index.propose(self.chooser.max_drafts)
        m, chain = self.chooser.plan(len(found), k)
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
        self.model.anticipate(ctx, verdict)  # the chain for the next round, should it be chosen

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
