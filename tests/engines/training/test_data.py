"""The trainer's data: a run stopped while the target answers keeps the answers so far and the
next run answers only the rest (ending with exactly the answers of a run never stopped);
features are kept in float16 and handed to training in float32; acceptance is measured on held-out
answers only, never on the user's text."""

import json

import mlx.core as mx
import pytest

from engines.mlx_chat.engine import ChatEngine
from engines.mlx_chat.drafter import TargetView
from engines.training import data as D
from engines.training.train import TrainConfig, prepare, split
from tests.engines.mlx_chat import checkpoints
from tests.engines.training.trained import write_prompts


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    target = checkpoints.make_tiny_llama(d / "llama")
    return ChatEngine.load(str(target)), target, write_prompts(d / "prompts.json", checkpoints.WORDS, n=40)


def run_prepare(llama, out, should_stop=lambda: False):
    engine, target, prompts = llama
    config = TrainConfig(out=out, prompts_file=str(prompts), answer_tokens=20, seq_len=48, steps=1)
    return prepare(TargetView.of(engine.model), engine.tokenizer, str(target), config, lambda p: None, should_stop)


def test_a_run_stopped_while_answering_resumes_from_the_kept_answers(llama, tmp_path):
    whole, answers, _ = run_prepare(llama, tmp_path / "whole")
    assert answers == 40
    batches = []

    def stop_after_one_batch() -> bool:  # asked before each batch of 32 prompts, then once more
        batches.append(1)
        return len(batches) > 1

    with pytest.raises(KeyboardInterrupt):
        run_prepare(llama, tmp_path / "stopped", stop_after_one_batch)
    kept = json.loads((tmp_path / "stopped" / "data" / "answers.json").read_text())["sequences"]
    assert len(kept) == 32
    resumed, answers, _ = run_prepare(llama, tmp_path / "stopped")
    assert answers == 40
    assert mx.array_equal(resumed.tokens, whole.tokens).item()
    assert mx.array_equal(resumed.labels, whole.labels).item()


def test_states_are_kept_in_float16_and_trained_on_in_float32(llama, tmp_path):
    feats, _, _ = run_prepare(llama, tmp_path / "out")
    assert feats.hidden.dtype == feats.keys.dtype == feats.values.dtype == mx.float16
    rows = feats.rows([0, 1])
    assert rows.hidden.dtype == rows.keys.dtype == rows.values.dtype == mx.float32
    assert mx.array_equal(rows.hidden, feats.hidden[:2].astype(mx.float32)).item()


def test_held_out_rows_are_answers_only():
    train, held = split(100, 20, 0.1, seed=0)
    assert len(held) == 2 and all(r < 20 for r in held)
    assert sorted(train + held) == list(range(100))
    train, held = split(100, 0, 0.1, seed=0)  # no answers: text rows are held out
    assert len(held) == 10 and sorted(train + held) == list(range(100))
