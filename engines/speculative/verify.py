"""Verification: which drafts the target accepts, and the one token the target adds.

The proposer only proposes; the verifier returns the accepted prefix plus exactly one target
token (vLLM v1's split). Backends compute the per-position quantities in their own graph
(argmax at T=0; accept tests and residual samples at T>0, see `sampling.py` for the reference
maths) and hand this module a few ints, so no full-vocabulary row crosses to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass
class Verdict:
    accepted: int  # how many drafts were accepted (a prefix)
    tokens: list[int]  # the accepted drafts followed by exactly one target token


def verify_greedy(drafts: Sequence[int], target: Sequence[int]) -> Verdict:
    """T=0. target[i] is the target's argmax at the position where drafts[i] was placed, and
    target[len(drafts)] the argmax after the last draft (the bonus token)."""
    assert len(target) == len(drafts) + 1, (len(drafts), len(target))
    n = 0
    while n < len(drafts) and int(drafts[n]) == int(target[n]):
        n += 1
    return Verdict(n, [int(t) for t in drafts[:n]] + [int(target[n])])


def verify_sampled(
    drafts: Sequence[int], accept: Sequence[bool], residual: Sequence[int], bonus: int
) -> Verdict:
    """T>0. accept[i] is the outcome of u_i < p_i(x_i) / q_i(x_i); residual[i] a sample from
    normalise(max(p_i - q_i, 0)); bonus a sample from p after the last draft. The first
    rejection ends the round with that position's residual sample."""
    n = 0
    while n < len(drafts) and bool(accept[n]):
        n += 1
    last = int(residual[n]) if n < len(drafts) else int(bonus)
    return Verdict(n, [int(t) for t in drafts[:n]] + [last])


def clip_emitted(
    tokens: list[int], eos_ids: Iterable[int], remaining: int
) -> tuple[list[int], str | None]:
    """Honour EOS and max_tokens inside a burst: keep tokens up to and including the first EOS,
    and never more than `remaining`. Returns (kept, finish reason or None)."""
    eos = set(eos_ids)
    kept: list[int] = []
    for t in tokens:
        if len(kept) >= remaining:
            return kept, "length"
        kept.append(t)
        if t in eos:
            return kept, "stop"
    if len(kept) >= remaining:
        return kept, "length"
    return kept, None


def accept_flags(proposed: int, accepted: int) -> list[bool]:
    """Round.accept_flags: the verdict on each drafted position (an accepted prefix)."""
    return [True] * accepted + [False] * (proposed - accepted)
