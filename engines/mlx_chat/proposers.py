"""The chat engine's proposers (the protocol: engines/speculative/proposer.py) and what the
chat loop adds to it:

    anticipate(ctx, v)  only if `drafts_ahead`: right after a round's verify forward is
                        launched, before the host has read its verdict. v (LazyVerdict) holds
                        that verdict as lazy arrays, so the proposer can put the next round's
                        draft into the graph behind the verify (depth-2 overlap) and hand it
                        to the next propose() unevaluated.
    needs_hidden        the loop runs the target through the proposer's
                        `target_forward(inputs, cache) -> (logits, hidden)`, so ctx.hidden is
                        set (Gemma 4 MTP reads it, with ctx.target_cache for the K/V of the last
                        full and sliding layers, ctx.position for RoPE).

A drafter may read the target's cache (MTP) while the loop writes and rolls it back: an MLX
cache write computes a new version of the buffer -- `keys[...] = x` repoints the Python array
at it -- while a graph built earlier keeps the version it read, so no drafter ever has to
finish its reads before the loop changes the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx

from engines.mlx_chat.cache import make_rollback_cache, rollback
from engines.mlx_chat.sampling import target_probs
from engines.types import Sampling
from engines.speculative.proposer import Draft
from engines.speculative.proposer import Proposer as BaseProposer


@dataclass
class ProposerContext:
    """A chat sequence's Context (engines/speculative/proposer.py) with the target's model and
    cache beside the tokens (an MTP drafter reads the target's K/V), and the depth-2 overlap's
    bookkeeping."""

    tokens: list[int]  # prompt + emitted tokens; tokens[-1] is not yet in the target's cache
    sampling: Sampling
    target_model: Any
    target_cache: list[Any]
    hidden: mx.array | None = None  # [hidden_size] the target's final hidden state that produced tokens[-1]
    drafted_last: int = 0  # drafts asked of the last round that drafted (an anticipated chain's length)
    ahead: int = 0  # drafts the proposer anticipated for the next round (depth-2 overlap), 0 if none

    @property
    def position(self) -> int:
        """Position of tokens[-1] (the next token the target will read)."""
        return len(self.tokens) - 1


@dataclass
class LazyVerdict:
    """A launched round's verdict, still in the graph (sampling.verdict_in_graph)."""

    position: int | mx.array  # of the round's first input: ctx.position when it was launched, or
    # (launched before the last round's verdict was read) that verdict's next_position
    drafts: mx.array  # [k] the round's drafts
    accepted: mx.array  # [] int32: how many of them the target accepts
    token: mx.array  # [1] uint32: the target's token after them (the next round's last token)
    hidden: mx.array | None  # [D] the target's final hidden state that produced `token`

    @property
    def next_position(self) -> mx.array:
        """Position of `token`: the next round's ctx.position."""
        return self.position + 1 + self.accepted


def mx_tokens(draft: Draft) -> mx.array:
    """The draft's ids as an mx.array (n-gram lookup drafts a list; model drafters an array, maybe lazy)."""
    return draft.tokens if isinstance(draft.tokens, mx.array) else mx.array(draft.tokens, dtype=mx.uint32)


def extend_draft(draft: Draft, tail: list[int]) -> Draft:
    """A model drafter's chain (an mx.array, maybe lazy), then composed drafting's n-gram tail
    after it: point masses, whose rows of q are one-hot beside the drafter's distributions
    (rejection sampling reads them as "accept with p(x), else resample from p without x")."""
    ids = mx.array(tail, dtype=mx.uint32)
    q = draft.q
    if q is not None:
        q = mx.concatenate([q, (mx.arange(q.shape[-1])[None] == ids[:, None]).astype(q.dtype)])
    return Draft(mx.concatenate([mx_tokens(draft), ids]), q, overlapped=draft.overlapped)


class Proposer(BaseProposer, Protocol):
    def anticipate(self, ctx: ProposerContext, verdict: LazyVerdict) -> None: ...


class DraftModelProposer:
    """A smaller model with the same tokenizer drafts k tokens autoregressively: argmax at
    T=0 (a point mass), a sample of its own target_probs at T>0 (q returned for rejection
    sampling). Its cache rolls back exactly like the target's.

    The whole draft chain stays lazy: draft i+1 reads draft i as an mx.array, so k draft
    steps are one graph and the host waits once."""

    name = "draft"
    needs_hidden = False
    drafts_ahead = False  # its cache offsets are host ints: it drafts once the verdict is read

    def __init__(self, model: Any):
        self.model = model
        self.cache: list[Any] = []
        self.cached = 0  # how many of ctx.tokens the draft cache holds

    def start(self, ctx: ProposerContext) -> None:
        self.cache = make_rollback_cache(self.model)
        self.cached = 0

    def propose(self, ctx: ProposerContext, k: int) -> Draft:
        # Feed what the cache lacks (the last token, plus the last draft when all were accepted
        # or tokens decoded in plain rounds), then draft k tokens.
        pending = mx.array(ctx.tokens[self.cached:], dtype=mx.uint32)
        logits = self.model(pending[None], cache=self.cache)[0, -1]
        self.cached = len(ctx.tokens)
        tokens, qs = [], []
        for i in range(k):
            if ctx.sampling.greedy:
                y = mx.argmax(logits, axis=-1)
            else:
                q = target_probs(logits, ctx.sampling)
                y = mx.random.categorical(mx.log(q))
                qs.append(q)
            tokens.append(y)
            if i < k - 1:  # the last draft is fed next round, only if it is accepted
                logits = self.model(y.reshape(1, 1), cache=self.cache)[0, -1]
                self.cached += 1
        return Draft(mx.stack(tokens).astype(mx.uint32), mx.stack(qs) if qs else None)

    def commit(self, ctx: ProposerContext) -> None:
        # Keep exactly the accepted prefix: the cache may hold rejected drafts past it.
        committed = len(ctx.tokens) - 1  # tokens[-1] is fed next round
        if self.cached > committed:
            rollback(self.cache, self.cached - committed)
            self.cached = committed
