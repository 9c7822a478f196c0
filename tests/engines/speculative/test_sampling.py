"""The reference maths of lossless speculative sampling.

The statistical tests compare the distribution of whole generated sequences from a small
Markov "target" decoded (a) plainly and (b) speculatively, with a chi-square test. The same
test must reject a lossy scheme (threshold acceptance), or it would prove nothing.
"""

from collections import Counter
from itertools import product

import numpy as np
import pytest

from engines.speculative.sampling import rejection_verify, residual_distribution, target_probs
from engines.speculative.verify import Verdict
from tests.stats import chi_square_pvalue, two_sample_pvalue

V = 4
LENGTH = 3


def test_target_probs_temperature_top_k_top_p():
    logits = np.array([2.0, 1.0, 0.5, -1.0])
    p = target_probs(logits, temperature=1.0)
    assert np.allclose(p, np.exp(logits) / np.exp(logits).sum())
    assert np.count_nonzero(target_probs(logits, 1.0, top_k=2)) == 2
    cold = target_probs(logits, 0.1)
    assert cold.argmax() == 0 and cold[0] > 0.99
    # top-p keeps the smallest prefix whose mass reaches p (the crossing token included)
    p_full = target_probs(logits, 1.0)
    kept = target_probs(logits, 1.0, top_p=p_full[0] + 1e-9)
    assert np.count_nonzero(kept) == 2
    assert np.count_nonzero(target_probs(logits, 1.0, top_p=0.01)) == 1
    assert np.allclose(kept.sum(), 1.0)


def test_residual_of_point_mass_is_p_without_the_draft():
    p = np.array([0.5, 0.3, 0.2])
    r = residual_distribution(p, None, 0)
    assert np.allclose(r, [0, 0.6, 0.4])
    assert np.allclose(residual_distribution(p, np.array([1.0, 0, 0]), 0), r)


# A tiny target: next-token logits depend on the previous token (a Markov chain).
TARGET_LOGITS = np.random.default_rng(1).normal(size=(V, V)) * 1.5
DRAFT_LOGITS = TARGET_LOGITS + np.random.default_rng(2).normal(size=(V, V))  # similar, not equal


# Each row's distribution, computed once: the samplers below look them up tens of thousands of
# times, and the same values reach the sampler and the verifier as computing them afresh gives
# (read-only, so that nothing can change them under a later draw)
TARGET_P = np.stack([target_probs(row, 1.0) for row in TARGET_LOGITS])
DRAFT_Q = np.stack([target_probs(row, 1.0) for row in DRAFT_LOGITS])
TARGET_P.flags.writeable = DRAFT_Q.flags.writeable = False


def target_p(prev):
    return TARGET_P[prev]


def draft_q(prev):
    return DRAFT_Q[prev]


def plain_sample(rng, first):
    seq, prev = [], first
    for _ in range(LENGTH):
        prev = int(rng.choice(V, p=target_p(prev)))
        seq.append(prev)
    return tuple(seq)


def speculative_sample(rng, first, k, point_mass, verify=rejection_verify):
    seq, prev = [], first
    while len(seq) < LENGTH:
        drafts, qs, ctx = [], [], prev
        for _ in range(k):
            q = draft_q(ctx)
            x = int(np.argmax(q)) if point_mass else int(rng.choice(V, p=q))
            drafts.append(x)
            qs.append(q)
            ctx = x
        ctxs = [prev] + drafts
        p = np.stack([target_p(c) for c in ctxs])
        verdict = verify(p, None if point_mass else np.stack(qs), drafts, rng)
        seq.extend(verdict.tokens)
        prev = seq[-1]
    return tuple(seq[:LENGTH])


def threshold_verify(p, q, drafts, rng):
    """A lossy scheme: accept a draft whenever the target gives it >= 20% probability."""
    for i, x in enumerate(drafts):
        if p[i, x] >= 0.2:
            continue
        return Verdict(i, list(drafts[:i]) + [int(rng.choice(p.shape[-1], p=p[i]))])
    return Verdict(len(drafts), list(drafts) + [int(rng.choice(p.shape[-1], p=p[len(drafts)]))])


def exact_sequence_probs(first):
    probs = {}
    for seq in product(range(V), repeat=LENGTH):
        pr, prev = 1.0, first
        for t in seq:
            pr *= target_p(prev)[t]
            prev = t
        probs[seq] = pr
    return probs


N = 20_000


@pytest.mark.parametrize("point_mass", [True, False], ids=["point-mass", "full-q"])
def test_rejection_sampling_is_lossless(point_mass):
    rng = np.random.default_rng(0)
    counts = Counter(speculative_sample(rng, 0, k=2, point_mass=point_mass) for _ in range(N))
    assert chi_square_pvalue(counts, exact_sequence_probs(0), N) > 1e-3


def test_plain_sampler_passes_the_same_test():
    rng = np.random.default_rng(0)
    counts = Counter(plain_sample(rng, 0) for _ in range(N))
    assert chi_square_pvalue(counts, exact_sequence_probs(0), N) > 1e-3


def test_the_test_rejects_a_lossy_scheme():
    rng = np.random.default_rng(0)
    counts = Counter(
        speculative_sample(rng, 0, k=2, point_mass=True, verify=threshold_verify) for _ in range(N)
    )
    assert chi_square_pvalue(counts, exact_sequence_probs(0), N) < 1e-6


def test_two_sample_test_separates_lossless_from_lossy():
    rng = np.random.default_rng(3)
    plain = Counter(plain_sample(rng, 0) for _ in range(N))
    spec = Counter(speculative_sample(rng, 0, k=3, point_mass=False) for _ in range(N))
    lossy = Counter(speculative_sample(rng, 0, k=3, point_mass=True, verify=threshold_verify) for _ in range(N))
    assert two_sample_pvalue(plain, spec) > 1e-3
    assert two_sample_pvalue(plain, lossy) < 1e-6
