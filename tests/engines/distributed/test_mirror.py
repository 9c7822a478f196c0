"""The followers' copy of the batch's caches, in one process: rank 0's engine on a group of one
(MLX's singleton group: its collectives return what they are given) records every message it
broadcasts; a Replica replays them, running the forwards itself on the same (unsplit) model.
After every step the replica's caches must equal rank 0's live ones: the same slot tables and
the same keys and values, through joins, twins (n = 2: a cloned prefill), leaves (select),
compactions and prefill chunks. And rank 0's answers are the plain batch's."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from tests.engines.chat import load_chat

mx = pytest.importorskip("mlx.core")

from engines.batch.engine import BatchEngine  # noqa: E402
from engines.distributed.bus import Bus  # noqa: E402
from engines.distributed.engine import RankZeroEngine  # noqa: E402
from engines.distributed.mirror import (APPEND, CLONE, COMPACT, NEW, SELECT, MirroredCache, Replica,  # noqa: E402
                                        run_forward)
from engines.types import Request, Sampling, SpecConfig  # noqa: E402

PROMPTS = ["the cat and the dog see the cat and the dog see the cat", "a red bird and an old fish",
           "the big house on the old road and the big house", "see the moon"]
SPECS = [SpecConfig("ngram", 4), SpecConfig("draft", 3), SpecConfig("off", 0), SpecConfig("ngram", 2)]


class RecordingBus(Bus):
    """A real singleton group's bus that also keeps what rank 0 sent."""

    sent_messages: list

    def send(self, ints: list[int]) -> None:
        self.sent_messages.append(list(ints))
        super().send(ints)


def requests() -> list[Request]:
    return [Request(prompt=p, max_tokens=30, spec=s, sampling=Sampling()) for p, s in zip(PROMPTS, SPECS)]


def run(engine, twins: bool = True, after_step=None) -> list[list[int]]:
    seqs = []
    for r in requests():
        seqs.append(engine.submit(r))
        if twins and r.spec.method == "off":  # another choice of the same request: a cloned prefill
            seqs.append(engine.submit(r, twin_of=seqs[-1]))
    got = {s.id: [] for s in seqs}
    while engine.busy:
        for s, rnd in engine.step():
            got[s.id] += rnd.tokens
        if after_step is not None:
            after_step()
    return [got[s.id] for s in seqs]


def live_caches(engine) -> list[MirroredCache]:
    caches = [engine.cache] + [s.own_cache for s in engine.joining]
    return [c for c in caches if c is not None]


def test_the_replica_follows_rank_zero_through_joins_twins_leaves_and_compactions(llama, llama_draft):
    chat = load_chat(llama, draft_model=llama_draft)
    group = mx.distributed.init()
    assert group.size() == 1
    bus = RecordingBus.join(group)
    bus.sent_messages = []
    # budget=None: every row drafts what it asks (the controller's cap follows this machine's timings)
    engine = RankZeroEngine(chat, max_batch=3, prefill_chunk=4, compact_min_slots=4, budget=None, bus=bus, check=True)
    replica = Replica(chat.model)
    compared = []

    def follow_and_compare():
        for message in bus.sent_messages + [engine.log.take()]:  # sent, and the ops not sent yet
            for f in replica.apply(message):
                run_forward(chat.model, f.cache, f.tokens, f.evaluate)
        bus.sent_messages.clear()
        for cache in live_caches(engine):
            theirs = replica.caches[cache.id]
            for mine, copy in zip(cache.tables, theirs.tables):
                assert np.array_equal(mine.pos, copy.pos) and np.array_equal(mine.next_pos, copy.next_pos)
            for mine, copy in zip(cache.layers, theirs.layers):
                if mine.keys is None:
                    assert copy.keys is None
                    continue
                n = cache.tables[0].size
                assert mx.array_equal(mine.keys[..., :n, :], copy.keys[..., :n, :]).item()
                assert mx.array_equal(mine.values[..., :n, :], copy.values[..., :n, :]).item()
            compared.append(cache.id)

    tokens = run(engine, after_step=follow_and_compare)
    alone = run(BatchEngine(load_chat(llama, draft_model=llama_draft), max_batch=3, prefill_chunk=4,
                            compact_min_slots=4, budget=None))
    assert tokens == alone
    assert len(set(compared)) >= 4 and engine.checked > 20
    ops = replica.op_counts
    assert ops[NEW] >= 4 and ops[CLONE] >= 1 and ops[APPEND] >= 3 and ops[SELECT] >= 1 and ops[COMPACT] >= 1, ops
    gc.collect()
    engine.shutdown()  # the followers' loops end (the drops ride in the same message)
    follow_and_compare()
    assert replica.caches == {}  # what rank 0 let go, the replica dropped
    assert replica.stopped


def test_an_mtp_request_decodes_plainly_and_says_why(llama):
    """The MTP drafter reads the target's whole K/V and hidden state; tensor parallel splits
    them over the ranks: the request decodes plainly, and its first Round says so."""
    chat = load_chat(llama)
    bus = Bus.join(mx.distributed.init())
    engine = RankZeroEngine(chat, bus=bus)
    rounds = list(engine.generate(Request(prompt=PROMPTS[0], max_tokens=6, spec=SpecConfig("mtp", 3, draft_model=llama))))
    assert "tensor parallel splits" in rounds[0].note and sum(r.proposed for r in rounds) == 0
