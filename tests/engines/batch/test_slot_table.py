"""The slot table through what moves its columns and positions -- rows that join, roll back and
leave, compactions, drafts rejected and left dead: the first column read (SlotTable.first_read),
found by stepping on from the last one, equals the search over every column; what a forward
settles is written as the slots it kept, in place in the table's buffer; the columns a compaction
would free, counted from next_pos, equal the count over the table's slots (fewer only where a
rollback reached past a compaction)."""

import random

import numpy as np
import pytest

from engines.batch.cache import DEAD, SlotTable


def searched(table: SlotTable) -> int:
    """The first column some row's window still sees, searched over every column."""
    if not table.window or not table.pos.shape[1]:
        return 0
    seen = (table.pos > (table.next_pos[:, None] - table.window)).any(axis=0)
    return int(seen.argmax()) if seen.any() else table.pos.shape[1]


def freed_by_compaction(table: SlotTable) -> int:
    """What compact() would free, counted over every slot it keeps (keep_mask)."""
    return table.size - int(table.keep_mask().sum(axis=1).max(initial=0))


def assert_freed_counted(table: SlotTable, past_compaction: bool) -> None:
    """reclaimable() counts what compact() would free; fewer only in a windowed table where a
    rollback reached past a compaction (positions the window needs are gone)."""
    freed = freed_by_compaction(table)
    assert table.reclaimable() == freed or (table.window and past_compaction and table.reclaimable() < freed)


def prefilled(window: int | None, tokens: int) -> SlotTable:
    table = SlotTable(rows=1, window=window)
    table.begin(tokens)
    table.settle([tokens])
    assert table.pos.tolist() == [list(range(tokens))] and table.next_pos.tolist() == [tokens]
    return table


@pytest.mark.parametrize("seed", range(6))
def test_first_read_and_settle_through_joins_rollbacks_leaves_and_compactions(seed):
    rng = random.Random(seed)
    window = rng.choice([3, 8, 16]) if seed else None
    table = prefilled(window, rng.randint(1, 20))
    firsts, past_compaction = [], False  # (a rollback reached past a compaction: reclaimable may count fewer)
    moves = {"step": 0, "join": 0, "rollback": 0, "leave": 0, "compact": 0}
    for _ in range(400):
        move = rng.choices(list(moves), weights=[20, 1, 2, 1, 1])[0]
        if move == "join" and table.rows < 4:
            table.append_rows(prefilled(window, rng.randint(1, 100)))
        elif move == "rollback" and table.rows:
            table.rollback([rng.randint(0, min(2, int(n))) for n in table.next_pos])
            past_compaction |= table.compactions > 0
        elif move == "leave" and table.rows > 1:
            table.select(sorted(rng.sample(range(table.rows), table.rows - 1)))
        elif move == "compact" and table.rows:
            table.compact()
        else:  # a verify forward: each row keeps its pending token and some of its drafts
            width = rng.randint(1, 5)
            table.begin(width)
            assert table.first == searched(table)
            firsts.append(table.first)
            kept = [rng.randint(0, width) for _ in range(table.rows)]  # (a draft model's rows may keep none)
            written = table.next_pos[:, None] + np.arange(width)
            expected = np.concatenate([table.pos, np.where(np.arange(width) < np.array(kept)[:, None], written, DEAD)], axis=1)
            table.settle(kept)
            assert (table.pos == expected).all() and (table.next_pos == written[:, 0] + kept).all()
            assert_freed_counted(table, past_compaction)
            moves["step"] += 1
            continue
        moves[move] += 1
        assert_freed_counted(table, past_compaction)
        table.begin(1)
        assert table.first == searched(table)
        table.abandon()
    assert all(moves.values()), moves  # (every move was made)
    assert max(firsts) > 0 or window is None  # (the windows moved on: columns were left behind)
