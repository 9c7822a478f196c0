"""E[accepted + 1 | k]: the tokens a round of k drafts is expected to yield -- the target's
own token plus the accepted prefix, 1 + a1 + a1 a2 + ... for acceptance a_i at draft position
i. One formula for every scheduler that prices a round: --steps auto (tuning.py), composed
drafting's chooser (composed.py) and the batch's draft budget (engines/batch/controller.py)."""

from __future__ import annotations

from collections.abc import Sequence


def expected_by_count(acceptance: Sequence[float], n: int) -> list[float]:
    """E[accepted + 1 | k] for k = 0..n in one pass; positions past the list repeat its last
    value (an empty list accepts nothing)."""
    out, reach, last = [1.0], 1.0, len(acceptance) - 1
    for i in range(n):
        reach *= acceptance[min(i, last)] if acceptance else 0.0
        out.append(out[-1] + reach)
    return out


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """E[accepted + 1 | k] (see expected_by_count)."""
    return expected_by_count(acceptance, k)[k]
