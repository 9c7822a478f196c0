"""The batch's prompt cache (engines/batch/prompt_cache.py): a prompt read before is not read
again -- whole, or in whole chunks of a common prefix -- and every request still gets exactly
its lone tokens (the chunks it skips were read in the very forwards its lone run makes)."""

from __future__ import annotations

import pytest

from engines.types import Request, SpecConfig
from engines.batch.engine import BatchEngine
from engines.batch.prompt_cache import PromptCache
from tests.engines.batch.test_batch_equals_lone import COPY, FRESH, lone

CHUNK = 8


def batch_reading(engine, monkeypatch, max_bytes: int = 2**30):
    """A batch with a prompt cache, and the list of prompt tokens it reads (prefill chunks)."""
    batch = BatchEngine(engine, max_batch=4, prefill_chunk=CHUNK, budget=None)
    batch.prompt_cache = PromptCache(CHUNK, max_bytes)
    read = []
    real = BatchEngine._forward

    def counting(self, cache, rows, seqs):
        if not seqs:  # a prefill chunk (the first-token forward names its sequence)
            read.append(len(rows[0]))
        return real(self, cache, rows, seqs)

    monkeypatch.setattr(BatchEngine, "_forward", counting)
    return batch, read


def run_one(batch, request) -> list[int]:
    seq = batch.submit(request)
    tokens = []
    while batch.busy:
        for s, rnd in batch.step():
            if s is seq:
                tokens += rnd.tokens
    return tokens


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_prompts_read_before_are_not_read_again(engines, model, monkeypatch):
    engine = engines[model]
    first = Request(prompt=COPY + " " + FRESH, max_tokens=16, spec=SpecConfig("ngram", 3), ignore_chat_template=True)
    same = Request(prompt=first.prompt, max_tokens=16, ignore_chat_template=True)
    longer = Request(prompt=first.prompt + " and the old moon", max_tokens=16, ignore_chat_template=True)
    shorter = Request(prompt=COPY + " a red", max_tokens=16, ignore_chat_template=True)
    alone = {id(r): lone(engine, r)[0] for r in (first, same, longer, shorter)}
    batch, read = batch_reading(engine, monkeypatch)
    body = lambda r: len(engine.prompt_ids(r)) - 1  # noqa: E731
    common = lambda a, b: next(i for i, (x, y) in enumerate(zip(a + [-1], b + [-2])) if x != y)  # noqa: E731

    assert run_one(batch, first) == alone[id(first)] and sum(read) == body(first)
    read.clear()
    assert run_one(batch, same) == alone[id(same)] and sum(read) == 0  # the whole prompt kept
    read.clear()
    assert run_one(batch, longer) == alone[id(longer)]
    assert sum(read) == body(longer) - body(first) // CHUNK * CHUNK  # whole chunks of the common prefix reused
    read.clear()
    shared = common(engine.prompt_ids(shorter)[:-1], engine.prompt_ids(first)[:-1])
    assert shared >= CHUNK
    assert run_one(batch, shorter) == alone[id(shorter)]  # a kept prompt cut back to whole chunks
    assert sum(read) == body(shorter) - shared // CHUNK * CHUNK
    cache = batch.prompt_cache
    assert cache.hit_tokens > 0


def test_the_least_recently_used_prompt_goes_first(engines, monkeypatch):
    engine = engines["llama"]
    reqs = [Request(prompt=p, max_tokens=4, ignore_chat_template=True) for p in (COPY, FRESH, COPY + " " + FRESH)]
    batch, read = batch_reading(engine, monkeypatch)
    for r in reqs[:2]:
        run_one(batch, r)
    one = max(c.nbytes for c in batch.prompt_cache.entries.values())
    batch.prompt_cache.max_bytes = 2 * one  # room for two
    run_one(batch, reqs[0])  # a hit: COPY is now the most recently used
    run_one(batch, reqs[2])  # a third prompt: FRESH (least recently used) goes
    kept = {len(k) for k in batch.prompt_cache.entries}
    assert len(engine.prompt_ids(reqs[1])) - 1 not in kept and len(engine.prompt_ids(reqs[0])) - 1 in kept
