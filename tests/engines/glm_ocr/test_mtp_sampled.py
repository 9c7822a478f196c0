"""Lossless at T > 0 with GLM-OCR's MTP drafts: the joint law of the first two and of the
first three tokens of the real OCR loop equals the target's exact law, at 1, 3 and 5 drafts per round -- and four
deliberately broken verifiers, injected in place of the pure verification function, fail the
very same test (kept here so the test's power is visible).

The MTP layer (trained for chains; its first draft accepted often but not always at T = 0.5)
drafts greedily, so its proposal is a point mass q = one-hot(draft): accept with probability
p(x), resample from normalise(max(0, p - q)) = p without x. top_k = 3 keeps the first three tokens to at most
27 sequences, whose exact probabilities come from the target's own logits.

Each run asks max_tokens = K + 2, so the first verify round really offers K drafts (the
schedule never drafts past max_tokens); the first token is the prefill's own sample, the next
two come from that round. Where a broken verifier cannot change the first three tokens it is
not listed: the draft distribution of position i+1 needs a second draft (K >= 3). Skipping the
bonus token breaks the round's contract -- accepted drafts plus one target token -- which every
run below is held to, and which the batch's K/V bookkeeping checks at the next forward."""

from collections import Counter

import numpy as np
import pytest

from engines.types import Request, Sampling, SpecConfig
from engines.glm_ocr.engine import OcrEngine
from engines.speculative.sampling import target_probs
from engines.speculative.verify import Verdict
from tests.stats import chi_square_pvalue

TEMPERATURE, TOP_K = 0.5, 3
RUNS = 150  # per case: enough for every broken verifier below to fail at p < 1e-3
N_TOKENS = 3


@pytest.fixture(scope="module")
def engine(trained_glm_ocr):
    e = OcrEngine.load(trained_glm_ocr[0], runtime="torch", cache_length=320)
    e.repetition = None
    return e


@pytest.fixture(scope="module")
def image(trained_glm_ocr):
    return trained_glm_ocr[1][3]  # the image whose first drafts the target accepts most often


@pytest.fixture(scope="module")
def exact(engine, image):
    """P(t1 t2 t3) = product of the target's probabilities, by enumerating prefixes (a
    sequence ends early at an end-of-sequence token)."""
    prompt = engine._prompt(Request(kind="ocr", image=str(image)))
    engine.runtime.reset()
    hiddens = engine.prefill(prompt)
    eos = set(engine.config.eos_token_ids)

    def probs(prefix):
        if not prefix:
            return target_probs(engine.runtime.logits(hiddens[-1:]), TEMPERATURE, 1.0, TOP_K)[0]
        rows = engine.forward(list(prefix), len(prompt.ids), prompt.positions)
        return target_probs(engine.runtime.logits(rows[-1:]), TEMPERATURE, 1.0, TOP_K)[0]

    law, open_prefixes = {}, {(): 1.0}
    for _ in range(N_TOKENS):
        grown = {}
        for prefix, pr in open_prefixes.items():
            p = probs(prefix)
            for t in np.nonzero(p)[0]:
                seq = prefix + (int(t),)
                (law if int(t) in eos else grown)[seq] = pr * p[t]
        open_prefixes = grown
    law.update(open_prefixes)
    return law


def first(law_or_counts: dict, n: int) -> Counter:
    """The law (or counts) of the first n tokens, from those of the first three."""
    out = Counter()
    for seq, v in law_or_counts.items():
        out[seq[:n]] += v
    return out


def matches_the_target(counts: Counter, exact: dict) -> bool:
    """Chi-square of the first two tokens and of the first three, each at p > 1e-3: two
    tokens give a defect at the first verified position more power (fewer cells); the third
    token is where a missing bonus shows (K = 1)."""
    return all(chi_square_pvalue(first(counts, n), first(exact, n), RUNS) > 1e-3 for n in (2, 3))


def sample(engine, image, drafts: int, compose: bool = False, sources: Counter | None = None):
    """First three tokens of RUNS independent runs (each its own seed). `compose`: MTP with
    n-gram lookup beside it (--with-ngram); `sources` counts who drafted each verify round."""
    counts, proposed, first_accepted, whole_rounds = Counter(), 0, 0, True
    eos = set(engine.config.eos_token_ids)
    for seed in range(RUNS):
        request = Request(kind="ocr", image=str(image), max_tokens=drafts + 2,
                          spec=SpecConfig(method="mtp", steps=drafts, compose_ngram=compose),
                          sampling=Sampling(temperature=TEMPERATURE, top_k=TOP_K, seed=seed))
        rounds = list(engine.generate(request))
        if sources is not None:
            sources.update(r.draft_source for r in rounds if r.proposed)
        tokens = [t for r in rounds for t in r.tokens]
        whole_rounds &= all(len(r.tokens) == r.accepted + 1 for r in rounds[1:] if r.finish is None)
        first = []
        for t in tokens[:N_TOKENS]:
            first.append(t)
            if t in eos:
                break
        counts[tuple(first)] += 1
        proposed += rounds[1].proposed if len(rounds) > 1 else 0
        first_accepted += len(rounds) > 1 and rounds[1].accepted > 0
    return counts, proposed, first_accepted, whole_rounds


