"""Shared statistics for the lossless-sampling tests (all engines)."""

from collections import Counter

import numpy as np


def chi_square_pvalue(counts: Counter, expected: dict, n: int, min_expected: float = 5.0) -> float:
    """p-value of observed sequence counts against exact probabilities. Cells with an expected
    count below `min_expected` are pooled, so the chi-square approximation holds."""
    from scipy.stats import chisquare

    keys = sorted(expected)
    extra = sum(v for k, v in counts.items() if k not in expected)
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    exp = np.array([expected[k] * n for k in keys])
    big = exp >= min_expected
    obs = np.append(obs[big], obs[~big].sum() + extra)
    exp = np.append(exp[big], exp[~big].sum())
    keep = exp > 0
    return float(chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


def two_sample_pvalue(a: Counter, b: Counter, min_count: int = 5) -> float:
    """Chi-square test of homogeneity between two samples of sequences (e.g. plain sampling vs
    speculative sampling of the same real model, where exact probabilities are unknown)."""
    from scipy.stats import chi2_contingency

    keys = sorted(set(a) | set(b), key=lambda k: -(a.get(k, 0) + b.get(k, 0)))
    rows, rest = [], [0, 0]
    for k in keys:
        if a.get(k, 0) + b.get(k, 0) >= 2 * min_count:
            rows.append([a.get(k, 0), b.get(k, 0)])
        else:
            rest[0] += a.get(k, 0)
            rest[1] += b.get(k, 0)
    if sum(rest):
        rows.append(rest)
    return float(chi2_contingency(np.array(rows).T)[1])
