"""`specscope drafter train`'s bad input: one line on stderr and exit 2 -- an architecture
the trainer does not support (naming the supported ones), an empty or unreadable data file, a
full disk at a checkpoint (said once; the previous checkpoint kept)."""

import errno
import json

import mlx.core as mx
import pytest

from app.cli.main import main
from tests.engines.mlx_chat import checkpoints
from tests.engines.training.trained import write_prompts


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_drafter")
    return checkpoints.make_tiny_llama(d / "llama"), write_prompts(d / "prompts.json", checkpoints.WORDS)


def args(target, prompts, out, *extra):
    return ["drafter", "train", "--model", str(target), "--prompts", str(prompts), "--answer-tokens", "40",
            "--seq-len", "64", "--no-register", "--out", str(out), *extra]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("specscope: error: "), err
    return err[-1]


def test_an_unsupported_architecture_names_the_supported_ones(tmp_path, capsys):
    from tests.engines.gemma4.checkpoints import build_target

    target = build_target(tmp_path / "gemma4")
    assert main(["drafter", "train", "--model", str(target), "--prompts", "none", "--steps", "1",
                 "--out", str(tmp_path / "out")]) == 2
    line = one_line(capsys)
    assert "gemma4_text" in line and "llama" in line and "gemma3_text" in line, line


def test_an_empty_data_file_is_one_line(llama, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert main(args(*llama, tmp_path / "out", "--data", str(empty), "--steps", "1")) == 2
    assert f"data file {empty} is empty" in one_line(capsys)
    assert not (tmp_path / "out").exists()  # said before anything was loaded or written


def test_an_unreadable_data_file_is_one_line(llama, tmp_path, capsys):
    missing = tmp_path / "missing.txt"
    assert main(args(*llama, tmp_path / "out", "--data", str(missing), "--steps", "1")) == 2
    assert f"cannot read data file {missing}" in one_line(capsys)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    assert main(args(*llama, tmp_path / "out", "--data", str(binary), "--steps", "1")) == 2
    assert f"cannot read data file {binary}" in one_line(capsys)


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one(llama, tmp_path, capsys, monkeypatch):
    """The second checkpoint's optimizer file hits ENOSPC: one line, exit 2, the step 10
    checkpoint intact and loadable, no partial directory left behind."""
    real = mx.save_safetensors
    calls = []

    def full_disk(path, *a, **k):
        if path.endswith("optimizer.safetensors"):
            calls.append(path)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *a, **k)

    monkeypatch.setattr(mx, "save_safetensors", full_disk)
    out = tmp_path / "out"
    assert main(args(*llama, out, "--steps", "30", "--save-every", "10")) == 2
    line = one_line(capsys)
    assert "disk full at the step 20 checkpoint" in line and "the step 10 checkpoint is kept" in line, line
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 10
    assert mx.load(str(out / "checkpoint" / "model.safetensors"))
    assert not (out / "checkpoint.partial").exists()