@pytest.mark.parametrize("drafts", [1, 3, 5])
def test_the_first_tokens_follow_the_target_law(engine, image, exact, drafts):
    counts, proposed, first_accepted, whole_rounds = sample(engine, image, drafts)
    assert whole_rounds
    assert proposed > 0.8 * RUNS * min(drafts, 2)  # the first verify round really offered drafts
    assert 0.2 * RUNS < first_accepted < 0.95 * RUNS, first_accepted  # the first draft: often, not always
    assert matches_the_target(counts, exact)


@pytest.mark.parametrize("drafts", [2, 5])
def test_composed_drafting_keeps_the_target_law(engine, image, exact, monkeypatch, drafts):
    """--with-ngram (ComposedProposer, priced flat so that which source drafts does not
    hang on this machine's timing): the same law. The first tokens of this model never recur
    in the prompt, so the first verify round drafts from the chain; rounds drafted from n-gram
    come later and are held to the target's law position by position in test_composed.py.
    Shown to fail with the sampler broken (resample_from_p in rejection_verify) when it was
    written, and kept failing below."""
    from engines.speculative import composed

    monkeypatch.setattr(composed, "MEASURED", False)
    sources = Counter()
    counts, proposed, _, whole_rounds = sample(engine, image, drafts, compose=True, sources=sources)
    assert whole_rounds
    assert proposed > 0.8 * RUNS * min(drafts, 2)
    assert sources["mtp"], sources
    assert matches_the_target(counts, exact)


# ---------------------------------------------------------------- broken verifiers (must fail)


def broken_verifier(defect: str):
    """rejection_verify (engines/speculative/sampling.py, the NumPy verifier OCR calls) with one
    of the defects of tests/engines/broken_verifiers.py (which breaks the MLX chat verifier).
    With a point-mass proposal made explicit, q of the next position is a detectable defect."""

    def verify(p, q, drafts, rng):
        if q is None:  # the MTP drafts greedily: a point-mass proposal
            q = np.zeros((len(drafts), p.shape[-1]))
            q[np.arange(len(drafts)), drafts] = 1.0
        for i, x in enumerate(drafts):
            qi = q[min(i + 1, len(drafts) - 1)] if defect == "draft_q_of_next_position" else q[i]
            # accept with min(1, p/q), or with min(1, q/p) when that is the defect
            if (rng.random() * p[i, x] < qi[x]) if defect == "accept_q_over_p" else (rng.random() * qi[x] < p[i, x]):
                continue
            residual = p[i] if defect == "resample_from_p" else np.maximum(p[i] - qi, 0.0)
            residual = residual / residual.sum() if residual.sum() > 0 else p[i]
            return Verdict(i, list(drafts[:i]) + [int(rng.choice(len(residual), p=residual))])
        if defect == "skip_bonus" and drafts:
            return Verdict(len(drafts), list(drafts))
        return Verdict(len(drafts), list(drafts) + [int(rng.choice(p.shape[-1], p=p[len(drafts)]))])

    return verify


BROKEN = [("resample_from_p", k) for k in (1, 3, 5)] + [("accept_q_over_p", k) for k in (1, 3, 5)] \
    + [("skip_bonus", 1)] + [("draft_q_of_next_position", k) for k in (3, 5)]


@pytest.mark.slow  # 9 cases x RUNS runs of the real loop
@pytest.mark.parametrize("defect, drafts", BROKEN)
def test_a_broken_verifier_fails_the_same_test(engine, image, exact, monkeypatch, defect, drafts):
    monkeypatch.setattr("engines.glm_ocr.batch.rejection_verify", broken_verifier(defect))
    try:
        counts, _, _, whole_rounds = sample(engine, image, drafts)
    except AssertionError:  # the batch's own check: a row's K/V kept as many rows as it emitted tokens
        assert defect == "skip_bonus"
        return
    assert not (whole_rounds and matches_the_target(counts, exact))


@pytest.mark.slow
@pytest.mark.parametrize("defect", ["resample_from_p", "accept_q_over_p"])
def test_a_broken_verifier_fails_the_composed_law(engine, image, exact, monkeypatch, defect):
    from engines.speculative import composed

    monkeypatch.setattr(composed, "MEASURED", False)
    monkeypatch.setattr("engines.glm_ocr.batch.rejection_verify", broken_verifier(defect))
    counts, _, _, whole_rounds = sample(engine, image, 2, compose=True)
    assert not (whole_rounds and matches_the_target(counts, exact))
