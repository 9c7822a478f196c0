"""Composed drafting: n-gram lookup beside a model drafter (the Gemma 4 assistant, a drafter
trained here, a draft model) in one run. Each round drafts from whichever the cost model
expects to pay more (engines/speculative/tuning.py's throughput model):

    n-gram   its continuation of the longest recurring suffix (m tokens, known before choosing:
             the lookup costs microseconds): E[tokens | m] with n-gram's acceptance by position
    model    a chain of k: E[tokens | k] with the model drafter's acceptance by position

each over latency(1 + width) of the verify -- the run's measured latency when `--steps auto`
knows it, else a flat one (verifying is nearly free: a GPU's case). So the n-gram continuation
wins when its match is long and the output has been copying (its acceptance high), the chain
otherwise. Each source's acceptance is counted from the rounds it drafted. The choice depends
only on the context and on past rounds, never on this round's draws: lossless like either.

Not done: the third form the tuning issue names -- the n-gram tokens appended after the chain.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from engines.mlx_chat.proposers import Draft, LazyVerdict, NGramProposer, ProposerContext
from engines.speculative.schedule import MAX_STEPS
from engines.speculative.tuning import PositionAcceptance, expected_tokens


class ComposedProposer:
    def __init__(self, model, ngram: NGramProposer, latency: Callable[[int], float] | None = None):
        self.model = model  # MTPProposer or DraftModelProposer
        self.ngram = ngram
        self.name = f"{model.name}+ngram"
        self.needs_hidden = model.needs_hidden
        self.drafts_ahead = model.drafts_ahead
        self.latency = latency or (lambda width: 1.0)
        self.seen = {"ngram": PositionAcceptance(MAX_STEPS), model.name: PositionAcceptance(MAX_STEPS)}
        self.last: tuple[str, Draft, int] | None = None  # the round in flight: source, draft, context length
        self.target_forward = getattr(model, "target_forward", None)

    def start(self, ctx: ProposerContext) -> None:
        self.model.start(ctx)
        self.ngram.start(ctx)
        self.last = None

    def propose(self, ctx: ProposerContext, k: int) -> Draft:
        found = self.ngram.index.propose(k)
        source = self.choose(len(found), k)
        if source == "ngram":
            draft = Draft(mx.array(found, dtype=mx.uint32), source="ngram")
        else:
            draft = self.model.propose(ctx, k)
            draft.source = self.model.name
        self.last = (source, draft, len(ctx.tokens))
        return draft

    def choose(self, found: int, k: int) -> str:
        """The source whose draft is expected to give more tokens per second this round."""
        if not found:
            return self.model.name
        ngram = expected_tokens(self.seen["ngram"].estimate(), found) / self.latency(1 + found)
        model = expected_tokens(self.seen[self.model.name].estimate(), k) / self.latency(1 + k)
        return "ngram" if ngram >= model else self.model.name

    def anticipate(self, ctx: ProposerContext, verdict: LazyVerdict) -> None:
        self.model.anticipate(ctx, verdict)  # the chain for the next round, should it be chosen

    def commit(self, ctx: ProposerContext) -> None:
        if self.last is not None:
            source, draft, before = self.last
            if draft.size:  # accepted: the drafts the emitted tokens begin with (at T>0 a
                # resampled token may equal the next draft: one more counted, statistics only)
                drafted, emitted = draft.tokens.tolist(), ctx.tokens[before:]
                accepted = next((i for i, (d, e) in enumerate(zip(drafted, emitted)) if d != e),
                                min(len(drafted), len(emitted)))
                self.seen[source].record(len(drafted), accepted)
            self.last = None
        self.model.commit(ctx)
        self.ngram.commit(ctx)
