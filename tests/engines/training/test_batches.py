"""The drafter trainer's batches: drawn from groups of rows of about one length (little padding
in a batch's rectangle), every row as likely as any other, a function of (seed, step) only."""

from collections import Counter

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from engines.training.batches import batch_rows, length_groups  # noqa: E402


def test_groups_hold_every_row_once_by_length_and_a_short_tail_joins_the_group_before():
    lengths = np.random.default_rng(0).integers(40, 250, size=300)
    rows = list(range(0, 300, 2))  # 150 rows: two groups of 64, a tail of 22 (< 32) joined
    groups = length_groups(rows, lengths, size=64)
    assert [len(g) for g in groups] == [64, 86]
    assert sorted(r for g in groups for r in g) == rows
    assert max(lengths[groups[0]]) <= min(lengths[groups[1]])
    assert length_groups(rows, lengths, size=50) == [sorted(rows, key=lambda r: (lengths[r], r))[i:i + 50] for i in (0, 50, 100)]


def test_batches_come_from_one_group_every_row_equally_often_and_repeat_by_seed_and_step():
    lengths = np.random.default_rng(1).integers(40, 250, size=200)
    groups = length_groups(list(range(200)), lengths, size=128)  # 128, 72
    assert [len(g) for g in groups] == [128, 72]
    where = {r: i for i, g in enumerate(groups) for r in g}
    counts = Counter()
    for step in range(6000):
        rows = batch_rows(groups, 4, seed=3, step=step)
        assert len({where[r] for r in rows}) == 1 and len(set(rows)) == 4
        counts.update(rows)
    # 6000 x 4 draws over 200 rows: 120 each on average, sd ~11; a row of the smaller group drawn
    # as often as one of the larger (drawing groups uniformly would give 94 against 167)
    mean = lambda g: np.mean([counts[r] for r in g])  # noqa: E731
    assert abs(mean(groups[0]) - 120) < 6 and abs(mean(groups[1]) - 120) < 6
    assert min(counts.values()) > 75 and max(counts.values()) < 165
    assert batch_rows(groups, 4, 3, 17) == batch_rows(groups, 4, 3, 17)
    assert batch_rows(groups, 4, 3, 17) != batch_rows(groups, 4, 4, 17)
