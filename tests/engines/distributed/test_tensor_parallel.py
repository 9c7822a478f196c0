"""Issue 24: `specscope serve --ranks 2` on loopback answers exactly as one process does.

Two ranks (mlx.launch, ring backend), the tiny llama split in two by mlx-lm's shard (2 of its 4
query heads and 1 of its 2 KV heads per rank), rank 0 drafting. Against one in-process server
on the same checkpoint, over the same HTTP: T=0 tokens identical for plain decoding, n-gram and
a draft model; T>0 with a seed identical; concurrent requests (a batch across ranks) each get
their lone answer. `--check-ranks` compares every forward's argmax checksum across the ranks;
the count of checked forwards is read back. Faults: a killed rank and a stopped rank -> 503
within 30 s, one line naming the rank, every process gone. A model over one process's
--memory-limit loads on two."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request

import pytest

from app.serve.protocol import ServedModel
from app.serve.server import ServeConfig, Served, build_app, start_in_thread
from engines.types import SpecConfig
from tests.engines.distributed.conftest import MODEL, RankServer, start_rank_server, wait_gone
from tests.engines.chat import load_chat

pytestmark = pytest.mark.slow

PROMPTS = ["the cat and the dog see the cat and the dog see the cat", "a red bird and an old fish",
           "the big house on the old road and the big house", "see the moon"]
METHODS = {"off": {"method": "off", "steps": 0}, "ngram": {"method": "ngram", "steps": 4},
           "draft": {"method": "draft", "steps": 4}}


@pytest.fixture(scope="module")
def ranked(llama, llama_draft, tmp_path_factory):
    server = start_rank_server(llama, tmp_path_factory.mktemp("ranked"), "--draft-model", llama_draft,
                               "--check-ranks", "--max-batch", "4")
    yield server
    server.stop()  # SIGTERM to the launcher, as a supervisor stops it
    wait_gone(server, 30)
    assert server.proc.returncode == 128 + 15


@pytest.fixture(scope="module")
def single(llama, llama_draft):
    """One process: the same checkpoint through the same server code, batched as the ranks are."""

    engine = load_chat(llama, draft_model=llama_draft)
    served = [Served(ServedModel(MODEL, "chat", SpecConfig("ngram", 3)), engine)]
    running = start_in_thread(build_app(ServeConfig(max_batch=4), served))
    yield running
    running.stop()


def ask_single(single, prompt: str, **body) -> dict:
    return RankServer(None, single.port, None).chat(prompt, **body)[1]


def tokens(answer: dict) -> list[int]:
    return [t for r in answer["rounds"] for t in r["tokens"]]


def test_health_says_two_ranks(ranked):
    status, health = ranked.get("/health")
    assert (status, health["status"], health["ranks"]) == (200, "ok", 2)


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_answers_equal_one_process(ranked, single, method):
    for prompt in PROMPTS[:2]:
        status, answer = ranked.chat(prompt, temperature=0, speculative=METHODS[method])
        assert status == 200, answer
        alone = ask_single(single, prompt, temperature=0, speculative=METHODS[method])
        assert tokens(answer) == tokens(alone), (method, prompt)
        assert answer["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
        if method != "off":
            assert answer["timings"]["draft_n"] > 0  # rank 0 drafted, the forward verified on both ranks
        assert all(r["ranks"]["ranks"] == 2 and r["ranks"]["forwards"] >= 1 for r in answer["rounds"])
        assert "ranks" not in alone["rounds"][0]  # one process: the records are as they were


@pytest.mark.parametrize("method", list(METHODS))
def test_seeded_sampling_equals_one_process(ranked, single, method):
    body = dict(temperature=0.9, top_p=0.95, seed=1234, speculative=METHODS[method])
    status, answer = ranked.chat(PROMPTS[0], **body)
    assert status == 200, answer
    assert tokens(answer) == tokens(ask_single(single, PROMPTS[0], **body))
    assert tokens(ranked.chat(PROMPTS[0], **body)[1]) == tokens(answer)  # and again on the ranks


def test_a_batch_across_ranks_gives_each_request_its_lone_answer(ranked, single):
    methods = ["ngram", "draft", "off", "ngram"]
    answers: dict[int, dict] = {}

    def one(i):
        answers[i] = ranked.chat(PROMPTS[i], temperature=0, max_tokens=60, speculative=METHODS[methods[i]])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i in range(4):
        status, answer = answers[i]
        assert status == 200, answer
        alone = ask_single(single, PROMPTS[i], temperature=0, max_tokens=60, speculative=METHODS[methods[i]])
        assert tokens(answer) == tokens(alone), i


def test_every_forward_was_checked_identical_on_both_ranks(ranked):
    ranked.chat(PROMPTS[2], temperature=0, max_tokens=80, speculative=METHODS["ngram"])
    time.sleep(1.5)  # an idle heartbeat gathers the ranks' times
    status, report = ranked.get("/v1/spec_decode/metrics")
    assert status == 200
    assert report["ranks"] == 2
    assert report["rank_checked_forwards"] > 30  # a divergence would have failed its request
    step = report["last_step"]
    assert step["forwards"] >= 1 and 0 < step["broadcast_s"] < step["wall_s"]
    times = report["rank_times"]  # gathered at most once a second (and on idle heartbeats)
    assert [t["rank"] for t in times] == [0, 1]
    assert all(t["forwards"] > 30 and t["compute_s"] > 0 and t["wait_s"] > 0 for t in times), times
    metrics = urllib.request.urlopen(f"{ranked.url}/metrics").read().decode()
    assert 'specscope:rank_compute_seconds{rank="1"}' in metrics
    assert "specscope:rank_broadcast_seconds_count" in metrics


def test_the_window_s_server_line_shows_the_ranks(ranked):
    """What the window shows when connected (engines.remote.counters -> the server-load line):
    each rank's share of time in forwards and rank 0's broadcast per step, from two scrapes."""
    from app.gui.views.server_load import describe
    from engines.remote.counters import parse_load_counters, server_load
    from engines.remote.engine import fetch_metrics

    scraped = threading.Event()

    def busy():  # one request after another until both scrapes are taken (an answer may end early)
        while not scraped.is_set():
            ranked.chat(PROMPTS[3], temperature=0, max_tokens=300, speculative=METHODS["off"])

    thread = threading.Thread(target=busy)
    thread.start()
    time.sleep(1.0)
    before, t0 = parse_load_counters(fetch_metrics(ranked.url)), time.monotonic()
    time.sleep(2.5)
    after = parse_load_counters(fetch_metrics(ranked.url))
    scraped.set()
    thread.join(timeout=120)
    load = server_load(before, after, time.monotonic() - t0)
    assert load.rank_busy is not None and len(load.rank_busy) == 2 and all(0 < b <= 1 for b in load.rank_busy)
    assert load.broadcast_s is not None and load.broadcast_s > 0
    assert " 2 ranks busy " in describe(load) and "broadcast" in describe(load)


# -- faults ------------------------------------------------------------------------------------
def _long_request(server: RankServer, out: dict) -> threading.Thread:
    def run():
        t0 = time.monotonic()
        out["answer"] = server.chat(PROMPTS[0], temperature=0, max_tokens=3000, timeout=60,
                                    speculative=METHODS["ngram"])
        out["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_decoding(server: RankServer) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, report = server.get("/v1/spec_decode/metrics")
        if report.get("total_steps", 0) > 5:
            return
        time.sleep(0.1)
    raise AssertionError("the request did not start decoding")


@pytest.mark.parametrize("fault", ["killed", "stopped"])
def test_a_lost_rank_answers_503_and_every_process_exits(llama, tmp_path, fault):
    server = start_rank_server(llama, tmp_path, "--rank-timeout", "5")
    try:
        out: dict = {}
        thread = _long_request(server, out)
        _wait_decoding(server)
        rank1 = server.rank_pid(1)
        t0 = time.monotonic()
        os.kill(rank1, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        thread.join(timeout=40)
        status, answer = out["answer"]
        assert status == 503, answer
        assert answer["error"]["code"] == "rank_lost"
        assert time.monotonic() - t0 < 30
        wait_gone(server, 30)
        assert server.proc.returncode == 1  # the launcher says the ranks failed
        said = f"rank 1 (pid {rank1}) exited" if fault == "killed" else f"rank 1 (pid {rank1}) stopped"
        lines = server.lines_from("specscope serve: rank")
        assert len(lines) == 1 and said in lines[0], server.stderr()
    finally:
        server.stop()


def test_a_stopped_rank_zero_is_ended_by_its_follower(llama, tmp_path):
    """Rank 0 itself hangs: no 503 can come from it, but the follower hears no heartbeat, says
    so in one line, and ends the job: every process gone within the timeout and a few seconds."""
    server = start_rank_server(llama, tmp_path, "--rank-timeout", "5")
    try:
        rank0 = server.rank_pid(0)
        os.kill(rank0, signal.SIGSTOP)
        wait_gone(server, 30)
        lines = server.lines_from("specscope serve: rank 1:")
        assert len(lines) == 1 and "rank 0 sent nothing for 5 s" in lines[0] and "stopped" in lines[0], server.stderr()
    finally:
        server.stop()


def test_a_model_over_one_process_memory_limit_runs_on_two(tmp_path):
    from tests.engines.mlx_chat import checkpoints
    from tests.reliability.test_cli_faults import specscope

    big = str(checkpoints.make_tiny_llama(tmp_path / "big", hidden=512, layers=8))
    weights = sum(p.stat().st_size for p in (tmp_path / "big").glob("*.safetensors"))
    limit = f"{0.7 * weights / 2**30:.4f}"  # GB: 70% of the weights
    alone = specscope("serve", "--model", big, "--memory-limit", limit, "--port", "9")
    assert alone.returncode != 0
    assert "over --memory-limit" in alone.stderr and "--ranks N" in alone.stderr, alone.stderr
    server = start_rank_server(big, tmp_path, "--memory-limit", limit)
    try:
        status, answer = server.chat(PROMPTS[1], temperature=0, max_tokens=8)
        assert status == 200 and len(tokens(answer)) == 8, answer
    finally:
        server.stop()
    wait_gone(server, 30)
