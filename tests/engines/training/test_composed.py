"""Composed drafting (engines/mlx_chat/composed.py): n-gram lookup beside a drafter trained on
the tiny llama. On a mixed set -- prompts it copies and prompts it answers freshly -- rounds
draft in all three forms (n-gram alone, the chain, the chain with n-gram tokens after it:
at T>0 their rows of q are one-hot beside the drafter's sampled ones), the output is plain decoding's token for token at T=0, and at T>0 the
target's exact law holds (a broken verifier fails the same test)."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import pytest

from engines.types import Request, SpecConfig
from tests.engines.broken_verifiers import BROKEN
from tests.engines.mlx_chat.test_lossless_sampled import PROMPT, SAMPLING, WORDS, exact_distribution
from tests.engines.training.trained import prompts, trained_drafter
from tests.engines.mlx_chat import checkpoints
from tests.stats import chi_square_pvalue

COPY = "the cat is big and the dog is small . the cat is big and the dog is small ."
MIXED = [COPY, prompts(checkpoints.WORDS)[0], COPY + " " + prompts(checkpoints.WORDS)[1], prompts(checkpoints.WORDS)[2]]


def tokens(rounds):
    return [t for r in rounds for t in r.tokens]


def test_composed_drafts_from_both_and_equals_plain(targets):
    engine, _, drafter = targets["llama"]
    sources = Counter()
    for prompt in MIXED:
        plain = tokens(engine.generate(Request(prompt=prompt, max_tokens=48)))
        spec = SpecConfig("mtp", 4, draft_model=str(drafter), compose_ngram=True)
        rounds = list(engine.generate(Request(prompt=prompt, max_tokens=48, spec=spec)))
        assert tokens(rounds) == plain
        assert not any(r.note for r in rounds)
        sources.update(r.draft_source for r in rounds if r.proposed)
    assert sources["ngram"] > 0 and sources["mtp"] > 0 and sources["mtp+ngram"] > 0, sources


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from engines.mlx_chat.engine import ChatEngine

    d = tmp_path_factory.mktemp("tiny_vocab_composed")
    target = checkpoints.make_tiny_llama(d / "target", words=WORDS, scale=0.6)
    engine = ChatEngine.load(str(target))
    return engine, str(trained_drafter(engine, target, WORDS, steps=100))


def law(engine, drafter, n=500):
    spec = SpecConfig("mtp", 3, draft_model=drafter, compose_ngram=True)
    mx.random.seed(4)
    counts, sources = Counter(), Counter()
    for _ in range(n):
        rounds = list(engine.generate(Request(prompt=PROMPT, max_tokens=5, spec=spec, sampling=SAMPLING,
                                              ignore_chat_template=True)))
        counts[tuple(tokens(rounds))[:3]] += 1
        sources.update(r.draft_source for r in rounds if r.proposed)
    return counts, sources


def test_composed_keeps_the_target_law(tiny_pair):
    engine, drafter = tiny_pair
    counts, sources = law(engine, drafter)
    assert sources["ngram"] > 0 and sources["mtp"] > 0 and sources["mtp+ngram"] > 0, sources
    assert chi_square_pvalue(counts, exact_distribution(engine), 500) > 1e-3


def test_a_broken_verifier_fails_the_composed_law(tiny_pair, monkeypatch):
    engine, drafter = tiny_pair
    BROKEN["resample_from_p"](monkeypatch)
    counts, _ = law(engine, drafter)
    assert chi_square_pvalue(counts, exact_distribution(engine), 500) < 1e-3
