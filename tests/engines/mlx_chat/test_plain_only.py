"""A model the batch cannot hold (recurrent layers: a tiny Mamba) decodes plainly through
mlx-lm's generate_step (ChatEngine.generate_plainly), one Round per token: its output is
mlx-lm's own, a speculative request hears why it was not, and stop strings, cancel during the
prompt and seeded sampling behave as in the batch."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from engines.mlx_chat.prefill import PREFILL_CHUNK
from engines.types import Request, Sampling, SpecConfig
from tests.engines.chat import load_chat
from tests.engines.mlx_chat import checkpoints

PROMPT = "the cat is big and the dog is small"


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    engine = load_chat(checkpoints.make_tiny_mamba(tmp_path_factory.mktemp("mamba") / "mamba"))
    assert engine.loop is None and "ArraysCache" in engine.plain_only
    return engine


def mlx_lm_tokens(engine, max_tokens, sampler=None):
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    return [int(t) for t, _ in generate_step(mx.array(ids), engine.model, max_tokens=max_tokens, sampler=sampler)]


def test_a_speculative_request_decodes_plainly_and_says_why(mamba):
    rounds = list(mamba.generate(Request(prompt=PROMPT, max_tokens=24, max_repeat=0,
                                         spec=SpecConfig(method="ngram", steps=4))))
    assert [t for r in rounds for t in r.tokens] == mlx_lm_tokens(mamba, 24)
    assert len(set(mlx_lm_tokens(mamba, 24))) > 3  # not a model stuck on one token
    assert rounds[0].prefill and "speculation unavailable" in rounds[0].note and "ArraysCache" in rounds[0].note
    assert all(r.note is None and r.proposed == 0 and len(r.tokens) == 1 for r in rounds[1:])
    assert rounds[-1].finish == "length" and len(rounds) == 24
    assert "".join(r.text for r in rounds) == mamba.decode([t for r in rounds for t in r.tokens])
    plain = list(mamba.generate(Request(prompt=PROMPT, max_tokens=8, max_repeat=0)))
    assert plain[0].note is None  # nothing asked, nothing to say


def test_a_stop_string_ends_it(mamba):
    full = list(mamba.generate(Request(prompt=PROMPT, max_tokens=24, max_repeat=0)))
    text = "".join(r.text for r in full)
    stop = text[len(text) // 2:len(text) // 2 + 3]
    rounds = list(mamba.generate(Request(prompt=PROMPT, max_tokens=24, max_repeat=0, stop=[stop])))
    assert rounds[-1].finish == "stop" and len(rounds) < len(full)
    assert "".join(r.text for r in rounds) == text[:text.index(stop)]


def test_cancel_while_the_prompt_is_read(mamba):
    progress = []
    long_prompt = " ".join(["the cat and the dog"] * (PREFILL_CHUNK // 2))  # several chunks
    rounds = list(mamba.generate(Request(prompt=long_prompt, max_tokens=8, ignore_chat_template=True),
                                 lambda: bool(progress), on_prefill=progress.append))
    assert len(progress) == 1 and progress[0].done == PREFILL_CHUNK  # stopped after the first chunk
    assert len(rounds) == 1 and rounds[0].prefill and rounds[0].finish == "cancelled" and not rounds[0].tokens


def test_seeded_sampling_is_mlx_lms(mamba):
    sampling = Sampling(temperature=0.8, top_p=0.9, seed=7)
    ours = [t for r in mamba.generate(Request(prompt=PROMPT, max_tokens=16, max_repeat=0, sampling=sampling))
            for t in r.tokens]
    mx.random.seed(7)
    assert ours == mlx_lm_tokens(mamba, 16, make_sampler(temp=0.8, top_p=0.9))
    other = [t for r in mamba.generate(Request(prompt=PROMPT, max_tokens=16, max_repeat=0,
                                               sampling=Sampling(temperature=0.8, top_p=0.9, seed=8)))
             for t in r.tokens]
    assert other != ours
