"""Exact rollback in the batch's slot table (sliding windows far past the window) and the MLX
sampling maths against the NumPy reference in engines/speculative/sampling.py."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from engines.types import Sampling
from engines.mlx_chat import sampling as mxs
from engines.speculative import sampling as ref
from tests.engines.mlx_chat.conftest import WINDOW


def plain_logits(model, cache, prompt, tokens):
    """Logits after each token, decoding one token at a time (what plain decoding computes)."""
    model(mx.array([prompt]), cache=cache)
    out = []
    for t in tokens:
        out.append(model(mx.array([[t]]), cache=cache)[0, -1])
    return mx.stack(out)


def speculative_logits(model, prompt, tokens, rng, min_slots=4):
    """The same logits through the batch's one-row slot-table cache, every step feeding the true
    token plus 0..7 junk drafts (as a verify forward does; 0 = a plain round), keeping the first
    position's logits and only that slot (the junk's slots die), compacting once `min_slots`
    columns are dead."""
    from engines.batch.cache import BatchCache

    cache = BatchCache(model, 1)
    cache.begin(len(prompt))
    model(mx.array([prompt]), cache=cache.layers)
    cache.settle([len(prompt)])
    out = []
    for t in tokens:
        junk = rng.integers(2, 70, size=int(rng.integers(0, 8))).tolist()
        cache.begin(1 + len(junk))
        out.append(model(mx.array([[t, *junk]]), cache=cache.layers)[0, 0])
        mx.eval(out[-1])
        cache.settle([1])
        cache.compact_if_sparse(min_slots=min_slots)
    return mx.stack(out), cache


@pytest.fixture(scope="module")
def gemma3(gemma3_dir):
    model, _ = load(gemma3_dir)
    return model


def test_slot_table_rollback_is_exact_far_past_the_window(gemma3):
    rng = np.random.default_rng(0)
    prompt = rng.integers(2, 70, size=5).tolist()
    tokens = rng.integers(2, 70, size=12 * WINDOW).tolist()
    want = plain_logits(gemma3, make_prompt_cache(gemma3), prompt, tokens)
    got, cache = speculative_logits(gemma3, prompt, tokens, rng)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=2e-4, rtol=1e-4)
    assert cache.tables[0].compactions + cache.tables[-1].compactions > 3  # the window's table dropped old slots


def test_layers_past_the_window_read_only_the_window(gemma3):
    """Never compacted, the window's table keeps every slot; its layers read from the first
    column the window can still see (SlotTable.first_read), and the logits stay plain decoding's."""
    rng = np.random.default_rng(1)
    prompt = rng.integers(2, 70, size=5).tolist()
    tokens = rng.integers(2, 70, size=6 * WINDOW).tolist()
    want = plain_logits(gemma3, make_prompt_cache(gemma3), prompt, tokens)
    got, cache = speculative_logits(gemma3, prompt, tokens, rng, min_slots=10**6)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=2e-4, rtol=1e-4)
    windowed = next(t for t in cache.tables if t.window)
    assert windowed.compactions == 0
    cache.begin(1)
    assert windowed.first > len(prompt) + 4 * WINDOW  # the columns the window has left are not read


