"""Exactness against mlx-lm itself, not only against this engine with speculation off: greedy
output with speculation equals mlx-lm's own generate_step on every fixture model, and past
several compactions of the batch of one's slot table with rollbacks that cross the
sliding-window edge."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from engines.types import Request, SpecConfig

PROMPT = "the cat is big and the dog is small . the cat is big and the dog is small ."
SPECS = [SpecConfig(method="ngram", steps=5), SpecConfig(method="draft", steps=3)]


def ours(engine, spec, max_tokens):
    # max_repeat=0: mlx-lm has no loop detector, and a tiny random model loops within 1600 tokens
    rounds = engine.generate(Request(prompt=PROMPT, max_tokens=max_tokens, spec=spec, max_repeat=0))
    return [t for r in rounds for t in r.tokens]


def mlx_lm_greedy(engine, max_tokens):
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    return [t for t, _ in generate_step(mx.array(ids), engine.model, max_tokens=max_tokens)]


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_speculative_output_is_mlx_lm_greedy(engines, model):
    engine = engines[model]
    want = mlx_lm_greedy(engine, 48)
    for spec in SPECS:
        assert ours(engine, spec, 48) == want, spec.method


def count_table_compactions(monkeypatch) -> list[int]:
    """Spy on the batch's slot tables (a lone request is a batch of one): every compaction."""
    from engines.batch.cache import SlotTable

    seen = [0]
    real = SlotTable.compact

    def compact(self):
        seen[0] += 1
        real(self)

    monkeypatch.setattr(SlotTable, "compact", compact)
    return seen


def test_exact_past_several_slot_table_compactions(engines, monkeypatch):
    """The batch of one's slot table compacted every few tokens (its sliding table drops what
    the window no longer sees), rejected drafts crossing the window's edge."""
    engine = engines["gemma3"]  # sliding window 8
    monkeypatch.setattr(engine.loop, "compact_min_slots", 4)
    compactions = count_table_compactions(monkeypatch)
    want = mlx_lm_greedy(engine, 200)
    for spec in SPECS:
        before = compactions[0]
        rounds = list(engine.generate(Request(prompt=PROMPT, max_tokens=200, spec=spec, max_repeat=0)))
        assert [t for r in rounds for t in r.tokens] == want, spec.method
        assert compactions[0] - before >= 10, spec.method
        assert 0 < sum(r.accepted for r in rounds) < sum(r.proposed for r in rounds)  # rollbacks happened
