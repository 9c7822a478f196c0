"""Bad input on the command line: one clear line on stderr, exit code 2, never a traceback.
(Errors that need a loaded model are tested with the chat engine's tiny checkpoints.)"""

import subprocess
import sys

import pytest

CASES = {
    "empty prompt": (["chat", "--prompt", "   "], "the prompt is empty"),
    "steps out of range": (["chat", "--prompt", "hi", "--steps", "8"], "--steps must be between 0 and 7"),
    "negative steps": (["chat", "--prompt", "hi", "--steps", "-1"], "--steps must be between 0 and 7"),
    "draft without model": (["chat", "--prompt", "hi", "--spec", "draft"], "needs --draft-model"),
    "missing prompt": (["chat"], "required"),
    "bad temperature": (["chat", "--prompt", "hi", "--temp", "-1"], "--temp"),
    # engines.validation turns these away before loading (taken, they would give garbage output,
    # a traceback in mx.random.seed, an output cut to one character)
    "temperature nan": (["chat", "--prompt", "hi", "--temp", "nan"], "--temp must be a finite number"),
    "temperature inf": (["chat", "--prompt", "hi", "--temp", "inf"], "--temp must be a finite number"),
    "top-p nan": (["chat", "--prompt", "hi", "--top-p", "nan"], "--top-p must be in (0, 1]"),
    "negative top-k": (["chat", "--prompt", "hi", "--top-k", "-1"], "--top-k must be"),
    "min-p above 1": (["chat", "--prompt", "hi", "--min-p", "1.5"], "--min-p must be"),
    "negative seed": (["chat", "--prompt", "hi", "--seed", "-1"], "--seed must be"),
    "empty stop string": (["chat", "--prompt", "hi", "--stop", ""], "--stop strings must be non-empty"),
    "ocr nan temperature": (["ocr", "/etc/hostname", "--model", "/nonexistent", "--temp", "nan"], "--temp"),
    "bad preset": (["chat", "--prompt", "hi", "--preset", "fastest"], "invalid choice"),
    "unwritable trace": (["chat", "--prompt", "hi", "--trace", "/nonexistent-dir/t.ndjson"], "cannot write trace file"),
    "missing image": (["ocr", "/nonexistent.png", "--model", "/nonexistent"], "no such file"),
    "missing model dir": (["chat", "--prompt", "hi", "--model", "/nonexistent-model"], "/nonexistent-model"),
    # every flag is checked or refused, never ignored; OCR's n-gram lookup bounds too
    "ocr n-gram bounds": (["ocr", "/etc/hostname", "--model", "/nonexistent", "--spec", "ngram", "--ngram-min", "5",
                           "--ngram-max", "2"], "--ngram-min"),
    "bench writes no trace": (["bench", "chat", "--trace", "t.ndjson"], "unrecognized arguments"),
    "bench has no --json": (["bench", "chat", "--json"], "unrecognized arguments"),
    "one copy is no repetition": (["chat", "--prompt", "hi", "--max-repeat", "1"], "--max-repeat must be 0"),
    "bad page list": (["ocr", "/etc/hostname", "--pages", "3-1"], "--pages"),
}


@pytest.mark.parametrize("argv,expected", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_line_exit_2(argv, expected):
    out = subprocess.run([sys.executable, "-m", "app", *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("specscope: error:") and expected in lines[0], lines[0]
    assert "Traceback" not in out.stderr


def test_top_level_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "app", "--help"], capture_output=True, text=True, check=True)
    for cmd in ("chat", "ocr", "bench", "convert", "models"):
        assert cmd in out.stdout
