"""Which rows train and which are held out (split), and which rows make each step's batch:
a function of (seed, step) alone, so a resumed run draws the batches it would have."""

from __future__ import annotations

import numpy as np

from engines.training import data as D

LENGTH_GROUP = 64  # sequences per group of about one length that a batch is drawn from (length_groups)


def split(n: int, answers: int, prompts: int, held_out: float, seed: int) -> tuple[list[int], list[int]]:
    """Train and held-out rows (at least one of each when n >= 2), fixed by the seed. The
    held-out rows are drawn from the target's greedy answers (rows 0..prompts-1) when there are
    any: acceptance is then measured on what the target itself writes at T=0, as in chat, and
    every other answer to a held-out prompt (row r < answers answers prompt r % prompts) is
    left out of training, so held-out prompts stay unseen; text files are all for training."""
    pool = min(prompts, answers) if answers >= 2 else n
    order = np.random.default_rng([seed, 7]).permutation(pool).tolist()
    k = min(max(1, round(pool * held_out)), pool - 1) if pool >= 2 else 0
    held = sorted(order[:k]) or order
    unseen = set(held)
    if answers >= 2:
        unseen |= {r for r in range(pool, answers) if r % pool in unseen}
    return sorted(set(range(n)) - unseen) or order, held


def length_groups(rows: list[int], lengths: np.ndarray, size: int = LENGTH_GROUP) -> list[list[int]]:
    """The rows sorted by length and cut into groups of `size` (a short last group joins the one
    before), which batch_rows draws a batch from: its rows then have about one length, and the
    batch's rectangle little padding: the shorter answers end early, and a batch drawn at random
    computes their padding (HF Trainer's `group_by_length` does the same; docs/benchmarks.md, A
    drafter trained here: what a step costs)."""
    order = sorted(rows, key=lambda r: (int(lengths[r]), r))
    groups = [order[i:i + size] for i in range(0, len(order), size)]
    if len(groups) > 1 and len(groups[-1]) < size // 2:
        tail = groups.pop()
        groups[-1] += tail
    return groups


def batch_rows(groups: list[list[int]], batch: int, seed: int, step: int) -> list[int]:
    """The rows of batch `step`: a group drawn with probability by its size, then `batch` of its
    rows, so every row is as likely as with one group. A function of (seed, step) only -- what
    makes resume exact."""
    rng = np.random.default_rng([seed, step])
    sizes = np.array([len(g) for g in groups], dtype=float)
    group = groups[int(rng.choice(len(groups), p=sizes / sizes.sum()))]
    return rng.choice(group, size=batch, replace=len(group) < batch).tolist()


def answer_rows_per_batch(feats: D.Features, rows: list[int], batch: int) -> float:
    """The positions whose depth-1 draft a batch's loss counts, on average over the training rows
    (a row's answer positions from max(start, 1)): chained_loss's fixed divisor, so that a batch of
    short answers weighs each position as much as a batch of long ones (length_groups makes both)."""
    lengths = np.array(feats.lengths)[rows]
    starts = np.array(feats.starts)[rows] if feats.starts is not None else np.zeros(len(rows), int)
    return batch * float(np.mean(lengths - np.maximum(starts, 1)))
