"""Repetition loops in the chat round loop (engines/speculative/repetition.py hooked into
ChatEngine): a tiny random Llama falls into a one-token loop on "hello world" and keeps to
varied text on other prompts. With the detector on, plain, n-gram and draft-model runs stop at
the same token with finish="repetition", and every output is a prefix of the detector-off
output (equal to it when the run does not loop); the real SmolLM2 on the copy-heavy prompt set
(slow) is never stopped."""

import json

import pytest

from engines.types import Request, SpecConfig
from engines.speculative.repetition import RepetitionDetector

LOOPING, VARIED = "hello world", ["the cat", "a b c"]
MAX_TOKENS = 300


def specs(draft_dir):
    return {"off": SpecConfig(method="off", steps=0), "ngram": SpecConfig(method="ngram", steps=5),
            "draft": SpecConfig(method="draft", steps=3, draft_model=draft_dir)}


def run(engine, prompt, spec, max_repeat):
    rounds = list(engine.generate(Request(kind="chat", prompt=prompt, max_tokens=MAX_TOKENS, spec=spec,
                                          max_repeat=max_repeat)))
    return [t for r in rounds for t in r.tokens], rounds


def first_loop(tokens, copies=4):
    d = RepetitionDetector(copies=copies)
    return next((i for i, t in enumerate(tokens) if d.push(t) is not None), None)


def test_a_looping_run_stops_at_the_same_token_plain_or_speculative(engines, llama_draft_dir):
    engine = engines["llama"]
    free, _ = run(engine, LOOPING, SpecConfig(method="off", steps=0), max_repeat=0)
    loop_at = first_loop(free)
    assert loop_at is not None and loop_at < MAX_TOKENS - 1  # the prompt does prime a loop
    for name, spec in specs(llama_draft_dir).items():
        tokens, rounds = run(engine, LOOPING, spec, max_repeat=4)
        assert tokens == free[: loop_at + 1], name
        assert rounds[-1].finish == "repetition" and "repeats a block of 1 token" in rounds[-1].note, name
        assert all(r.finish is None for r in rounds[:-1])
    drafted = run(engine, LOOPING, specs(llama_draft_dir)["draft"], max_repeat=4)[1]
    assert sum(r.proposed for r in drafted) > 0  # speculation really ran


@pytest.mark.parametrize("prompt", VARIED)
def test_a_run_that_does_not_loop_is_untouched(engines, llama_draft_dir, prompt):
    engine = engines["llama"]
    free, _ = run(engine, prompt, SpecConfig(method="off", steps=0), max_repeat=0)
    assert first_loop(free) is None
    for name, spec in specs(llama_draft_dir).items():
        tokens, rounds = run(engine, prompt, spec, max_repeat=4)
        assert tokens == free and rounds[-1].finish == "length", name


@pytest.mark.slow
def test_the_copy_heavy_set_is_never_stopped_on_smollm2():
    """The benchmark prompts on the embedded SmolLM2: the detector (default on) changes no
    output and stops no run."""
    import resources
    from engines.factory import load_engine
    from engines.mlx_chat.models import default_chat_model

    engine = load_engine("chat", str(default_chat_model()))
    prompts = json.loads(resources.path("prompts", "copy_heavy.json").read_text())["prompts"]
    for p in prompts:
        spec = SpecConfig(method="ngram", steps=5)
        on = list(engine.generate(Request(kind="chat", prompt=p["prompt"], max_tokens=256, spec=spec)))
        off = list(engine.generate(Request(kind="chat", prompt=p["prompt"], max_tokens=256, spec=spec, max_repeat=0)))
        assert [t for r in on for t in r.tokens] == [t for r in off for t in r.tokens], p["name"]
        assert on[-1].finish != "repetition", p["name"]
