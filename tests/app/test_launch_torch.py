"""A command that only chats runs without torch (app/torchless.py): transformers, which mlx-lm's
tokenizer loads, would import it just because it is installed. Read from the real process's
import log (PYTHONPROFILEIMPORTTIME), as a user starts it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from app.torchless import only_chats
from tests.engines.mlx_chat import checkpoints

pytest.importorskip("mlx.core")


def imported(stderr: str) -> set[str]:
    """The modules an import log names (`import time: self | cumulative | name`)."""
    return {m.group(1).strip() for m in re.finditer(r"^import time:[^|]*\|[^|]*\|(.*)$", stderr, re.M)}


def test_a_chat_process_never_imports_torch_and_answers(tmp_path):
    target = checkpoints.make_tiny_llama(tmp_path / "target")
    env = os.environ | {"PYTHONPROFILEIMPORTTIME": "1"}
    out = subprocess.run([sys.executable, "-m", "app", "chat", "--model", str(target), "--prompt", "the cat and the",
                          "--max-tokens", "8", "--json"], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    modules = imported(out.stderr)
    assert "transformers" in modules  # (the log is read: mlx-lm's tokenizer loaded it)
    assert not {m for m in modules if m == "torch" or m.startswith("torch.")}, "torch was imported"
    assert len(json.loads(out.stdout)["tokens"]) == 8


@pytest.mark.parametrize("argv, chats_only", [
    (["chat", "--prompt", "hi"], True),
    (["bench", "chat"], True),
    (["tune", "--spec", "ngram"], True),
    (["drafter", "train"], True),
    (["serve", "--port", "8000"], True),
    (["serve", "--ocr-model", "glm-ocr"], False),
    (["serve", "--ocr-model=glm-ocr"], False),
    (["serve", "--ocr-mod", "glm-ocr"], False),
    (["ocr", "page.png"], False),
    (["bench", "ocr", "page.png"], False),
    ([], False),  # the window: its engine process reads documents too
])
def test_only_commands_that_read_no_documents_leave_torch_out(argv, chats_only):
    assert only_chats(argv) is chats_only
