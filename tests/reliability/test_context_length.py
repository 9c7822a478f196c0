"""Issue 16 item 1 (and 5's max_tokens): a prompt past the model's context is refused in one
line before any forward runs, instead of prefilling for minutes; so is max_tokens past it."""

import time

import pytest

from engines.types import EngineError, Request, Sampling
from engines.validation import InvalidParameter
from tests.reliability.conftest import CONTEXT

WORDS = "the cat is big and the dog is small . "


def first_round(engine, request):
    return next(engine.generate(request))


def test_context_is_read_from_the_config(short_engine):
    assert short_engine.context_length == CONTEXT


def test_prompt_longer_than_the_context_fails_before_prefill(short_engine):
    prompt = WORDS * 400  # ~4000 tokens against a 256-token context
    t0 = time.perf_counter()
    with pytest.raises(EngineError, match=f"longer than the model's context of {CONTEXT} tokens"):
        first_round(short_engine, Request(prompt=prompt, max_tokens=8, ignore_chat_template=True))
    print(f"refused a ~4000-token prompt in {time.perf_counter() - t0:.3f} s")


def test_prompt_plus_max_tokens_past_the_context_says_how_much_fits(short_engine):
    prompt = WORDS * 20  # 200 tokens: fits alone, not with 100 more
    with pytest.raises(EngineError, match=r"lower max_tokens to \d+"):
        first_round(short_engine, Request(prompt=prompt, max_tokens=100, ignore_chat_template=True))
    rnd = first_round(short_engine, Request(prompt=prompt, max_tokens=40, ignore_chat_template=True))
    assert rnd.prefill and len(rnd.tokens) == 1


def test_max_tokens_past_the_context(short_engine):
    with pytest.raises(InvalidParameter, match="max_tokens"):
        first_round(short_engine, Request(prompt="the cat", max_tokens=CONTEXT + 1))


def test_negative_seed_is_one_line_not_a_type_error(short_engine):
    # before: mx.random.seed(-1) raised TypeError (a traceback in the CLI)
    with pytest.raises(InvalidParameter, match="seed"):
        first_round(short_engine, Request(prompt="the cat", max_tokens=4, sampling=Sampling(temperature=1.0, seed=-1)))


LONG_PROMPT = WORDS * 90  # ~900 tokens: several prefill chunks on the CPU backend (256 tokens each)


def test_prefill_reports_progress_and_stops_between_chunks(tiny_llama_engine):
    from engines.mlx_chat.prefill import PREFILL_CHUNK

    seen = []
    request = Request(prompt=LONG_PROMPT, max_tokens=8, ignore_chat_template=True)
    rounds = list(tiny_llama_engine.generate(request, on_prefill=seen.append))
    total = len(tiny_llama_engine.tokenizer.encode(LONG_PROMPT)) - 1  # the last token gives the logits
    assert [p.done for p in seen] == [min(total, PREFILL_CHUNK * (i + 1)) for i in range(len(seen))]
    assert seen[-1].done == seen[-1].total == total and len(seen) >= 2
    assert all(p.tok_s > 0 for p in seen) and seen[0].eta_s > 0 and seen[-1].eta_s == 0
    assert "tok/s" in seen[0].describe() and "left" in seen[0].describe()
    assert sum(len(r.tokens) for r in rounds) == 8

    # cancel during prefill: asked after the first chunk, the run ends before the second
    seen.clear()
    rounds = list(tiny_llama_engine.generate(request, should_stop=lambda: bool(seen), on_prefill=seen.append))
    assert len(seen) == 1 and len(rounds) == 1
    assert rounds[0].prefill and rounds[0].finish == "cancelled" and rounds[0].tokens == []
