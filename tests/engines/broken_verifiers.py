"""Deliberately broken verification, injected into the pure functions the round loop calls
(pytest's monkeypatch; no model is replaced). The T>0 tests run each of these and must fail
on every one, which is what shows they can tell a lossless verifier from a lossy one."""

from __future__ import annotations

import mlx.core as mx

from engines.batch import engine as batch_engine
from engines.mlx_chat import sampling as mxs
from engines.speculative import verify
from engines.speculative.verify import Verdict


def resample_from_p(monkeypatch):
    """At a rejection, resample from p instead of normalise(max(0, p - q))."""
    monkeypatch.setattr(mxs, "residual_probs", lambda p, q, drafts: p)


def accept_with_q_over_p(monkeypatch):
    """Accept with min(1, q/p) instead of min(1, p/q)."""
    monkeypatch.setattr(mxs, "lossless_accept", lambda p_draft, q_draft, u: u * p_draft < q_draft)


def skip_bonus(monkeypatch):
    """When every draft is accepted, emit the drafts without the target's own token."""
    real = verify.verify_sampled

    def broken(drafts, accept, residual, bonus):
        v = real(drafts, accept, residual, bonus)
        return Verdict(v.accepted, v.tokens[:-1]) if v.accepted == len(drafts) > 0 else v

    monkeypatch.setattr(verify, "verify_sampled", broken)
    monkeypatch.setattr(batch_engine, "verify_sampled", broken)  # (the loop's own reference)


def draft_q_of_next_position(monkeypatch):
    """Verify draft i against the drafter's distribution at position i + 1 (off by one)."""
    real = mxs.verify_law

    def broken(p, q, drafts):
        if q is not None and q.shape[0] > 1:
            q = mx.concatenate([q[1:], q[-1:]])
        return real(p, q, drafts)

    monkeypatch.setattr(mxs, "verify_law", broken)


BROKEN = {
    "resample_from_p": resample_from_p,
    "accept_q_over_p": accept_with_q_over_p,
    "skip_bonus": skip_bonus,
    "draft_q_of_next_position": draft_q_of_next_position,
}


def detectable(variant: str, steps: int, point_mass: bool, counted_tokens: int = 3) -> bool:
    """Whether a variant changes the law a test measures at all:
    - skip_bonus breaks the round's contract (accepted drafts + one target token), which the
      tests assert; the law changes only for tokens after a fully accepted round (the loop
      feeds the last draft twice), which the first `counted_tokens` include when
      steps + 2 <= counted_tokens, i.e. steps = 1 for the first three tokens;
    - draft_q_of_next_position needs a drafter distribution (not a point mass) and >= 2 drafts."""
    if variant == "skip_bonus":
        return steps + 2 <= counted_tokens
    if variant == "draft_q_of_next_position":
        return not point_mass and steps >= 2
    return True
