"""Lossless at T>0: the distribution of generated sequences equals the target's exact sequence
distribution, for plain sampling and for both proposers -- and a lossy acceptance rule
(threshold acceptance) fails the very same test, so the test has the power to tell.

Tiny vocabulary (4 words) and top_k=3: 27 possible 3-token outputs, whose exact
probabilities we compute from the model's own logits with the NumPy reference maths.
max_tokens=3 gives a prefill token and one round with one draft (+ bonus or residual)."""

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from engines.types import Request, Sampling, SpecConfig
from engines.speculative.sampling import target_probs
from tests.engines.mlx_chat import checkpoints
from tests.engines.broken_verifiers import BROKEN, detectable
from tests.stats import chi_square_pvalue
from tests.engines.chat import load_chat

WORDS = ["cat", "dog", "sun", "moon"]
# Chosen so that the n-gram draft after each likely first token has a moderate probability
# under the target (about 1/2): a wrong residual then moves p(x)(1 - p(x)) of mass, which the
# test must see. Picked among 300 random prompts of 8-13 words by enumerating the law of the
# first three tokens under the correct rule and under resample-from-p at 1 draft: this one gives
# a chi-square noncentrality of 94 at N = 500 (power > 0.999 at p < 1e-3); the earlier prompt
# "cat dog sun moon cat dog sun moon moon sun dog cat" gave 16 (power 0.14, it passed).
PROMPT = "dog dog moon sun dog cat cat sun"
SAMPLING = Sampling(temperature=1.0, top_k=3)
N = 500


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_vocab")
    target = checkpoints.make_tiny_llama(d / "target", words=WORDS, scale=0.6)
    draft = checkpoints.perturbed_copy(target, d / "draft", noise=0.6)
    return load_chat(str(target), draft_model=str(draft))


def exact_distribution(engine, n_tokens=3):
    """P(t1..tn) = prod target_probs(logits | prefix), by enumerating prefixes."""
    prompt = engine.prompt_ids(Request(prompt=PROMPT, ignore_chat_template=True))
    dist = {(): 1.0}
    for _ in range(n_tokens):
        nxt = {}
        for prefix, pr in dist.items():
            logits = np.array(engine.model(mx.array([prompt + list(prefix)]))[0, -1])
            p = target_probs(logits, SAMPLING.temperature, SAMPLING.top_p, SAMPLING.top_k)
            for t in np.nonzero(p)[0]:
                nxt[prefix + (int(t),)] = pr * p[t]
        dist = nxt
    return dist


def sample_counts(engine, spec, seed):
    mx.random.seed(seed)
    counts = Counter()
    proposed = accepted = 0
    for _ in range(N):
        rounds = list(engine.generate(Request(prompt=PROMPT, max_tokens=3, spec=spec, sampling=SAMPLING, ignore_chat_template=True)))
        counts[tuple(t for r in rounds for t in r.tokens)] += 1
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
    return counts, proposed, accepted


def threshold_accept(p_draft, q_draft, u):
    """A lossy rule some servers use: accept any draft the target finds plausible (>= 10%)."""
    return p_draft >= 0.1


@pytest.fixture(scope="module")
def exact(tiny):
    return exact_distribution(tiny)


@pytest.mark.parametrize("method", ["off", "ngram", "draft"])
def test_sampled_sequences_match_the_target_distribution(tiny, exact, method):
    spec = SpecConfig(method=method, steps=1)
    counts, proposed, accepted = sample_counts(tiny, spec, seed=1)
    if method != "off":
        assert proposed > 0.5 * N and 0.03 * proposed < accepted < 0.95 * proposed
    assert chi_square_pvalue(counts, exact, N) > 1e-3


def test_a_lossy_acceptance_rule_fails_the_same_test(tiny, exact, monkeypatch):
    from engines.mlx_chat import sampling

    monkeypatch.setattr(sampling, "lossless_accept", threshold_accept)
    counts, proposed, _ = sample_counts(tiny, SpecConfig(method="ngram", steps=1), seed=1)
    assert proposed > 0.5 * N
    assert chi_square_pvalue(counts, exact, N) < 1e-3


# -- multi-draft rounds: 1, 3 and 5 drafts per round, and the broken verifiers --------------------

MULTI = [(method, steps) for method in ("ngram", "draft") for steps in (1, 3, 5)]


def check_lossless(engine, exact, method, steps):
    """The first three tokens follow the target's law, and every decode round that ran to its
    end emitted its accepted drafts plus exactly one target token."""
    spec = SpecConfig(method=method, steps=steps)
    mx.random.seed(2)
    counts, proposed, accepted = Counter(), 0, 0
    for _ in range(N):
        request = Request(prompt=PROMPT, max_tokens=steps + 2, spec=spec, sampling=SAMPLING, ignore_chat_template=True)
        rounds = list(engine.generate(request))
        for r in rounds[1:]:
            assert r.finish is not None or len(r.tokens) == r.accepted + 1
        counts[tuple(t for r in rounds for t in r.tokens)[:3]] += 1
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
    assert proposed > 0.5 * N and 0.03 * proposed < accepted < 0.95 * proposed
    assert chi_square_pvalue(counts, exact, N) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("method,steps", MULTI)
def test_multi_draft_rounds_keep_the_target_distribution(tiny, exact, method, steps):
    check_lossless(tiny, exact, method, steps)


BROKEN_RUNS = [(v, m, k) for v in BROKEN for m, k in MULTI
               if v == "skip_bonus" or detectable(v, k, point_mass=m == "ngram")]


@pytest.mark.slow
@pytest.mark.parametrize("variant,method,steps", BROKEN_RUNS)
def test_the_same_test_fails_a_broken_verifier(tiny, exact, variant, method, steps, monkeypatch):
    BROKEN[variant](monkeypatch)
    with pytest.raises(AssertionError):
        check_lossless(tiny, exact, method, steps)
