"""The law of one speculative round, enumerated exactly over a tiny vocabulary, equals the
target's -- for point-mass drafts (n-gram, greedy draft model) and sampled drafts (draft
model, MTP at T>0), 1, 3 and 5 drafts per round -- and each deliberately broken verifier
(tests/engines/broken_verifiers.py) changes it.

Everything random in a round is enumerated: the drafts (each sequence with its probability
under q), the accept test (lossless_accept over a grid of M uniforms), the first rejection
(accept tests are independent), and the emitted token (the residual or bonus distribution
verify_law returns). The round's output, continued by the target, must give the target's law
of the first k+1 tokens. Only verify_law, lossless_accept and verify_sampled -- what the round
loop runs -- decide it."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

from engines.mlx_chat import sampling as mxs
from engines.speculative import verify
from tests.engines.broken_verifiers import BROKEN, detectable

V = 3  # tokens
M = 4096  # uniforms for the accept test: its probability exact to 1/M
TOL = 2.0 / M


def distribution(prefix: tuple[int, ...], seed: int, sharp: float) -> np.ndarray:
    rng = np.random.default_rng([seed, len(prefix), *prefix])
    x = sharp * rng.normal(size=V)
    return np.exp(x) / np.exp(x).sum()


def target(prefix):
    return distribution(prefix, 0, 1.5)


def drafter(prefix):
    """Close to the target (accepted often), not equal (rejected sometimes)."""
    mix = 0.6 * target(prefix) + 0.4 * distribution(prefix, 1, 2.0)
    return mix / mix.sum()


def push_forward(mass: dict[tuple, float], length: int) -> dict[tuple, float]:
    """Continue every sequence shorter than `length` by the target's own sampling."""
    out: dict[tuple, float] = {}
    todo = dict(mass)
    while todo:
        seq, m = todo.popitem()
        if len(seq) >= length:
            out[seq[:length]] = out.get(seq[:length], 0.0) + m
            continue
        for t, pt in enumerate(target(seq)):
            todo[seq + (t,)] = todo.get(seq + (t,), 0.0) + m * pt
    return out


def round_law(drafts: tuple[int, ...], q: np.ndarray | None) -> dict[tuple, float]:
    """The exact law of one round's emitted tokens for these drafts."""
    k = len(drafts)
    p = np.stack([target(drafts[:i]) for i in range(k + 1)])
    law = mxs.verify_law(mx.array(p, mx.float32), None if q is None else mx.array(q, mx.float32),
                         mx.array(drafts, dtype=mx.uint32))
    u = (mx.arange(M, dtype=mx.float32)[:, None] + 0.5) / M
    accept = np.array(mxs.lossless_accept(law.p_draft[None], law.q_draft[None], u)).mean(axis=0)
    residual, bonus = np.array(law.residual), np.array(law.bonus)
    out: dict[tuple, float] = {}
    reach = 1.0  # probability that the first n drafts were accepted
    for n in range(k + 1):
        emit_law = bonus if n == k else residual[n]
        stop_here = reach if n == k else reach * (1 - accept[n])
        for t in range(V):
            flags = [True] * n + [False] * (k - n)
            v = verify.verify_sampled(list(drafts), flags, [t] * k, t)
            assert len(v.tokens) == v.accepted + 1 and v.accepted == n  # drafts + one target token
            out[tuple(v.tokens)] = out.get(tuple(v.tokens), 0.0) + stop_here * emit_law[t]
        if n < k:
            reach *= accept[n]
    return out


def speculative_law(k: int, point_mass: bool) -> dict[tuple, float]:
    length = k + 1
    if point_mass:  # a fixed guess (n-gram / greedy draft): the drafter's argmax chain
        drafts: tuple[int, ...] = ()
        for _ in range(k):
            drafts += (int(np.argmax(drafter(drafts))),)
        return push_forward(round_law(drafts, None), length)
    mass: dict[tuple, float] = {}
    for drafts in itertools.product(range(V), repeat=k):
        q = np.stack([drafter(drafts[:i]) for i in range(k)])
        weight = float(np.prod([q[i, x] for i, x in enumerate(drafts)]))
        for seq, m in round_law(drafts, q).items():
            mass[seq] = mass.get(seq, 0.0) + weight * m
    return push_forward(mass, length)


def max_difference(k: int, point_mass: bool) -> float:
    got = speculative_law(k, point_mass)
    want = push_forward({(): 1.0}, k + 1)
    return max(abs(got.get(s, 0.0) - want[s]) for s in want)


CASES = [(k, pm) for k in (1, 3, 5) for pm in (True, False)]


@pytest.mark.parametrize("k,point_mass", CASES, ids=lambda v: str(v))
def test_one_round_keeps_the_target_law(k, point_mass):
    assert max_difference(k, point_mass) < TOL


# skip_bonus keeps the law of the tokens (the target continues where the round stopped) but
# breaks the contract, which round_law asserts; the loop tests show what it does to the law.
BROKEN_CASES = [(v, k, pm) for v in BROKEN for k, pm in CASES if v == "skip_bonus" or detectable(v, k, pm)]


@pytest.mark.parametrize("variant,k,point_mass", BROKEN_CASES, ids=lambda v: str(v))
def test_a_broken_verifier_changes_the_law(variant, k, point_mass, monkeypatch):
    """Must fail: each variant changes the law by far more than the tolerance (0.014 to 0.55
    against 5e-4 here) or breaks the round's contract (accepted drafts + one target token)."""
    BROKEN[variant](monkeypatch)
    with pytest.raises(AssertionError):
        assert max_difference(k, point_mass) < TOL
