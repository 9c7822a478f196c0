"""Batch independence at T>0: in one batched step every row draws on its own RNG key, so each
row's emitted tokens follow exactly the single-sequence law of one round (enumerated over a
3-token vocabulary by tests/engines/mlx_chat/test_verification_law.py's round_law) and the
rows are independent of each other -- two and three rows with different k, point-mass and
sampled drafts. Tested on the batch loop's own per-row functions (verify_rows, settle_row) over
N steps with fresh keys; the must-fail variants -- one RNG for all rows, one accept length for
all rows -- are each caught. (The third, a row's rollback applied to its neighbour, changes
the cache, not one step's draws: test_batch_equals_lone.py catches it.)"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from engines.types import Sampling
from engines.batch.engine import settle_row, verify_rows
from engines.batch.engine import Step
from engines.speculative.proposer import Draft
from engines.speculative.verify import Verdict
from tests.engines.mlx_chat.test_verification_law import drafter, round_law, target
from tests.stats import chi_square_pvalue

N = 3000
ALPHA = 1e-4  # a correct batch passes with probability 1 - ALPHA per check
SAMPLING = Sampling(temperature=1.0)

# (drafts, sampled?) per row: k = 1 point mass, k = 3 sampled from the drafter, k = 0 plain
ROWS = [((1,), False), ((0, 2, 1), True), ((), False)]


def row_logits(drafts: tuple[int, ...], width: int) -> np.ndarray:
    """log p of the target after each prefix of the drafts, padded to the batch's width."""
    rows = [np.log(target(drafts[:i])) for i in range(len(drafts) + 1)]
    return np.stack(rows + [rows[-1]] * (width - len(rows)))


def plan(drafts: tuple[int, ...], sampled: bool) -> Step:
    q = mx.array(np.stack([drafter(drafts[:i]) for i in range(len(drafts))]), mx.float32) if sampled else None
    draft = Draft(mx.array(drafts, dtype=mx.uint32), q)
    return Step(len(drafts), draft)


def exact_law(drafts: tuple[int, ...], sampled: bool) -> dict[tuple, float]:
    if not drafts:
        return {(t,): float(p) for t, p in enumerate(target(()))}
    q = np.stack([drafter(drafts[:i]) for i in range(len(drafts))]) if sampled else None
    return round_law(drafts, q)


def batched_steps(rows, n: int, one_key: bool = False, one_length: bool = False) -> list[tuple]:
    """n batched steps; each returns every row's emitted tokens."""
    width = 1 + max(len(d) for d, _ in rows)
    logits = mx.array(np.stack([row_logits(d, width) for d, _ in rows]), mx.float32)
    out = []
    for trial in range(n):
        plans = [plan(d, s) for d, s in rows]
        keys = [mx.random.key(trial * 7919 + b) for b in range(len(rows))]
        if one_key:
            keys = [keys[0]] * len(rows)
        mx.eval(verify_rows(logits, plans, [SAMPLING] * len(plans), keys))
        verdicts = [settle_row(p) for p in plans]
        if one_length:  # every row keeps the shortest accepted prefix, plus its next token
            a = min(v.accepted for v, (d, _) in zip(verdicts, rows) if d)
            verdicts = [Verdict(min(v.accepted, a), v.tokens[: min(v.accepted, a)] + [v.tokens[min(v.accepted, a)]])
                        for v in verdicts]
        out.append(tuple(tuple(v.tokens) for v in verdicts))
    return out


def pvalue(counts: Counter, law: dict, n: int) -> float:
    """Chi-square p-value; 0 when an outcome the law cannot produce was seen."""
    if any(law.get(x, 0.0) == 0.0 for x in counts):
        return 0.0
    return chi_square_pvalue(counts, law, n)


def pvalues(rows, samples) -> tuple[list[float], float]:
    """Each row's marginal against its exact law, and the joint of the first two rows against
    the product of their laws (independence)."""
    laws = [exact_law(d, s) for d, s in rows]
    marginal = [pvalue(Counter(x[b] for x in samples), laws[b], len(samples)) for b in range(len(rows))]
    product = {(a, b): pa * pb for a, pa in laws[0].items() for b, pb in laws[1].items()}
    joint = pvalue(Counter((x[0], x[1]) for x in samples), product, len(samples))
    return marginal, joint


@pytest.mark.parametrize("n_rows", [2, 3])
def test_each_row_keeps_its_own_law_and_rows_are_independent(n_rows):
    rows = ROWS[:n_rows]
    marginal, joint = pvalues(rows, batched_steps(rows, N))
    assert min(marginal) > ALPHA and joint > ALPHA, (marginal, joint)


def test_one_rng_for_all_rows_is_caught():
    rows = [((1,), False), ((1,), False)]  # two rows alike: a shared key makes them equal
    marginal, joint = pvalues(rows, batched_steps(rows, N, one_key=True))
    assert joint < ALPHA, joint


def test_one_accept_length_for_all_rows_is_caught():
    marginal, joint = pvalues(ROWS[:2], batched_steps(ROWS[:2], N, one_length=True))
    assert min(marginal) < ALPHA, marginal
