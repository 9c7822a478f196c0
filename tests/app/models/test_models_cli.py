"""`specscope models ...` and `--model ID` end to end, against the loopback hub: get with a
progress bar, list, path, then chat on the downloaded model giving what the local path gives;
--spec mtp finding the paired assistant; bad input as one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.main import main
from app.models import catalog, store
from tests.hub.fixtures import hub, hub_env  # noqa: F401  (pytest fixtures)
from tests.hub.repos import MiB, make_big_repo, make_small_repo
from tests.app.models.test_downloads import _wait_for


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    from tests.engines.mlx_chat.checkpoints import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("llama") / "tiny-llama")


@pytest.fixture(scope="session")
def gemma4_pair(tmp_path_factory):
    from tests.engines.mlx_chat.gemma4.checkpoints import DENSE_TARGET, AssistantSpec, build_assistant, build_target

    root = tmp_path_factory.mktemp("gemma4_pair")
    target = build_target(root / "target", DENSE_TARGET)
    return target, build_assistant(root / "assistant", target, AssistantSpec())


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *argv], env=env, capture_output=True, text=True, timeout=300)


def chat_json(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "chat", "--prompt", "the cat see a dog", "--max-tokens", "12", "--json", *argv)
    assert code == 0, err
    return json.loads(out)


def test_get_shows_progress_then_chat_by_repo_id_equals_chat_by_path(hub, hub_env, capsys, tiny_llama):
    hub.serve_repo("org/tiny-llama", tiny_llama)
    code, out, err = run(capsys, "models", "get", "org/tiny-llama")
    assert code == 0, err
    snapshot = out.strip()
    assert "model.safetensors" in err and "%" in err and "/s" in err and "ETA" in err
    assert run(capsys, "models", "path", "org/tiny-llama")[1].strip() == snapshot

    code, out, _ = run(capsys, "models", "list", "--json")
    listed = {m["id"]: m for m in json.loads(out)}
    mine = listed["org/tiny-llama"]
    assert mine["status"]["installed"] and mine["status"]["path"] == snapshot
    assert mine["status"]["size_on_disk"] >= (tiny_llama / "model.safetensors").stat().st_size
    assert listed["glm-ocr"]["status"]["installed"] is False and listed["glm-ocr"]["status"]["missing"]

    by_id = chat_json(capsys, "--model", "org/tiny-llama", "--spec", "ngram")
    by_path = chat_json(capsys, "--model", str(tiny_llama), "--spec", "ngram")
    assert by_id["tokens"] and by_id["tokens"] == by_path["tokens"] and by_id["text"] == by_path["text"]


def test_spec_mtp_on_a_paired_target_picks_its_assistant(hub, hub_env, capsys, gemma4_pair):
    target, assistant = gemma4_pair
    hub.serve_repo("org/g4", target)
    hub.serve_repo("org/g4-assistant", assistant)
    # A catalog pair, as resources/catalog.json pairs each Gemma 4 target with its assistant.
    catalog.add_user_entry(catalog.CatalogEntry(id="org/g4", title="g4", role="chat", repo_id="org/g4",
                                                pairs_with="org/g4-assistant"))
    catalog.add_user_entry(catalog.CatalogEntry(id="org/g4-assistant", title="g4 assistant", role="drafter",
                                                repo_id="org/g4-assistant", pairs_with="org/g4"))
    code, _, err = run(capsys, "models", "get", "org/g4")
    assert code == 0 and "its drafter org/g4-assistant is not downloaded: specscope models get org/g4-assistant" in err
    code, _, err = run(capsys, "chat", "--model", "org/g4", "--spec", "mtp", "--prompt", "hi")
    assert code == 2 and "needs its assistant drafter" in err and "models get org/g4-assistant" in err
    assert run(capsys, "models", "get", "org/g4-assistant")[0] == 0

    paired = chat_json(capsys, "--model", "org/g4", "--spec", "mtp", "--steps", "2")
    explicit = chat_json(capsys, "--model", str(target), "--draft-model", str(assistant), "--spec", "mtp", "--steps", "2")
    assert paired["tokens"] == explicit["tokens"]
    assert sum(r["proposed"] for r in paired["rounds"]) > 0, "the assistant drafted"
    snapshot = store.resolve("org/g4", "chat")
    by_snapshot_path = chat_json(capsys, "--model", str(snapshot), "--spec", "mtp", "--steps", "2")
    assert by_snapshot_path["tokens"] == explicit["tokens"], "a downloaded path finds its pair too"


@pytest.mark.parametrize("argv, expected", [
    (["models", "get", "nobody/nothing"], "nobody/nothing is not a model on the hub"),
    (["models", "get", "no such thing"], "no such model"),
    (["models", "rm", "glm-ocr"], "glm-ocr is not downloaded"),
    (["models", "add", "/etc/hostname"], "not a model"),
    (["chat", "--model", "nobody/nothing", "--prompt", "hi"], "nobody/nothing is not downloaded: specscope models get nobody/nothing"),
    # a real image, so the input check (made before any model is resolved) lets it through
    (["ocr", str(Path(__file__).resolve().parents[3] / "resources" / "icons" / "specscope-1024.png")],
     "glm-ocr: not downloaded"),
])
def test_bad_input_is_one_line_exit_2(hub, hub_env, capsys, argv, expected):
    code, _, err = run(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("specscope: error:") and expected in lines[0], err


def test_rm_while_in_use_and_a_second_get_are_refused(hub, hub_env, tmp_path):
    big = make_big_repo(tmp_path / "big")
    hub.serve_repo("org/big", big)
    hub.stall("org/big", "model.safetensors", after=1 * MiB)
    env = hub_env.subprocess_env()
    first = subprocess.Popen([sys.executable, "-m", "app", "models", "get", "org/big"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: store.incomplete_files("org/big"))
        second = cli(env, "models", "get", "org/big")
        assert second.returncode == 2 and second.stderr.count("\n") == 1
        assert "org/big is already being downloaded" in second.stderr
    finally:
        hub.release()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    snapshot = out.strip()

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from app.models import store\n"
         f"with store.lease({snapshot!r}):\n    print('held', flush=True); sys.stdin.readline()"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        rm = cli(env, "models", "rm", "org/big")
        assert rm.returncode == 2 and f"in use by process {holder.pid}" in rm.stderr and rm.stderr.count("\n") == 1
    finally:
        holder.communicate("\n", timeout=30)
    rm = cli(env, "models", "rm", "org/big")
    assert rm.returncode == 0 and "removed org/big" in rm.stderr
    assert not store.repo_cache_dir("org/big").exists()


def test_add_lists_a_local_model_and_rm_forgets_it(hub_env, capsys, tmp_path):
    folder = make_small_repo(tmp_path / "mine")
    code, _, err = run(capsys, "models", "add", str(folder))
    assert code == 0 and "local:mine (chat)" in err
    code, out, _ = run(capsys, "models", "list")
    assert "local:mine" in out and str(folder) in out
    assert run(capsys, "models", "rm", "local:mine")[0] == 0
    assert folder.is_dir() and "local:mine" not in run(capsys, "models", "list")[1]