def test_mlx_lm_rotating_cache_trim_is_not_exact_past_the_window(gemma3):
    """Why the batch keeps its own slot table: the same procedure on mlx-lm's own caches goes wrong once
    verify chunks and plain one-token rounds mix past the window (the one-token path keeps
    the rolled-back tail as live entries)."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(2, 70, size=5).tolist()
    tokens = rng.integers(2, 70, size=4 * WINDOW).tolist()
    want = plain_logits(gemma3, make_prompt_cache(gemma3), prompt, tokens)
    cache = make_prompt_cache(gemma3)
    model = gemma3
    model(mx.array([prompt]), cache=cache)
    got = []
    for t in tokens:
        junk = rng.integers(2, 70, size=int(rng.integers(0, 4))).tolist()
        got.append(model(mx.array([[t, *junk]]), cache=cache)[0, 0])
        for c in cache:
            c.trim(len(junk)) if junk else None
    assert not np.allclose(np.array(mx.stack(got)), np.array(want), atol=1e-3)


SETTINGS = [
    Sampling(temperature=1.0),
    Sampling(temperature=0.7, top_k=5),
    Sampling(temperature=1.3, top_p=0.8),
    Sampling(temperature=0.9, top_k=12, top_p=0.6),
    Sampling(temperature=0.5, top_p=0.7),  # temperature first would keep other tokens here
    Sampling(temperature=1.2, min_p=0.08),
    Sampling(temperature=0.8, top_p=0.9, min_p=0.02, top_k=9),
]


@pytest.mark.parametrize("s", SETTINGS, ids=str)
def test_target_probs_equal_the_reference(s):
    """The MLX distribution (mlx-lm's filter functions) equals the NumPy specification of
    mlx-lm's make_sampler, written independently."""
    logits = np.random.default_rng(1).normal(0, 3, size=(6, 50)).astype(np.float32)
    got = np.array(mxs.target_probs(mx.array(logits), s))
    want = ref.target_probs(logits, s.temperature, s.top_p, s.top_k, s.min_p)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("point_mass", [True, False])
def test_residuals_equal_the_reference(point_mass):
    rng = np.random.default_rng(2)
    p = ref.target_probs(rng.normal(0, 2, size=(5, 30)), 1.0)
    q = None if point_mass else ref.target_probs(rng.normal(0, 2, size=(4, 30)), 1.0)
    drafts = [int(x) for x in rng.integers(0, 30, size=4)]
    got = np.array(mxs.residual_probs(mx.array(p[:4], mx.float32), None if q is None else mx.array(q, mx.float32), mx.array(drafts)))
    for i, x in enumerate(drafts):
        want = ref.residual_distribution(p[i], None if q is None else q[i], x)
        np.testing.assert_allclose(got[i], want, atol=1e-5)


def test_rejection_verify_accepts_with_probability_min_1_p_over_q():
    """Per-position acceptance frequency over many rounds equals min(1, p(x)/q(x))."""
    rng = np.random.default_rng(3)
    p = ref.target_probs(rng.normal(0, 1.5, size=(4, 8)), 1.0)
    q = ref.target_probs(rng.normal(0, 1.5, size=(3, 8)), 1.0)
    drafts = [int(np.argmax(q[i])) for i in range(3)]
    mx.random.seed(0)
    pm, qm, dm = mx.array(p, mx.float32), mx.array(q, mx.float32), mx.array(drafts)
    n = 3000
    accepts = mx.stack([mxs.rejection_verify(pm, qm, dm).accept for _ in range(n)])
    freq = np.array(accepts).mean(axis=0)
    want = np.minimum(1.0, p[np.arange(3), drafts] / q[np.arange(3), drafts])
    np.testing.assert_allclose(freq, want, atol=4 * np.sqrt(0.25 / n))


@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_verdict_in_graph_equals_the_host_verdict(k):
    """What depth-2 overlap drafts from (the verdict still in the graph) is what the loop then
    reads on the host (verify_greedy / verify_sampled), for every accepted count."""
    from engines.speculative.verify import verify_greedy, verify_sampled

    rng = np.random.default_rng(k)
    seen = set()
    for _ in range(60):
        drafts = rng.integers(0, 4, size=k)
        # T=0: argmax agrees with a random prefix of the drafts
        argmax = rng.integers(0, 4, size=k + 1)
        cut = rng.integers(0, k + 1)
        argmax[:cut] = drafts[:cut]
        accepted, token = mxs.verdict_in_graph(mx.array(drafts, dtype=mx.uint32), argmax=mx.array(argmax))
        want = verify_greedy(drafts.tolist(), argmax.tolist())
        assert (int(accepted.item()), token.tolist()) == (want.accepted, want.tokens[-1:])
        seen.add(want.accepted)
        if k == 0:
            continue
        # T>0: accept flags, residual samples, bonus
        accept = rng.random(k) < 0.7
        residual, bonus = rng.integers(10, 20, size=k), int(rng.integers(20, 30))
        verdict = mxs.SampledVerdict(mx.array(accept), mx.array(residual), mx.array(bonus))
        accepted, token = mxs.verdict_in_graph(mx.array(drafts, dtype=mx.uint32), sampled=verdict)
        want = verify_sampled(drafts.tolist(), accept.tolist(), residual.tolist(), bonus)
        assert (int(accepted.item()), token.tolist()) == (want.accepted, want.tokens[-1:])
    assert seen == set(range(k + 1))
    # a plain round's sample
    accepted, token = mxs.verdict_in_graph(mx.array([], dtype=mx.uint32), token=mx.array([5]))
    assert (int(accepted.item()), token.tolist()) == (0, [5])
