"""Issue 16 on the command line, as a user runs it (a fresh process on a tiny real-format
checkpoint): a closed pipe, a full disk, an unwritable trace, Ctrl-C in --json mode, prompts
from a file or stdin, a prompt past the context, and the drafter fallback in the stats line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import CONTEXT

pytest.importorskip("mlx.core")

PROMPT = "the cat and the dog see the big red house"


def specscope(*argv, timeout=180, **kw):
    if "stdout" not in kw:
        kw.setdefault("capture_output", True)
    return subprocess.run([sys.executable, "-m", "app", *argv], text=True, timeout=timeout, **kw)


def chat(model, *argv):
    return ["chat", "--model", str(model), "--spec", "off", *argv]


def test_stdout_into_a_closed_pipe_ends_quietly(short_context_llama):
    # the reader is gone before the first token: every write to stdout is EPIPE (what `| head`
    # does once it has its lines); before: a BrokenPipeError traceback
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = specscope(*chat(short_context_llama, "--prompt", PROMPT, "-m", "20"), stdout=write_end,
                        stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert out.returncode == 141, out.stderr  # 128 + SIGPIPE, as a shell reports `yes | head`
    assert out.stderr == "", out.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_stdout_on_a_full_disk_is_one_line(short_context_llama):
    with open("/dev/full", "w") as full:
        out = specscope(*chat(short_context_llama, "--prompt", PROMPT, "-m", "20", "--json"), stdout=full,
                        stderr=subprocess.PIPE)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == ["specscope: error: cannot write the output: No space left on device"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_trace_on_a_full_disk_is_said_once_and_the_run_goes_on(short_context_llama):
    out = specscope(*chat(short_context_llama, "--prompt", PROMPT, "-m", "20", "--json", "--trace", "/dev/full"))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    warnings = [l for l in out.stderr.splitlines() if "/dev/full" in l]
    assert len(warnings) == 1 and "goes on without the trace" in warnings[0]
    assert len(json.loads(out.stdout)["tokens"]) == 20  # nothing computed is lost


def test_ctrl_c_in_json_mode_prints_the_partial_result_and_closes_the_trace(tiny_llama, tmp_path):
    trace = tmp_path / "run.ndjson"
    proc = subprocess.Popen([sys.executable, "-m", "app", *chat(tiny_llama, "--prompt", PROMPT, "-m", "4000",
                                                                   "--json", "--trace", str(trace))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while '"event": "round"' not in (trace.read_text() if trace.exists() else ""):  # generating
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    doc = json.loads(stdout)
    assert doc["rounds"][-1]["finish"] == "cancelled" and 0 < len(doc["tokens"]) < 4000
    rounds = [json.loads(l) for l in trace.read_text().splitlines() if '"event": "round"' in l]
    assert rounds[-1]["finish"] == "cancelled" and [r["tokens"] for r in rounds] == [r["tokens"] for r in doc["rounds"]]


def test_prompt_from_a_file_and_from_stdin_equal_the_argument(short_context_llama, tmp_path, capsys):
    from app.cli.main import main

    common = chat(short_context_llama, "-m", "12", "--json")
    # the argument's answer in this process (the same command, the same BLAS), the file's and
    # stdin's each in a fresh one, where reading them is as a user's shell gives them
    assert main([*common, "--prompt", PROMPT]) == 0
    by_arg = json.loads(capsys.readouterr().out)["tokens"]
    assert len(by_arg) == 12
    path = tmp_path / "prompt.txt"
    path.write_text(PROMPT)
    assert json.loads(specscope(*common, "--prompt-file", str(path)).stdout)["tokens"] == by_arg
    assert json.loads(specscope(*common, "--prompt", "-", input=PROMPT).stdout)["tokens"] == by_arg
    assert json.loads(specscope(*common, "--prompt-file", "-", input=PROMPT).stdout)["tokens"] == by_arg


@pytest.mark.parametrize("make,expected", [
    (lambda d: d / "missing.txt", "cannot read prompt file"),
    (lambda d: (d / "latin1.txt").write_bytes(b"caf\xe9 \xff") and d / "latin1.txt", "not UTF-8"),
    (lambda d: (d / "empty.txt").write_text("  \n") and d / "empty.txt", "the prompt is empty"),
], ids=["missing", "not utf-8", "empty"])
def test_bad_prompt_file_is_one_line(short_context_llama, tmp_path, make, expected):
    out = specscope(*chat(short_context_llama, "--prompt-file", str(make(tmp_path))))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert expected in out.stderr


def test_prompt_past_the_context_is_one_line_before_prefill(short_context_llama, tmp_path):
    path = tmp_path / "long.txt"
    path.write_text("the cat is big and the dog is small . " * 3000)  # ~30k tokens, context 256
    t0 = time.perf_counter()
    out = specscope(*chat(short_context_llama, "--prompt-file", str(path), "-m", "8"))
    elapsed = time.perf_counter() - t0
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        l for l in out.stderr.strip().splitlines() if f"longer than the model's context of {CONTEXT} tokens" in l]
    print(f"a ~30k-token prompt against a {CONTEXT}-token context: exit 2 after {elapsed:.1f} s "
          f"(process start and model load included)")


def test_drafter_fallback_is_in_the_stats_line(short_context_llama, monkeypatch, capsys):
    from app.cli.main import main
    from tests.faults import break_ngram_drafter_on_third_call

    break_ngram_drafter_on_third_call(monkeypatch)
    rc = main(["chat", "--model", str(short_context_llama), "--prompt", PROMPT + " " + PROMPT, "-m", "30",
               "--spec", "ngram", "--steps", "3"])
    err = capsys.readouterr().err
    assert rc == 0
    stats = err.strip().splitlines()[-1]
    assert "speculation stopped" in stats and "drafter broke" in stats, err


def test_prefill_progress_of_a_long_prompt_on_stderr(tiny_llama, capsys):
    from app.cli.main import main

    rc = main(["chat", "--model", str(tiny_llama), "--prompt", "the cat is big and the dog is small . " * 90,
               "-m", "4", "--spec", "off", "--ignore-chat-template"])
    err = capsys.readouterr().err
    assert rc == 0, err
    progress = [l for l in err.splitlines() if "reading the prompt" in l]
    assert len(progress) >= 2 and "tok/s" in progress[0], err  # one line per chunk (stderr is no terminal)
