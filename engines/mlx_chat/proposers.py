"""Proposers: who drafts the tokens the target verifies.

The protocol (what the round loop in engine.py calls, in order):

    start(ctx)          once, after prefill. ctx.tokens = prompt + first token.
    propose(ctx, k)     -> Draft: up to k token ids (an mx.array, may stay lazy) and, when the
                        drafts were sampled, the drafter's distributions q [k, V] for rejection
                        sampling (None = a point-mass proposal: n-gram, greedy drafting).
                        Returning fewer than k (or none) is fine: the round verifies what it got.
    anticipate(ctx, v)  only if `drafts_ahead`: right after a round's verify forward is
                        launched, before the host has read its verdict. v (LazyVerdict) holds
                        that verdict as lazy arrays, so the proposer can put the next round's
                        draft into the graph behind the verify (depth-2 overlap) and hand it
                        to the next propose() unevaluated.
    commit(ctx)         after every round (plain rounds too), once the target's cache has been
                        rolled back: ctx.tokens holds every accepted token, the last of which
                        is not yet in the target's cache; ctx.hidden is the target's final
                        hidden state at the position that produced it (if needs_hidden).

A drafter may read the target's cache (MTP) while the loop writes and rolls it back: an MLX
cache write computes a new version of the buffer -- `keys[...] = x` repoints the Python array
at it -- while a graph built earlier keeps the version it read, so no drafter ever has to
finish its reads before the loop changes the cache.

`drafts_ahead = True` asks the loop to call anticipate (MTP with overlap on).
`needs_hidden = True` asks the loop to run the target through the proposer's
`target_forward(inputs, cache) -> (logits, hidden)`, so ctx.hidden is set (Gemma 4 MTP reads it, with ctx.target_cache for the K/V of the last full and sliding
layers, ctx.position for RoPE). The context object is `ProposerContext` below.

Every proposer only proposes (vLLM v1's split): the verifier in the round loop decides, and
the caches are rolled back by the loop (the target's) and by the proposer itself (its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import mlx.core as mx

from engines.types import Sampling
from engines.mlx_chat.cache import make_rollback_cache, rollback
from engines.mlx_chat.sampling import target_probs
from engines.speculative.ngram import NGramProposer as NGramIndex


@dataclass
class ProposerContext:
    tokens: list[int]  # prompt + accepted tokens; tokens[-1] is not yet in the target's cache
    sampling: Sampling
    target_model: Any
    target_cache: list[Any]
    hidden: mx.array | None = None  # [hidden_size], see module docstring

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


@dataclass
class Draft:
    tokens: mx.array  # [k] int
    q: mx.array | None = None  # [k, V] drafter probabilities, or None (point mass)
    overlapped: bool = False  # drafted ahead in the graph: the loop feeds it on without waiting
    source: str | None = None  # composed drafting: which drafter made it

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


EMPTY = Draft(mx.array([], dtype=mx.uint32))


class Proposer(Protocol):
    name: str
    needs_hidden: bool
    drafts_ahead: bool

    def start(self, ctx: ProposerContext) -> None: ...

    def propose(self, ctx: ProposerContext, k: int) -> Draft: ...

    def anticipate(self, ctx: ProposerContext, verdict: LazyVerdict) -> None: ...

    def commit(self, ctx: ProposerContext) -> None: ...


@dataclass
class NGramProposer:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the context's
    longest recurring suffix. Drafts are a point mass (q = None)."""

    n_min: int = 1
    n_max: int = 4
    name: str = "ngram"
    needs_hidden: bool = False
    drafts_ahead: bool = False  # the lookup needs the accepted tokens themselves
    index: NGramIndex = field(init=False)
    auto: Any = None  # --steps auto's AutoSteps: told each round's whole continuation (tuning.py)

    def __post_init__(self):
        self.index = NGramIndex(self.n_min, self.n_max)

    def start(self, ctx: ProposerContext) -> None:
        self.index.reset(ctx.tokens)
        if self.auto is not None:  # the first round's position: auto replays every fixed k from here
            self.auto.passed(self.index.propose(self.auto.max_steps), len(ctx.tokens))

    def propose(self, ctx: ProposerContext, k: int) -> Draft:
        if self.auto is not None:  # the k drafts are the first k of the continuation
            found = self.index.propose(self.auto.max_steps)
            self.auto.continuation(found, len(ctx.tokens))
            drafts = found[:k]
        else:
            drafts = self.index.propose(k)
        return Draft(mx.array(drafts, dtype=mx.uint32)) if drafts else EMPTY

    def commit(self, ctx: ProposerContext) -> None:
        new = ctx.tokens[len(self.index.tokens):]  # only accepted tokens enter
        if self.auto is None:
            self.index.extend(new)
            return
        for token in new:  # auto replays every fixed k: it needs the lookup at every position
            self.index.extend([token])
            self.auto.passed(self.index.propose(self.auto.max_steps), len(self.index.tokens))
        self.auto.score(ctx.tokens)


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
