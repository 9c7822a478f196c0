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
    from tests.engines.mlx_chat.gemma4.checkpoints import build_target

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


def test_a_negative_count_is_one_line(llama, tmp_path, capsys):
    assert main(args(*llama, tmp_path / "out", "--answers-per-prompt", "-1", "--steps", "1")) == 2
    assert "--answers-per-prompt must be positive" in one_line(capsys)
    assert not (tmp_path / "out").exists()


def test_the_help_lists_what_a_user_needs_first_and_the_rest_as_advanced(capsys):
    """The options the defaults were measured against are not on the command line (they are
    TrainConfig's); the tuning knobs are listed under "advanced", after the ones a run needs."""
    from app.cli.drafter import parser

    text = parser().format_help()
    main_part, _, advanced = text.partition("\nadvanced:\n")
    assert advanced, text
    for option in ("--out", "--model", "--minutes", "--steps", "--data", "--sessions", "--prompts", "--no-register"):
        assert option in main_part.split("\noptions:\n")[1], option
    for option in ("--answers-per-prompt", "--depth", "--lr", "--batch", "--seq-len", "--draft-vocab", "--seed"):
        assert option in advanced and option not in main_part.split("\noptions:\n")[1], option
    for gone in ("--noise", "--feature-weight", "--teacher-k", "--confidence-weighting", "--feature-layers", "--dropout",
                 "--weight-decay", "--soft-labels", "--decay", "--own-prompts"):
        assert gone not in text, gone


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


def saved_session(kind: str, prompt: str, answer: str) -> None:
    """A session as the window autosaves it (app/records/sessions.py's Autosave)."""
    from app.records.bursts import burst_of
    from app.records.sessions import Autosave, new_autosave_path
    from engines.speculative.rounds import Round
    from engines.speculative.session import Session

    session = Session(request={"kind": kind, "prompt": prompt}, model={"name": "tiny"})
    writer = Autosave(new_autosave_path(kind), session)
    rnd = Round(index=0, proposed=0, accepted=0, tokens=[1], from_draft=[False], text=answer, accept_flags=[],
                draft_s=0.0, verify_s=0.0, wall_s=0.0, finish="stop")
    writer.write_burst(burst_of(rnd, None))
    writer.write_end("done")
    writer.close()


def test_saved_chats_become_training_text(llama, tmp_path, monkeypatch, capsys):
    """--sessions: the saved chat sessions' prompts and answers are written once into the
    drafter's directory and trained on; OCR sessions are left out; no saved chat -> one line."""
    target, prompts = llama
    monkeypatch.setenv("SPECSCOPE_HOME", str(tmp_path / "home"))
    assert main(args(target, prompts, tmp_path / "none", "--sessions", "--steps", "2")) == 2
    assert "no saved chat session" in one_line(capsys)

    saved_session("chat", "the cat and the dog", "the dog is big and the cat is small")
    saved_session("ocr", "", "an invoice, read from a page")
    out = tmp_path / "drafter"
    assert main(args(target, prompts, out, "--sessions", "--steps", "2")) == 0
    text = (out / "data" / "saved-chats.txt").read_text()
    assert "the cat and the dog" in text and "the dog is big and the cat is small" in text
    assert "invoice" not in text
    card = json.loads((out / "card.json").read_text())
    assert str(out / "data" / "saved-chats.txt") in json.dumps(card)
