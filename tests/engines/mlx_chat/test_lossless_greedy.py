"""Lossless at T=0: speculative output equals plain greedy decoding, token for token, for the
n-gram and draft-model proposers, steps 1..7, adaptive on and off, on a llama and a
gemma3_text checkpoint -- generations run far past the Gemma 3 sliding window (8)."""

import pytest

from engines.types import Request, SpecConfig
from tests.engines.mlx_chat.conftest import WINDOW

COPY_PROMPT = "the cat is big and the dog is small . the cat is big and the dog is small ."
FRESH_PROMPT = "a red bird and an old fish see the river"  # nothing recurs: n-gram misses
MAX_TOKENS = 48  # prompt (~20) + output > 8 windows


def tokens_of(rounds):
    return [t for r in rounds for t in r.tokens]


def run(engine, prompt, spec=None, max_tokens=MAX_TOKENS):
    return list(engine.generate(Request(prompt=prompt, max_tokens=max_tokens, spec=spec or SpecConfig())))


@pytest.mark.parametrize("model", ["llama", "gemma3"])
@pytest.mark.parametrize("method", ["ngram", "draft"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_speculative_equals_plain_greedy(engines, model, method, adaptive):
    engine = engines[model]
    proposed = accepted = 0
    prompts = (COPY_PROMPT, FRESH_PROMPT) if method == "ngram" else (COPY_PROMPT,)
    for prompt in prompts:
        plain = tokens_of(run(engine, prompt))
        assert len(plain) == MAX_TOKENS
        for steps in ((1, 4, 7) if adaptive else range(1, 8)):
            spec = SpecConfig(method=method, steps=steps, adaptive=adaptive)
            rounds = run(engine, prompt, spec)
            assert tokens_of(rounds) == plain, (prompt, steps)
            assert all(r.note is None for r in rounds)
            proposed += sum(r.proposed for r in rounds)
            accepted += sum(r.accepted for r in rounds)
            for r in rounds:
                assert len(r.accept_flags) == r.proposed and sum(r.accept_flags) == r.accepted
                assert r.proposed <= (r.steps or 0)
    # The drafters are right often but not always, so both branches of verification ran.
    assert 0 < accepted < proposed, (accepted, proposed)
    assert accepted / proposed > 0.05


def test_generations_run_past_the_window(engines):
    engine = engines["gemma3"]
    prompt_len = len(engine.prompt_ids(Request(prompt=COPY_PROMPT)))
    assert prompt_len + MAX_TOKENS > 8 * WINDOW
    out = tokens_of(run(engine, COPY_PROMPT))
    assert len(set(out[-3 * WINDOW:])) > 3  # not a one-token loop: the window contents matter


def test_ngram_hits_and_misses(engines):
    """Within one run the n-gram proposer both hits (drafts offered, some accepted) and
    misses (no recurring suffix: a plain round), and the output is still plain greedy's."""
    engine = engines["llama"]
    for prompt in (COPY_PROMPT, FRESH_PROMPT):
        rounds = run(engine, prompt, SpecConfig(method="ngram", steps=4))
        decode = [r for r in rounds if not r.prefill]
        assert any(r.proposed == 0 for r in decode)  # misses
        assert any(r.proposed > 0 for r in decode)  # hits
        assert sum(r.accepted for r in decode) > 0
        assert tokens_of(rounds) == tokens_of(run(engine, prompt))


def test_plain_equals_mlx_lm_greedy(engines):
    """Our plain decoding is mlx-lm's greedy decoding of the same prompt ids."""
    from mlx_lm.generate import generate_step
    import mlx.core as mx

    engine = engines["gemma3"]
    ids = engine.prompt_ids(Request(prompt=FRESH_PROMPT))
    ref = [t for t, _ in generate_step(mx.array(ids), engine.model, max_tokens=40)]
    assert tokens_of(run(engine, FRESH_PROMPT, max_tokens=40)) == ref
