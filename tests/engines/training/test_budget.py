"""--minutes bounds the whole run: preparing the data (answering, teacher forcing), training and
the final measure. On the tiny llama with more text than its preparation share can teacher-force,
`specscope drafter train --minutes M` says up front what it will do, forces only what fits,
trains, and ends within M minutes plus TOLERANCE_S -- the clock is checked between steps and
between batches, so a run overshoots by about one of them, the final measure's estimate's error
and the model's loading, each well under a second here; the rest is room for a loaded machine
(the tests run niced beside others). Not a test of speed: a slower machine forces and trains
less in the same time."""

import json
import random
import time

import pytest

from app.cli.main import main
from engines.training.preparation import forcing_order
from tests.engines.mlx_chat import checkpoints
from tests.engines.training.trained import write_prompts

pytestmark = pytest.mark.alone  # it holds runs to minutes of wall time: nothing beside it (scripts/test)
MINUTES = 0.4  # 24 s: enough that preparing and training both get their share on a slow 2-core machine
TOLERANCE_S = 6.0
WORDS = 1_600_000  # ~25,600 segments of 64 tokens: on the tiny llama several times what 12 s can force


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("budget")
    text = d / "notes.txt"
    rng = random.Random(0)
    text.write_text(" ".join(rng.choice(checkpoints.WORDS) for _ in range(WORDS)))
    return checkpoints.make_tiny_llama(d / "llama"), write_prompts(d / "prompts.json", checkpoints.WORDS), text


def test_minutes_bound_preparation_and_training_together(llama, tmp_path, capsys):
    target, prompts, text = llama
    out = tmp_path / "drafter"
    started = time.perf_counter()
    code = main(["drafter", "train", "--model", str(target), "--prompts", str(prompts), "--data", str(text),
                 "--answer-tokens", "20", "--seq-len", "64", "--minutes", str(MINUTES), "--eval-every", "50",
                 "--no-register", "--out", str(out)])
    took = time.perf_counter() - started
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert took <= 60 * MINUTES + TOLERANCE_S, (took, err[-2000:])
    assert f"at most {MINUTES:g} min in all" in err  # said up front
    card = json.loads((out / "card.json").read_text())
    data, training = card["data"], card["training"]
    assert 0 < data["sequences"] < data["sequences_available"], data  # forced what fit, not all
    assert f"teacher-forced {data['sequences']} of {data['sequences_available']} sequences" in err
    assert training["steps"] > 0 and training["finished"]
    assert training["prepare_minutes"] <= MINUTES / 2 + TOLERANCE_S / 60, training
    assert f"drafter in {out}: {training['steps']} steps in" in err  # the last line says what the run did
    answers, segments = data["answer_sequences"], data["sequences"] - data["answer_sequences"]
    assert answers > 0 and segments > 0  # both kinds of data, in proportion (forcing_order)


def test_minutes_too_few_to_train_say_so_and_keep_the_data(llama, tmp_path, capsys):
    """Minutes that run out before the first step: the least data (a batch of answers written,
    a batch of them and one of the text teacher-forced) is still prepared and kept, the run says
    so and exits 1, and the same command with more minutes trains on that data, counting the
    time already spent."""
    target, prompts, _ = llama
    out, text = tmp_path / "drafter", tmp_path / "notes.txt"
    rng = random.Random(1)
    text.write_text(" ".join(rng.choice(checkpoints.WORDS) for _ in range(20_000)))  # read in well under 3 s
    command = ["drafter", "train", "--model", str(target), "--prompts", str(prompts), "--data", str(text),
               "--answer-tokens", "20", "--seq-len", "64", "--no-register", "--out", str(out), "--minutes"]
    assert main(command + ["0.0001"]) == 1
    err = capsys.readouterr().err
    assert "ran out before the first training step" in err and str(out) in err, err[-2000:]
    card = json.loads((out / "card.json").read_text())
    assert card["training"]["steps"] == 0
    data = card["data"]
    assert data["answer_sequences"] > 0 and data["sequences"] - data["answer_sequences"] > 0, data
    assert main(command + ["0.05"]) == 0
    err = capsys.readouterr().err
    assert "teacher-forced before, read from" in err and "spent by the runs before" in err, err[-2000:]
    card = json.loads((out / "card.json").read_text())
    assert card["training"]["steps"] > 0 and card["training"]["finished"]


def test_answers_and_text_are_forced_in_proportion():
    order = forcing_order(answers=10, text=30, batch=2)
    assert sorted(r for batch in order for r in batch) == list(range(40))
    assert all(len({r < 10 for r in batch}) == 1 for batch in order)  # a batch is all answers or all text
    first = [r for batch in order[:8] for r in batch]  # 16 rows: about a quarter answers
    assert sum(r < 10 for r in first) in (4, 5) and first[:2] == [0, 1]
    assert [r for batch in forcing_order(5, 0, 4) for r in batch] == list(range(5))
    assert [r for batch in forcing_order(0, 3, 4) for r in batch] == [0, 1, 2]
