"""Plain sampling here is mlx-lm's: for the same flags and seed, ChatEngine's plain decoding
draws the very tokens mlx-lm's generate_step draws with make_sampler (same filters, same order,
same random stream). Before the sampler followed mlx-lm this failed: temperature was applied
before top-p, which keeps other tokens."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from engines.types import Request, Sampling

PROMPT = "the cat and the dog see the big red house"
FLAGS = [
    dict(temperature=0.6, top_p=0.8),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.8, top_p=0.9, min_p=0.05, top_k=6),
]


@pytest.mark.parametrize("flags", FLAGS, ids=str)
def test_plain_sampling_draws_what_mlx_lm_draws(engines, flags):
    engine = engines["llama"]
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    sampler = make_sampler(temp=flags["temperature"], top_p=flags.get("top_p", 0.0),
                           min_p=flags.get("min_p", 0.0), top_k=flags.get("top_k", 0))
    for seed in range(4):
        mx.random.seed(seed)
        theirs = [t for t, _ in generate_step(mx.array(ids), engine.model, sampler=sampler, max_tokens=24)]
        rounds = engine.generate(Request(prompt=PROMPT, max_tokens=24, sampling=Sampling(seed=seed, **flags)))
        assert [t for r in rounds for t in r.tokens] == theirs, seed
