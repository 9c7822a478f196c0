"""A drafter that reads a lower target layer beside the final state (EAGLE-3's fused
features, `--feature-layers`), trained on the tiny llama and Gemma 3: accepted far above chance,
--spec mtp with it is plain greedy decoding token for token, the tap leaves the target's
parameters and plain decoding as they were, and a layer the target lacks is one line."""

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from engines.types import EngineError, SpecConfig
from engines.mlx_chat.drafter import TargetView, load_drafter, read_args
from tests.engines.mlx_chat import checkpoints
from tests.engines.training.test_trained_drafter import FRESH, TRAINED_ON, acceptance, run, tokens_of
from tests.engines.training.trained import trained_drafter
from tests.engines.chat import load_chat


@pytest.fixture(scope="module")
def fused(targets):
    """name -> a drafter trained reading the target's layer 0 beside its final state."""
    return {name: trained_drafter(engine, target_dir, checkpoints.WORDS, feature_layers=[0])
            for name, (engine, target_dir, _) in targets.items()}


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_a_fused_drafter_is_accepted_and_lossless(targets, fused, model):
    engine = targets[model][0]
    assert read_args(fused[model]).feature_layers == [0]
    assert acceptance(engine, fused[model], TRAINED_ON) > 0.2
    proposed = accepted = 0
    for prompt in TRAINED_ON[:2] + FRESH:
        plain = tokens_of(run(engine, prompt, max_tokens=48))
        for steps in (1, 3):
            rounds = run(engine, prompt, SpecConfig(method="mtp", steps=steps, draft_model=str(fused[model])), 48)
            assert tokens_of(rounds) == plain, (prompt, steps)
            assert all(r.note is None for r in rounds)
            proposed += sum(r.proposed for r in rounds)
            accepted += sum(r.accepted for r in rounds)
    assert 0 < accepted < proposed


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_the_features_are_the_tapped_layer_then_the_final_state(targets, fused, model):
    engine = targets[model][0]
    names_before = [k for k, _ in tree_flatten(engine.model.parameters())]
    drafter = load_drafter(fused[model]).attach(TargetView.of(engine.model))
    view = drafter.target
    assert view.feature_layers == (0,) and view.feature_size == 2 * view.hidden_size
    assert [k for k, _ in tree_flatten(engine.model.parameters())] == names_before  # the tap adds no parameter
    tokens = mx.array([[3, 5, 7, 9, 11]])
    logits, features = view.forward(tokens, None)
    plain_logits, final = TargetView.of(engine.model).forward(tokens, None)
    d = view.hidden_size
    assert features.shape == (1, 5, 2 * d)
    assert mx.array_equal(features[..., d:], final).item() and mx.array_equal(logits, plain_logits).item()
    assert not mx.allclose(features[..., :d], final).item()
    # the drafter reads the tapped layer: change it and its input changes
    embedding = view.embed(tokens)[0, -1:]
    moved = mx.concatenate([features[0, -1:, :d] + 1.0, features[0, -1:, d:]], axis=-1)
    assert not mx.allclose(drafter.inputs(embedding, features[0, -1:]), drafter.inputs(embedding, moved)).item()


def test_a_layer_the_target_lacks_is_one_line(targets):
    engine = targets["llama"][0]
    layers = len(engine.model.model.layers)
    with pytest.raises(EngineError, match=r"layers 0\.\.\d+ below its last"):
        TargetView.of(engine.model, [layers - 1])


def test_fused_rows_in_a_batch_get_their_lone_tokens_and_acceptance(targets, fused):
    """The batch's target forward returns the tapped layer too, each row drafts from its own."""
    from engines.batch.engine import BatchEngine
    from tests.engines.batch.test_batch_equals_lone import run_batch
    from tests.engines.batch.test_batch_mtp import lone_rounds, mtp_requests, summary

    engine = targets["llama"][0]
    reqs = mtp_requests(str(fused["llama"]))
    alone = [summary(lone_rounds(engine, r)) for r in reqs]
    got, sizes = run_batch(BatchEngine(engine, max_batch=4, budget=None, verifies_ahead=False), reqs, join_late=2)
    assert max(sizes) == 4
    for i in range(len(reqs)):
        assert summary(got[i]) == alone[i], i
    mtp_rounds = [r for i in (0, 2, 4, 5) for r in got[i]]
    proposed, accepted = sum(r.proposed for r in mtp_rounds), sum(r.accepted for r in mtp_rounds)
    assert 0.15 * proposed < accepted < proposed, (accepted, proposed)
    assert not any(r.note for r in mtp_rounds)


def test_a_fused_drafter_keeps_the_target_distribution(tmp_path_factory):
    """T>0: the exact-law test of test_trained_sampled.py (which shows a lossy rule failing it)
    with a drafter that reads the tapped layer."""
    from tests.engines.mlx_chat.test_lossless_sampled import WORDS, exact_distribution
    from tests.engines.training.test_trained_sampled import N, sample
    from tests.stats import chi_square_pvalue

    d = tmp_path_factory.mktemp("tiny_vocab_fused")
    target = checkpoints.make_tiny_llama(d / "target", words=WORDS, scale=0.6)
    engine = load_chat(str(target))
    drafter = trained_drafter(engine, target, WORDS, steps=100, feature_layers=[0])
    counts, proposed, accepted = sample(engine, drafter, 3)
    assert proposed > 0.5 * N and 0.05 * proposed < accepted < 0.95 * proposed, (accepted, proposed)
    assert chi_square_pvalue(counts, exact_distribution(engine), N) > 1e-3
