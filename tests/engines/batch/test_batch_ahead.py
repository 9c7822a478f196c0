"""MTP steps launched before the last step's verdict is read (BatchEngine._launch_ahead): each
row's chain drafted from its verdict still in the graph, its verify queued behind, the slot
table holding the last step's kept counts lazily (SlotTable.defer). Drafters trained here on the
tiny llama (full attention) and the tiny Gemma 3 (an 8-token sliding window every run outgrows),
accepted often but not always, so acceptance is compared round for round as well as tokens.

Launched ahead, a round's k is chosen before the last verdict is read
(at most what is left after the most that round can emit): near the end of a request it can be
one lower than a step chosen after the verdict -- the only difference allowed between the two."""

from __future__ import annotations

import pytest

from engines.batch.cache import SlotTable
from engines.batch.engine import BatchEngine
from engines.types import Request, SpecConfig
from tests.engines.batch.test_batch_equals_lone import FRESH, run_batch
from tests.engines.batch.test_batch_mtp import TRAINED_ON, lone_rounds, summary
from tests.engines.chat import load_chat


def mtp(drafter, k: int, **kw) -> SpecConfig:
    return SpecConfig("mtp", k, draft_model=str(drafter), **kw)


def alone(engine, request, verifies_ahead: bool):
    return list(BatchEngine(engine, max_batch=1, budget=None, verifies_ahead=verifies_ahead).generate(request))


def same_until_the_tail(ahead, after, request: Request) -> None:
    """Tokens equal; per round (proposed, accepted) equal until the first round whose k differs,
    which must come once fewer tokens are left than two rounds can emit (2 (k + 1)): where the
    k chosen before the last verdict is read can be lower."""
    assert summary(ahead)[0] == summary(after)[0]
    a, b = summary(ahead)[2], summary(after)[2]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x[0] != y[0]), min(len(a), len(b)))
    assert a[:first] == b[:first]
    emitted = sum(len(r.tokens) for r in ahead[:first])
    assert emitted >= request.max_tokens - 2 * (request.spec.steps + 1), (a, b)


def test_a_step_launched_ahead_is_priced_only_between_steps_of_its_k(targets, monkeypatch):
    """--steps auto prices a width by its rounds' time, settle to settle. When steps launch
    before the last verdict, part of a round's time is its neighbours' (the host enqueues the
    next step while the device runs this one), so a round whose neighbour launched ahead with
    another k, or did not launch ahead while it did, is not a price (Sequence.priced): told to
    auto as priced=False. Must fail if every round were priced."""
    from engines.speculative.tuning import AutoSteps

    engine, _, drafter = targets["llama"]
    script = [1, 1, 1, 2, 2, 2, 1, 1, 3, 3, 1, 1, 1, 2, 1, 1]
    chosen = iter(script)
    monkeypatch.setattr(AutoSteps, "choose", lambda self: next(chosen, None))
    recorded = []
    record = AutoSteps.record

    def spy(self, proposed, accepted, verify_s=None, draft_s=None, priced=True, asked=None):
        recorded.append(priced)
        record(self, proposed, accepted, verify_s, draft_s, priced, asked)

    monkeypatch.setattr(AutoSteps, "record", spy)
    request = Request(prompt=TRAINED_ON[0], max_tokens=60, spec=mtp(drafter, 3, auto=True))
    rounds = [r for r in alone(engine, request, verifies_ahead=True) if not r.prefill]
    ks = [r.proposed for r in rounds]
    assert ks[:16] == script  # the script ran
    assert sum(r.launched_early for r in rounds[1:16]) == 15
    want = []
    for i, r in enumerate(rounds):
        next_early = i + 1 < len(rounds) and rounds[i + 1].launched_early
        if r.launched_early or next_early:  # between steps launched ahead, of its k
            want.append(r.launched_early and next_early and ks[i - 1] == r.proposed == ks[i + 1])
        else:
            want.append(True)
    assert recorded == want
    assert want[:15] == [False, True, False, False, True, False, False, False, False, False, False, True, False,
                         False, False]  # round 0, launched after the prefill, is no price; round 1 is


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_launched_ahead_equals_launched_after_the_verdict(targets, model):
    """Gemma 3's sliding layers read their window through the deferred counts as well."""
    engine, _, drafter = targets[model]
    for prompt, k in zip(TRAINED_ON, (3, 2)):
        request = Request(prompt=prompt, max_tokens=48, spec=mtp(drafter, k))
        ahead = alone(engine, request, verifies_ahead=True)
        after = alone(engine, request, verifies_ahead=False)
        assert any(r.launched_early for r in ahead) and not any(r.launched_early for r in after)
        same_until_the_tail(ahead, after, request)
        assert summary(after) == summary(lone_rounds(engine, request))


