"""`specscope chat` end to end on tiny real-format checkpoints, in a subprocess as a user runs it:
the --json document, the streamed text, the trace, and the errors that need a model."""

import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.engines.mlx_chat import checkpoints

pytest.importorskip("mlx.core")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_models")
    target = checkpoints.make_tiny_llama(root / "target")
    other_words = [w + "x" for w in checkpoints.WORDS]  # same size, different tokens
    return {
        "target": str(target),
        "draft": str(checkpoints.perturbed_copy(target, root / "draft")),
        "foreign": str(checkpoints.make_tiny_llama(root / "foreign", words=other_words)),
        "root": root,
    }


def specscope(*argv, timeout=180):
    """As a user runs it: a fresh process."""
    return subprocess.run([sys.executable, "-m", "app", *argv], capture_output=True, text=True, timeout=timeout)


def in_process(capsys, *argv):
    """The same entry point in this process (no interpreter start-up per call)."""
    from app.cli.main import main

    rc = main(list(argv))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, rc, out.out, out.err)


PROMPT = "the cat and the dog see the big red house and the cat and the dog see the"


def test_json_document_and_lossless_against_plain(models, tmp_path):
    trace = tmp_path / "run.ndjson"
    common = ["chat", "--model", models["target"], "--prompt", PROMPT, "--max-tokens", "24", "--json"]
    plain = specscope(*common, "--spec", "off")
    spec = specscope(*common, "--spec", "draft", "--draft-model", models["draft"], "--steps", "4", "--trace", str(trace))
    assert plain.returncode == 0, plain.stderr
    assert spec.returncode == 0, spec.stderr
    p, s = json.loads(plain.stdout), json.loads(spec.stdout)  # exactly one JSON document each
    for doc in (p, s):
        assert {"text", "tokens", "rounds", "stats"} <= doc.keys()
        assert len(doc["tokens"]) == 24  # generated ids only, max_tokens honoured
        assert doc["text"] == "".join(r["text"] for r in doc["rounds"])
        assert doc["tokens"] == [t for r in doc["rounds"] for t in r["tokens"]]
    assert s["tokens"] == p["tokens"]  # lossless at T=0
    assert s["stats"]["proposed"] > 0 and 0 < s["stats"]["accepted"] < s["stats"]["proposed"]
    assert p["stats"]["proposed"] == 0
    lines = [json.loads(l) for l in trace.read_text().splitlines()]
    assert lines[0]["event"] == "run"
    assert [l["index"] for l in lines[1:]] == [r["index"] for r in s["rounds"]]


def test_streams_text_without_json(models, capsys):
    out = in_process(capsys, "chat", "--model", models["target"], "--prompt", PROMPT, "--max-tokens", "12", "--spec", "ngram")
    assert out.returncode == 0, out.stderr
    as_json = in_process(capsys, "chat", "--model", models["target"], "--prompt", PROMPT, "--max-tokens", "12", "--spec", "ngram", "--json")
    assert out.stdout.strip() == json.loads(as_json.stdout)["text"].strip()
    assert "tok/s" in out.stderr and "tau" in out.stderr


@pytest.mark.parametrize(
    "case,expected",
    [
        ("foreign draft", "does not share the target's tokenizer"),
        ("corrupt config", "config.json"),
        ("unsupported architecture", "unsupported"),
    ],
)
def test_model_errors_are_one_line_exit_2(models, case, expected, capsys):
    root = models["root"]
    if case == "foreign draft":
        argv = ["--model", models["target"], "--spec", "draft", "--draft-model", models["foreign"]]
    elif case == "corrupt config":
        bad = root / "corrupt"
        bad.mkdir(exist_ok=True)
        (bad / "config.json").write_text("{ not json")
        argv = ["--model", str(bad)]
    else:
        odd = root / "odd"
        odd.mkdir(exist_ok=True)
        (odd / "config.json").write_text(json.dumps({"model_type": "no_such_arch_xyz"}))
        save_file({"model.embed_tokens.weight": np.zeros((4, 4), np.float32)}, str(odd / "model.safetensors"))
        argv = ["--model", str(odd)]
    out = in_process(capsys, "chat", "--prompt", "hi", *argv)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_stop_string_across_rounds_in_stream_json_and_trace(models, capsys, tmp_path):
    """A two-word stop string: the streamed text, the --json text and the trace's round texts
    all end right before it, with speculation and without."""
    common = ["chat", "--model", models["target"], "--prompt", PROMPT, "--max-tokens", "24"]
    full = json.loads(in_process(capsys, *common, "--json").stdout)["text"]
    stop = " " + " ".join(full.split()[6:8])
    want = full[: full.index(stop)]
    for spec in (["--spec", "off"], ["--spec", "draft", "--draft-model", models["draft"], "--steps", "4"]):
        trace = tmp_path / f"{spec[1]}.ndjson"
        doc = json.loads(in_process(capsys, *common, *spec, "--stop", stop, "--json", "--trace", str(trace)).stdout)
        streamed = in_process(capsys, *common, *spec, "--stop", stop).stdout
        traced = "".join(json.loads(line).get("text", "") for line in trace.read_text().splitlines()[1:])
        assert doc["text"] == traced == streamed.rstrip("\n") == want, spec
