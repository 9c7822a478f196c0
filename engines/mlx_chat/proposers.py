"""What the MLX drafters share (the proposer protocol: engines/speculative/proposer.py): a
launched step's verdict still in the graph, a draft's ids as an array, composed drafting's
n-gram tail after a model's chain.

A drafter may read the target's cache (MTP) while the loop writes it: an MLX cache write
computes a new version of the buffer -- `keys[...] = x` repoints the Python array at it --
while a graph built earlier keeps the version it read, so no drafter ever has to finish its
reads before the loop changes the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from engines.speculative.proposer import Draft


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
