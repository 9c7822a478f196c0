"""The batch loop at T>0 on a real (tiny) model: 500 requests, 8 at a time in one batch, each
its own seed -- the first three tokens of each follow the target's exact law (enumerated from
the model's own logits, as tests/engines/mlx_chat/test_lossless_sampled.py does for one stream),
plain, n-gram and the batched draft model at 1 and 3 drafts. Must fail: every sequence on one
RNG stream (a shared seed), and a broken verifier (resample from p at a rejection)."""

from __future__ import annotations

from collections import Counter

import pytest

from engines.batch.engine import BatchEngine
from engines.types import Request, SpecConfig
from tests.engines.broken_verifiers import BROKEN
from tests.engines.mlx_chat.test_lossless_sampled import N, PROMPT, SAMPLING, exact_distribution, tiny  # noqa: F401
from tests.stats import chi_square_pvalue
from tests.engines.chat import load_chat

ALPHA = 1e-3


@pytest.fixture(scope="module")
def exact(tiny):  # noqa: F811 (the fixture above)
    return exact_distribution(tiny)


def batch_counts(engine, spec: SpecConfig, seed_of=lambda i: 1000 + i, max_tokens: int = 5, max_batch: int = 8,
                 launched: list | None = None):
    """`launched`: gets the number of rounds launched before the last verdict was read."""
    batch = BatchEngine(engine, max_batch=max_batch, budget=None)
    counts, proposed, accepted = Counter(), 0, 0
    tokens: dict[int, list[int]] = {}
    pending = list(range(N))
    early = 0
    while pending or batch.busy:
        while pending and len(batch.joining) + batch.size < max_batch:
            i = pending.pop()
            sampling = type(SAMPLING)(**(SAMPLING.__dict__ | {"seed": seed_of(i)}))
            seq = batch.submit(Request(prompt=PROMPT, max_tokens=max_tokens, spec=spec, sampling=sampling,
                                       ignore_chat_template=True))
            tokens[seq.id] = []
        for seq, rnd in batch.step():
            tokens[seq.id] += rnd.tokens
            proposed += rnd.proposed
            accepted += rnd.accepted
            early += rnd.launched_early
            if rnd.finish:
                counts[tuple(tokens.pop(seq.id)[:3])] += 1
    if launched is not None:
        launched.append(early)
    return counts, proposed, accepted


SLOW = pytest.mark.slow


@pytest.mark.parametrize("method,steps", [pytest.param("off", 0, marks=SLOW), pytest.param("ngram", 1, marks=SLOW),
                                          ("ngram", 3), pytest.param("draft", 1, marks=SLOW), ("draft", 3)])
def test_each_sequence_follows_the_target_law(tiny, exact, method, steps):  # noqa: F811
    counts, proposed, accepted = batch_counts(tiny, SpecConfig(method, steps))
    if method != "off":
        assert proposed > 0.5 * N and 0.03 * proposed < accepted < 0.95 * proposed
    assert sum(counts.values()) == N
    assert chi_square_pvalue(counts, exact, N) > ALPHA


def test_one_rng_stream_for_every_sequence_is_caught(tiny, exact):  # noqa: F811
    counts, _, _ = batch_counts(tiny, SpecConfig("draft", 3), seed_of=lambda i: 7)
    assert chi_square_pvalue(counts, exact, N) < ALPHA


@pytest.mark.slow
def test_a_broken_verifier_is_caught_in_the_batch(tiny, exact, monkeypatch):  # noqa: F811
    BROKEN["resample_from_p"](monkeypatch)
    counts, _, _ = batch_counts(tiny, SpecConfig("draft", 3))
    assert chi_square_pvalue(counts, exact, N) < ALPHA


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory):
    """test_trained_sampled.py's pair: the 4-word llama and a drafter trained on it in seconds
    (its q is a full distribution: real rejection sampling in the batch's MTP rows)."""
    from tests.engines.mlx_chat import checkpoints
    from tests.engines.mlx_chat.test_lossless_sampled import WORDS
    from tests.engines.training.trained import trained_drafter

    d = tmp_path_factory.mktemp("tiny_vocab_mtp")
    target = checkpoints.make_tiny_llama(d / "target", words=WORDS, scale=0.6)
    engine = load_chat(str(target))
    return engine, str(trained_drafter(engine, target, WORDS, steps=100))


@pytest.mark.parametrize("steps", [pytest.param(1, marks=SLOW), 3])
def test_mtp_rows_follow_the_target_law(tiny_mtp, steps):
    engine, drafter = tiny_mtp
    exact_law = exact_distribution(engine)
    counts, proposed, accepted = batch_counts(engine, SpecConfig("mtp", steps, draft_model=drafter))
    assert proposed > 0.5 * N and 0.05 * proposed < accepted < 0.95 * proposed, (accepted, proposed)
    assert chi_square_pvalue(counts, exact_law, N) > ALPHA


def test_a_broken_verifier_is_caught_for_mtp_rows(tiny_mtp, monkeypatch):
    """Must fail: the same test with the rejection sampler resampling from p."""
    engine, drafter = tiny_mtp
    exact_law = exact_distribution(engine)
    BROKEN["resample_from_p"](monkeypatch)
    counts, _, _ = batch_counts(engine, SpecConfig("mtp", 3, draft_model=drafter))
    assert chi_square_pvalue(counts, exact_law, N) < ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True])
def test_mtp_steps_launched_ahead_follow_the_target_law(tiny_mtp, broken, monkeypatch):
    """One request at a time (a batch of one): the second round of each is launched on the
    first one's verdict still in the graph, its drafts sampled on a chain from that verdict.
    Must fail with the rejection sampler resampling from p."""
    engine, drafter = tiny_mtp
    exact_law = exact_distribution(engine)
    if broken:
        BROKEN["resample_from_p"](monkeypatch)
    launched: list[int] = []
    counts, proposed, accepted = batch_counts(engine, SpecConfig("mtp", 1, draft_model=drafter), max_batch=1,
                                              launched=launched)
    assert launched[0] > 0.8 * N and 0.05 * proposed < accepted < 0.95 * proposed, (launched, accepted, proposed)
    assert (chi_square_pvalue(counts, exact_law, N) < ALPHA) == broken
