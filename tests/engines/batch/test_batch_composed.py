"""Composed drafting (--with-ngram) in the batch at T=0: rows that draft from n-gram lookup
beside a draft model or an MTP drafter -- their chains drafted together with the drafter's
other rows (engines/speculative/composed.py, ComposedGroup) -- beside plain, n-gram and
single-method rows. Each request gets exactly its lone tokens and its lone run's drafts and
acceptance, round for round; the composed rows' rounds come from both sources."""

from __future__ import annotations

from collections import Counter

import pytest

from engines.types import Request, SpecConfig
from engines.batch.engine import BatchEngine
from engines.speculative import composed
from tests.engines.batch.test_batch_equals_lone import COPY, FRESH, run_batch
from tests.engines.batch.test_batch_mtp import TRAINED_ON, lone_rounds, summary


def requests(drafter: str, draft_model: str) -> list[Request]:
    with_ngram = lambda method, k, path: SpecConfig(method, k, draft_model=path, compose_ngram=True)  # noqa: E731
    return [
        Request(prompt=COPY + " " + TRAINED_ON[0], max_tokens=40, spec=with_ngram("mtp", 3, drafter)),
        Request(prompt=COPY, max_tokens=36, spec=with_ngram("draft", 3, draft_model)),
        Request(prompt=FRESH, max_tokens=24),
        Request(prompt=TRAINED_ON[1] + " " + COPY, max_tokens=40, spec=with_ngram("mtp", 2, drafter)),
        Request(prompt=COPY + " the sun", max_tokens=30, spec=SpecConfig("draft", 3, draft_model=draft_model)),
        Request(prompt=FRESH + " " + COPY, max_tokens=36, spec=with_ngram("draft", 5, draft_model)),
    ]


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_composed_rows_get_their_lone_tokens(targets, model, llama_draft_dir, gemma3_draft_dir, monkeypatch):
    monkeypatch.setattr(composed, "MEASURED", False)  # flat prices: which source drafts does not hang on timing
    engine, _, drafter_dir = targets[model]
    reqs = requests(str(drafter_dir), llama_draft_dir if model == "llama" else gemma3_draft_dir)
    alone = [summary(lone_rounds(engine, r)) for r in reqs]
    batch = BatchEngine(engine, max_batch=4, budget=None, compact_min_slots=4 if model == "gemma3" else 64)
    got, sizes = run_batch(batch, reqs, join_late=2)
    assert max(sizes) == 4
    for i in range(len(reqs)):
        assert summary(got[i]) == alone[i], i  # tokens, finish, and each round's (proposed, accepted)
    composed_rounds = [r for i in (0, 1, 3, 5) for r in got[i]]
    assert not any(r.note for r in composed_rounds)  # composed in the batch: nothing fell back
    sources = Counter(r.draft_source for r in composed_rounds if r.proposed)
    assert sources["ngram"] and sum(n for s, n in sources.items() if s != "ngram"), sources
    proposed, accepted = sum(r.proposed for r in composed_rounds), sum(r.accepted for r in composed_rounds)
    assert 0 < accepted < proposed, (accepted, proposed)
