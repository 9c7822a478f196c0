"""Resume: a run killed with SIGKILL mid-training (a real subprocess running the CLI) and run
again ends with exactly the weights of a run that never stopped, same seed; so does a run
cancelled with Ctrl-C (SIGINT: a checkpoint, exit 130, resumable). The killed checkpoint is
itself different from the end (the comparison could fail: training went on after resume)."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import mlx.core as mx
import pytest

from engines.training.train import train
from tests.engines.mlx_chat import checkpoints
from tests.engines.training.trained import config, write_prompts
from tests.engines.chat import load_chat

HANG_S = 600  # a resumed run's hang guard, not a speed bound: beside another worker one took past 120 s
STEPS = 400
CLI = "import sys; from app.cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def target_and_prompts(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    target = checkpoints.make_tiny_llama(d / "llama")
    return target, write_prompts(d / "prompts.json", checkpoints.WORDS)


@pytest.fixture(scope="module")
def setup(target_and_prompts, tmp_path_factory):
    """The target, the prompts, and the weights of an uninterrupted run as the CLI trains it (a
    fixture of its own: the tests that need it are slow, and a quick run should not train it)."""
    target, prompts = target_and_prompts
    out = tmp_path_factory.mktemp("resume-uninterrupted") / "run"
    engine = load_chat(str(target))
    as_the_cli = replace(config(out, prompts, STEPS), feature_layers=None, decay=True, soft_labels=True)
    train(engine.model, engine.tokenizer, str(target), as_the_cli)
    return target, prompts, mx.load(str(out / "model.safetensors"))


def command(target, prompts, out):
    return [sys.executable, "-c", CLI, "drafter", "train", "--model", str(target), "--prompts", str(prompts),
            "--answer-tokens", "40", "--seq-len", "64", "--steps", str(STEPS), "--lr", "3e-3",
            "--save-every", "10", "--eval-every", str(STEPS), "--depth", "3", "--draft-vocab", "8192",
            "--answers-per-prompt", "1", "--no-register",
            "--out", str(out)]  # as trained.config, with the trainer's defaults the command line leaves out


def checkpoint_step(out) -> int:
    try:
        return json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    except (OSError, ValueError):
        return 0


def start_and_signal(target, prompts, out, sig) -> tuple[subprocess.Popen, int]:
    """Start a training run and send `sig` once a checkpoint at step >= 20 exists."""
    proc = subprocess.Popen(command(target, prompts, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ))
    deadline = time.monotonic() + 120
    while checkpoint_step(out) < 20 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(sig)
    return proc, checkpoint_step(out)


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)


@pytest.mark.slow  # 16 s: two training processes, one killed (CI runs --slow)
def test_kill_9_mid_training_resumes_to_the_uninterrupted_weights(setup, tmp_path):
    target, prompts, uninterrupted = setup
    out = tmp_path / "killed"
    proc, at = start_and_signal(target, prompts, out, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = checkpoint_step(out)
    assert 20 <= killed_at < STEPS, killed_at
    killed = mx.load(str(out / "checkpoint" / "model.safetensors"))
    resumed = subprocess.run(command(target, prompts, out), capture_output=True, text=True, env=dict(os.environ),
                             timeout=HANG_S)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = mx.load(str(out / "model.safetensors"))
    assert json.loads((out / "card.json").read_text())["training"]["steps"] == STEPS
    assert same(final, uninterrupted)
    assert not same(killed, uninterrupted)


@pytest.mark.slow  # 12 s (CI runs --slow)
def test_ctrl_c_leaves_a_resumable_checkpoint(setup, tmp_path):
    target, prompts, uninterrupted = setup
    out = tmp_path / "cancelled"
    proc, _ = start_and_signal(target, prompts, out, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "run the same command to resume" in err
    stopped_at = checkpoint_step(out)
    assert 20 <= stopped_at < STEPS
    resumed = subprocess.run(command(target, prompts, out), capture_output=True, text=True, env=dict(os.environ),
                             timeout=HANG_S)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert same(mx.load(str(out / "model.safetensors")), uninterrupted)


def test_a_decaying_run_stopped_and_resumed_ends_as_one_that_never_stopped(target_and_prompts, tmp_path):
    """--decay lowers the rate by the share of the run done, a function of the step under
    --steps: a run cancelled at step 25 and resumed ends with the weights of one never stopped,
    and those differ from a constant rate's."""

    target, prompts = target_and_prompts
    engine = load_chat(str(target))
    weights = {}
    for name, decay in (("constant", False), ("decay", True)):
        train(engine.model, engine.tokenizer, str(target), replace(config(tmp_path / name, prompts, 60), decay=decay))
        weights[name] = mx.load(str(tmp_path / name / "model.safetensors"))
    seen = {"step": 0}
    stopped = replace(config(tmp_path / "stopped", prompts, 60, save_every=10), decay=True)
    first = train(engine.model, engine.tokenizer, str(target), stopped,
                  on_progress=lambda p: seen.update(step=p.step), should_stop=lambda: seen["step"] >= 25)
    assert not first.finished and first.step == 25
    train(engine.model, engine.tokenizer, str(target), stopped)
    assert same(mx.load(str(tmp_path / "stopped" / "model.safetensors")), weights["decay"])
    assert not same(weights["decay"], weights["constant"])
