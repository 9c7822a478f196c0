"""Lossless at T>0 with the MTP proposer, through the real round loop: the distribution of
the first tokens of many seeded runs equals the target's own (exact probabilities from the
target), with drafts sampled from the drafter's full distribution q and verified by the
foundation's rejection sampling (accept with min(1, p/q), else resample from max(p - q, 0)).
The same test run with a lossy acceptance rule must fail, or it would prove nothing."""

from collections import Counter
import numpy as np
import pytest
from tests.engines.chat import load_chat

mx = pytest.importorskip("mlx.core")

from engines.types import Request, Sampling, SpecConfig  # noqa: E402
from engines.speculative.sampling import target_probs  # noqa: E402
from tests.engines.mlx_chat.gemma4.replay import replay_factory  # noqa: E402
from tests.engines.broken_verifiers import BROKEN, detectable  # noqa: E402
from tests.stats import chi_square_pvalue  # noqa: E402

PROMPT = "w10 w20 w30"
LENGTH = 3  # counted: t1 from the prefill, t2 and t3 drafted in the first round
MAX_TOKENS = LENGTH + 1  # so the first decode round may draft 2 (it keeps one for the target)
SAMPLING = dict(temperature=0.5, top_k=3)  # 27 possible sequences: exact probabilities
N = 150  # ample for the quick tests: the lossy rule scores p ~ 1e-35 at this size
# The slow tests, run with each broken verifier too: resample-from-p moves about
# error_rate * p(x)(1 - p(x)) of mass (x the over-estimated token), which needs this many runs
# (p < 1e-7 at 1, 3 and 5 drafts, where the lossless loop scored p > 0.3).
N_SLOW = 1000


@pytest.fixture(scope="module")
def setup(edge_pair):
    engine = load_chat(str(edge_pair.target))
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    memo: dict[tuple[int, ...], np.ndarray] = {}

    def oracle(context: tuple[int, ...]) -> np.ndarray:
        """The target's next-token probabilities after `context`, as the engine forms them."""
        if context not in memo:
            logits = np.array(engine.model(mx.array(context)[None])[0, -1], dtype=np.float64)
            memo[context] = target_probs(logits, **SAMPLING)
        return memo[context]

    exact = {}
    first = oracle(tuple(ids))
    for a in np.flatnonzero(first):
        pa = oracle(tuple(ids) + (int(a),))
        for b in np.flatnonzero(pa):
            pb = oracle(tuple(ids) + (int(a), int(b)))
            for c in np.flatnonzero(pb):
                exact[(int(a), int(b), int(c))] = first[a] * pa[b] * pb[c]
    assert len(exact) == 27 and abs(sum(exact.values()) - 1) < 1e-9
    return engine, oracle, exact


def sample_runs(engine, pair, oracle, n, steps=2, made=None, early=None):
    """`early`: gets the number of rounds launched before the last verdict was read."""
    factory = replay_factory(oracle=oracle, error_rate=0.5, temperature=SAMPLING["temperature"])
    made = [] if made is None else made
    engine.mtp_group = lambda *args: made.append(factory(*args)) or made[-1]
    counts, proposed, accepted = Counter(), 0, 0
    try:
        for seed in range(n):
            request = Request(prompt=PROMPT, max_tokens=max(MAX_TOKENS, steps + 2),
                              sampling=Sampling(seed=seed, **SAMPLING),
                              spec=SpecConfig(method="mtp", steps=steps, draft_model=str(pair.assistant)))
            rounds = list(engine.generate(request))
            assert all(r.note is None for r in rounds)
            for r in rounds[1:]:  # accepted drafts + exactly one target token, unless clipped
                assert r.finish is not None or len(r.tokens) == r.accepted + 1
            counts[tuple(t for r in rounds for t in r.tokens)[:LENGTH]] += 1
            proposed += sum(r.proposed for r in rounds)
            accepted += sum(r.accepted for r in rounds)
            if early is not None:
                early.append(sum(r.launched_early for r in rounds))
    finally:
        engine.__dict__.pop("mtp_group", None)
    return counts, proposed, accepted


@pytest.mark.parametrize("steps", [2, 1])
def test_mtp_sampling_is_lossless(setup, edge_pair, steps):
    """steps=2: the first decode round drafts both counted tokens. steps=1: a second round
    usually follows, launched on the first one's verdict while it was still in the graph (its
    chain drafted from that verdict), so the sampled drafts and q of a chain drafted ahead are
    verified too."""
    engine, oracle, exact = setup
    early = []
    counts, proposed, accepted = sample_runs(engine, edge_pair, oracle, N, steps, early=early)
    assert 0.3 * proposed < accepted < proposed  # both branches of rejection sampling ran
    assert chi_square_pvalue(counts, exact, N) > 1e-3
    if steps == 1:
        assert sum(early) > N / 3


def test_the_test_rejects_a_lossy_acceptance_rule(setup, edge_pair, monkeypatch):
    """Accept every draft (a token-equality-free 'always yes'): the output follows q, not p."""
    from engines.mlx_chat import sampling

    engine, oracle, exact = setup
    monkeypatch.setattr(sampling, "lossless_accept", lambda p_draft, q_draft, u: mx.ones_like(p_draft, dtype=mx.bool_))
    counts, _, _ = sample_runs(engine, edge_pair, oracle, N)
    assert chi_square_pvalue(counts, exact, N) < 1e-6


# -- 3 and 5 drafts per round, and the broken verifiers ----------------------------------------


def check_lossless(engine, pair, oracle, exact, steps):
    counts, proposed, accepted = sample_runs(engine, pair, oracle, N_SLOW, steps)
    assert 0.3 * proposed < accepted < proposed
    assert chi_square_pvalue(counts, exact, N_SLOW) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("steps", [1, 3, 5])
def test_mtp_multi_draft_rounds_are_lossless(setup, edge_pair, steps):
    engine, oracle, exact = setup
    check_lossless(engine, edge_pair, oracle, exact, steps)


BROKEN_RUNS = [(v, k) for v in BROKEN for k in (1, 3, 5) if v == "skip_bonus" or detectable(v, k, point_mass=False)]


@pytest.mark.slow
@pytest.mark.parametrize("variant,steps", BROKEN_RUNS)
def test_mtp_sampling_fails_a_broken_verifier(setup, edge_pair, variant, steps, monkeypatch):
    engine, oracle, exact = setup
    BROKEN[variant](monkeypatch)
    with pytest.raises(AssertionError):
        check_lossless(engine, edge_pair, oracle, exact, steps)