def test_mtp_rows_launched_ahead_get_their_lone_tokens(targets):
    """Three MTP rows, one joining late (it waits while a step launched ahead is in flight) and
    rows finishing while one is (it is dropped unread, its slots written over)."""
    engine, _, drafter = targets["llama"]
    reqs = [Request(prompt=TRAINED_ON[0], max_tokens=40, spec=mtp(drafter, 3)),
            Request(prompt=TRAINED_ON[1], max_tokens=20, spec=mtp(drafter, 2)),
            Request(prompt=FRESH + " " + TRAINED_ON[2], max_tokens=36, spec=mtp(drafter, 4))]
    got, sizes = run_batch(BatchEngine(engine, max_batch=3, budget=None), reqs, join_late=1)
    assert max(sizes) == 3
    for i, request in enumerate(reqs):
        assert summary(got[i])[0] == summary(lone_rounds(engine, request))[0], i
    assert sum(r.launched_early for i in got for r in got[i]) > 20


def test_a_deferred_step_whose_rejected_drafts_stay_visible_is_caught(targets, monkeypatch):
    """Must fail: the deferred counts say every slot written was kept (rejected drafts and
    padding visible to the next step's queries, positions shifted): the tokens change."""
    engine, _, drafter = targets["llama"]
    request = Request(prompt=TRAINED_ON[0], max_tokens=40, spec=mtp(drafter, 3))
    right = summary(alone(engine, request, verifies_ahead=True))[0]
    real = SlotTable.defer

    def all_kept(self, kept):
        import mlx.core as mx

        real(self, mx.full(kept.shape, self.width, dtype=kept.dtype))

    monkeypatch.setattr(SlotTable, "defer", all_kept)
    assert summary(alone(engine, request, verifies_ahead=True))[0] != right


def test_a_chain_from_the_wrong_hidden_state_is_caught(targets, monkeypatch):
    """Must fail: chains launched ahead start from the hidden state of the step's first position
    instead of its accepted one -- lossless still, but accepted less often."""
    import engines.batch.engine as batch_engine

    engine, _, drafter = targets["llama"]
    request = Request(prompt=TRAINED_ON[0], max_tokens=40, spec=mtp(drafter, 3))
    right = summary(alone(engine, request, verifies_ahead=True))
    real = batch_engine.lazy_verdict

    def first_position(seq, step):
        v = real(seq, step)
        v.hidden = step.hidden[0]
        return v

    monkeypatch.setattr(batch_engine, "lazy_verdict", first_position)
    wrong = summary(alone(engine, request, verifies_ahead=True))
    assert wrong[0] == right[0] and wrong[2] != right[2]


def test_gemma4_assistant_rows_launched_ahead(dense_pair):
    """The Gemma 4 assistant reads the target's full and sliding K/V through the deferred counts."""

    engine = load_chat(str(dense_pair.target))
    request = Request(prompt="we see the old moon and the sun", max_tokens=40,
                      spec=SpecConfig("mtp", 3, draft_model=str(dense_pair.assistant)))
    ahead = alone(engine, request, verifies_ahead=True)
    after = alone(engine, request, verifies_ahead=False)
    assert sum(r.launched_early for r in ahead) > 5
    same_until_the_tail(ahead, after, request)


def test_a_batch_of_one_left_unread_leaves_nothing_behind(targets):
    """A lone request whose reader stops (a client gone, a closed generator) while a step is
    launched ahead: it leaves the batch, and the next request gets exactly its own rounds."""
    from engines.batch.engine import batch_of_one

    engine, _, drafter = targets["llama"]
    one = batch_of_one(engine)
    first = one.generate(Request(prompt=TRAINED_ON[0], max_tokens=40, spec=mtp(drafter, 3)))
    for _ in range(3):
        next(first)
    assert one.ahead is not None  # a step in flight
    first.close()
    assert not one.busy and one.cache is None and one.ahead is None
    request = Request(prompt=TRAINED_ON[1], max_tokens=30, spec=mtp(drafter, 2))
    assert summary(list(one.generate(request))) == summary(alone(engine, request, verifies_ahead=True))


def test_a_table_with_every_slot_live_asks_for_no_mask():
    """A lone request's plain decoding (every slot live, inside the window) reads every key: no
    mask for one token, "causal" for more; once a slot dies, or a query's window is shorter
    than the keys read, the real mask."""
    import numpy as np

    table = SlotTable(rows=1, window=8)
    table.begin(3)
    assert table.mask(3, None) == "causal"
    table.settle([3])
    table.begin(1)
    assert table.mask(1, None) is None
    table.settle([1])
    table.begin(3)  # a verify whose last two inputs are rejected
    table.settle([1])
    table.begin(1)
    mask = table.mask(1, None)
    assert np.array(mask).tolist() == [[[[True] * 5 + [False, False] + [True]]]]
    full = SlotTable(rows=1, window=4)
    full.begin(5)
    assert not isinstance(full.mask(5, None), str)  # past the window: a real mask
    full.settle([5])
    full.begin(1)  # one token past the window reads the window's keys alone (positions 2..4, its own)
    assert full.first == 2 and full.mask(1, None) is None
