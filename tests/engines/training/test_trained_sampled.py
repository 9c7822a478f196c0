"""Lossless at T>0 with a trained drafter: --spec mtp's sequences follow the target's exact
law (chi-square against the law enumerated from the model's own logits), at 1 and 3 drafts
per round -- and a lossy acceptance rule fails the very same test.

The target is test_lossless_sampled.py's 4-word llama (same prompt, same sampling); the
drafter is trained on it in seconds (tests/engines/training/trained.py). Its q is a full
distribution over the drafter's vocabulary, so this exercises real rejection sampling
(accept min(1, p/q), resample from the residual), not the point-mass rule of n-gram drafts."""

from collections import Counter

import mlx.core as mx
import pytest

from engines.types import Request, SpecConfig
from tests.engines.mlx_chat import checkpoints
from tests.engines.mlx_chat.test_lossless_sampled import PROMPT, SAMPLING, WORDS, exact_distribution, threshold_accept
from tests.engines.training.trained import trained_drafter
from tests.stats import chi_square_pvalue
from tests.engines.chat import load_chat

N = 500


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_vocab_trained")
    target = checkpoints.make_tiny_llama(d / "target", words=WORDS, scale=0.6)
    engine = load_chat(str(target))
    return engine, trained_drafter(engine, target, WORDS, steps=100)


@pytest.fixture(scope="module")
def exact(tiny):
    return exact_distribution(tiny[0])


def sample(engine, drafter, steps, seed=1):
    spec = SpecConfig(method="mtp", steps=steps, draft_model=str(drafter))
    mx.random.seed(seed)
    counts, proposed, accepted = Counter(), 0, 0
    for _ in range(N):
        request = Request(prompt=PROMPT, max_tokens=steps + 2, spec=spec, sampling=SAMPLING, ignore_chat_template=True)
        rounds = list(engine.generate(request))
        assert all(r.note is None for r in rounds)
        for r in rounds[1:]:
            assert r.finish is not None or len(r.tokens) == r.accepted + 1
        counts[tuple(t for r in rounds for t in r.tokens)[:3]] += 1
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
    return counts, proposed, accepted


@pytest.mark.parametrize("steps", [1, 3])
def test_trained_mtp_keeps_the_target_distribution(tiny, exact, steps):
    engine, drafter = tiny
    counts, proposed, accepted = sample(engine, drafter, steps)
    assert proposed > 0.5 * N and 0.05 * proposed < accepted < 0.95 * proposed, (accepted, proposed)
    assert chi_square_pvalue(counts, exact, N) > 1e-3


def test_a_lossy_acceptance_rule_fails_the_same_test(tiny, exact, monkeypatch):
    from engines.mlx_chat import sampling

    monkeypatch.setattr(sampling, "lossless_accept", threshold_accept)
    engine, drafter = tiny
    counts, proposed, _ = sample(engine, drafter, 1)
    assert proposed > 0.5 * N
    assert chi_square_pvalue(counts, exact, N) < 1e-3
