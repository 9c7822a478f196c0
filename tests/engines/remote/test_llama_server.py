"""The remote engine against a REAL llama.cpp server (llama-server b11434, built by
scripts/build-llama-server) on 127.0.0.1, running the embedded SmolLM2 GGUF with n-gram
speculation (--spec-type ngram-simple). One server process for the module, short generations.

Skipped, with the reason, when the binary has not been built."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from engines.types import Request, SpecConfig

BINARY = Path(os.environ.get("SPECSCOPE_LLAMA_SERVER",
                             Path.home() / ".cache/specscope/llama.cpp-b11434/bin/llama-server"))
# Copy-heavy: the answer repeats the prompt, so n-gram drafts are offered and accepted.
PROMPT = ("Repeat this list exactly, one item per line: apple, banana, cherry, date, elderberry, fig, grape, "
          "apple, banana, cherry, date, elderberry, fig, grape")
MAX_TOKENS = 48

pytestmark = pytest.mark.skipif(not BINARY.is_file(),
                                reason=f"llama-server is not built ({BINARY}): run scripts/build-llama-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from engines.mlx_chat.models import default_chat_model

    try:
        model = default_chat_model()
    except Exception as e:
        pytest.skip(f"the embedded SmolLM2 GGUF is not installed: {e}")
    port = free_port()
    log = open(tmp_path_factory.mktemp("llama") / "server.log", "w")
    proc = subprocess.Popen(
        [str(BINARY), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--metrics",
         "--spec-type", "ngram-simple", "-c", "2048", "-np", "1", "--threads", "2", "--no-webui"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"llama-server did not come up; see {log.name}")
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def chat_request(max_tokens: int = MAX_TOKENS) -> Request:
    return Request(kind="chat", prompt=PROMPT, max_tokens=max_tokens, spec=SpecConfig(method="ngram", steps=3))


def server_answer(url: str, max_tokens: int = MAX_TOKENS) -> dict:
    """The server's own non-streamed answer to the same request."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"llamacpp:{name} "):
                return float(line.split()[1])
    raise AssertionError(f"llamacpp:{name} missing from /metrics")


@pytest.fixture(scope="module")
def expected(server) -> dict:
    """The server's own non-streamed answer. Asked twice: llama.cpp's first answer to a prompt
    (prefilled as one batch) can differ from its later ones (prompt cached, one token fed),
    since batched and one-token forwards round differently; the later ones agree with each
    other, and the remote engine's request is a later one."""
    server_answer(server)
    answer = server_answer(server)
    assert answer["choices"][0]["finish_reason"] == "length"  # runs to MAX_TOKENS: cancelling can show
    return answer


@pytest.fixture(scope="module")
def remote(server):
    from engines.remote.engine import RemoteEngine

    return RemoteEngine.load(server)


def test_the_remote_text_equals_the_servers_own_answer_and_draft_counts_are_read(remote, expected):
    assert remote.server == "llamacpp"
    rounds = list(remote.generate(chat_request()))
    assert "".join(r.text for r in rounds) == expected["choices"][0]["message"]["content"]
    report = remote.last_report
    assert report.source == "timings"
    assert report.draft_n == expected["timings"]["draft_n"] > 0
    assert report.draft_n_accepted == expected["timings"]["draft_n_accepted"] > 0
    # the rounds rebuilt from the running counters add up to the response's totals
    assert sum(r.proposed for r in rounds) == report.draft_n
    assert sum(r.accepted for r in rounds) == report.draft_n_accepted
    assert sum(len(r.tokens) for r in rounds) == report.predicted_n == expected["timings"]["predicted_n"]
    assert any(r.accepted > 0 and len(r.tokens) == r.accepted + 1 for r in rounds)


def test_its_prometheus_counters_parse_and_match_the_response(server, expected):
    from engines.remote.counters import parse_spec_counters
    from engines.remote.engine import fetch_metrics

    before = parse_spec_counters(fetch_metrics(server))
    answer = server_answer(server)
    diff = parse_spec_counters(fetch_metrics(server)).minus(before)
    assert diff.draft_tokens == answer["timings"]["draft_n"]
    assert diff.accepted_tokens == answer["timings"]["draft_n_accepted"]
    assert diff.drafts > 0 and sum(diff.accepted_per_pos.values()) == diff.accepted_tokens


def test_read_the_way_vllm_is_read_its_counters_give_the_responses_totals(server, remote, expected):
    """The path vLLM and SGLang take (draft figures only from /metrics, before and after),
    run against this real server, whose llamacpp:spec_decode_* counters carry vLLM's names."""
    from engines.remote.engine import RemoteEngine

    as_vllm = RemoteEngine(url=remote.url, model=remote.model, server="vllm")
    rounds = list(as_vllm.generate(chat_request()))
    assert "".join(r.text for r in rounds) == expected["choices"][0]["message"]["content"]
    assert all(r.proposed == 0 for r in rounds)  # no per-round figures on this path
    report = as_vllm.last_report
    assert report.source == "metrics"
    assert report.draft_n == expected["timings"]["draft_n"] > 0
    assert report.draft_n_accepted == expected["timings"]["draft_n_accepted"]
    assert sum(report.accepted_per_pos.values()) == report.draft_n_accepted


def test_the_cli_shows_draft_n_and_draft_n_accepted(server, expected, capsys):
    from app.cli.main import main

    timings = expected["timings"]
    assert main(["chat", "--server", server, "--prompt", PROMPT, "-m", str(MAX_TOKENS)]) == 0
    err = capsys.readouterr().err
    assert f"draft_n {timings['draft_n']}, draft_n_accepted {timings['draft_n_accepted']} (from timings)" in err


def test_cancelling_mid_stream_stops_the_servers_generation(server, remote, expected):
    assert expected["timings"]["predicted_n"] == MAX_TOKENS  # uncancelled, it runs to max_tokens
    before = metric(server, "tokens_predicted_total")
    seen = []
    rounds = list(remote.generate(chat_request(), should_stop=lambda: len(seen) >= 3 or seen.append(1)))
    assert rounds[-1].finish == "cancelled" and len(rounds) <= 4
    deadline = time.monotonic() + 30
    while metric(server, "requests_processing") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(server, "requests_processing") == 0
    generated = metric(server, "tokens_predicted_total") - before
    assert generated < MAX_TOKENS / 2  # the server stopped soon after the client left
