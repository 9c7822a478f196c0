"""A drafter trained in seconds on the tiny llama and the tiny Gemma 3 (sliding window 8):
accepted far above chance on the target's own outputs, and --spec mtp with it is plain greedy
decoding token for token -- steps 1..5, steps launched ahead and after their verdicts, far past the window.

The tiny llama's drafter is accepted about a third of the time on the outputs it was trained on
(3 drafts a round, 200 steps); an untrained drafter (same shape, step 0) 1-3%; chance is 1/78."""

import json

import pytest

from engines.types import Request, SpecConfig
from engines.mlx_chat.drafter import load_drafter
from engines.mlx_chat.options import MtpOptions
from tests.engines.mlx_chat import checkpoints
from tests.engines.training.trained import prompts

TRAINED_ON = prompts(checkpoints.WORDS)[:4]  # answers it learned from, decoded again by the loop
FRESH = ["a red bird and an old fish see the river", "we know the moon is big"]
MAX_TOKENS = 40


def tokens_of(rounds):
    return [t for r in rounds for t in r.tokens]


def run(engine, prompt, spec=None, max_tokens=MAX_TOKENS):
    return list(engine.generate(Request(prompt=prompt, max_tokens=max_tokens, spec=spec or SpecConfig())))


def acceptance(engine, drafter_dir, prompts_, steps=3):
    proposed = accepted = 0
    for prompt in prompts_:
        rounds = run(engine, prompt, SpecConfig(method="mtp", steps=steps, draft_model=str(drafter_dir)))
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
    return accepted / proposed


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_training_lifts_acceptance_far_above_chance(targets, model, tmp_path):
    engine, _, drafter_dir = targets[model]
    card = json.loads((drafter_dir / "card.json").read_text())
    trained = acceptance(engine, drafter_dir, TRAINED_ON)
    # The same drafter before any training step: the weights it started from.
    untrained = tmp_path / "untrained"
    untrained.mkdir()
    for name in ("config.json",):
        (untrained / name).write_text((drafter_dir / name).read_text())
    import mlx.core as mx
    from engines.mlx_chat.drafter import Drafter, read_args

    mx.random.seed(0)
    fresh = Drafter(read_args(drafter_dir))
    fresh.vocab_ids = load_drafter(drafter_dir).vocab_ids
    fresh.save_weights(str(untrained / "model.safetensors"))
    before = acceptance(engine, untrained, TRAINED_ON)
    chance = 1 / engine.target.vocab_size
    assert trained > 0.2, (trained, before)
    assert before < 0.1 and trained > 5 * before, (trained, before)
    assert card["acceptance_by_depth"][0] > 3 * chance  # held out, teacher-forced: it generalises a little
    assert card["training"]["steps"] == 200


@pytest.mark.parametrize("model", ["llama", "gemma3"])
@pytest.mark.parametrize("ahead", [True, False])
def test_mtp_with_a_trained_drafter_equals_plain_greedy(targets, model, ahead, monkeypatch):
    engine, _, drafter_dir = targets[model]
    monkeypatch.setattr(engine, "mtp_options", MtpOptions(ahead=ahead))
    proposed = accepted = 0
    for prompt in TRAINED_ON[:2] + FRESH:
        plain = tokens_of(run(engine, prompt, max_tokens=56))
        assert len(plain) == 56
        for steps in range(1, 6):
            rounds = run(engine, prompt, SpecConfig(method="mtp", steps=steps, draft_model=str(drafter_dir)), 56)
            assert tokens_of(rounds) == plain, (prompt, steps)
            assert all(r.note is None for r in rounds)
            proposed += sum(r.proposed for r in rounds)
            accepted += sum(r.accepted for r in rounds)
    assert 0 < accepted < proposed  # both branches of verification ran


def test_generations_run_past_the_window(targets):
    engine, _, _ = targets["gemma3"]
    prompt_len = len(engine.prompt_ids(Request(prompt=FRESH[0])))
    assert prompt_len + 56 > 6 * 8


def test_a_drafter_for_another_target_is_refused(targets):
    """The llama drafter on the Gemma 3 target: one line, speculation off for that run."""
    engine, _, _ = targets["gemma3"]
    _, _, llama_drafter = targets["llama"]
    rounds = run(engine, FRESH[0], SpecConfig(method="mtp", steps=3, draft_model=str(llama_drafter)))
    assert rounds[0].note and "trained for another target" in rounds[0].note
    assert tokens_of(rounds) == tokens_of(run(engine, FRESH[0]))



def test_a_drafter_saved_before_input_norms_loads_without_them(targets, tmp_path):
    """Drafters trained before the input norms (a config without `input_norms`) load without
    them and step as they were trained; new ones carry the norms and use them."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    engine, _, trained = targets["llama"]
    new = load_drafter(trained)
    assert new.args.input_norms and "embed_norm.weight" in dict(tree_flatten(new.parameters()))
    before = tmp_path / "before"
    before.mkdir()
    weights = {k: v for k, v in tree_flatten(new.parameters()) if not k.startswith(("embed_norm", "hidden_norm"))}
    mx.save_safetensors(str(before / "model.safetensors"), weights)
    config = json.loads((trained / "config.json").read_text())
    del config["input_norms"]
    (before / "config.json").write_text(json.dumps(config))
    old = load_drafter(before)
    assert not old.args.input_norms and "embed_norm.weight" not in dict(tree_flatten(old.parameters()))
    embedding, hidden = mx.full((1, new.args.hidden_size), 0.1), mx.full((1, new.args.hidden_size), 2.0)
    plain = old.pre_projection(mx.concatenate([embedding, hidden], axis=-1))
    assert mx.allclose(old.inputs(embedding, hidden), plain).item()
    assert not mx.allclose(new.inputs(embedding, hidden), plain).item()
