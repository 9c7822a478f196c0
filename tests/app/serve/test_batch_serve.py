"""`specscope serve --max-batch 4`: concurrent clients share one target forward per step, and
each still receives exactly what it receives alone, over real HTTP with the openai client.
The full batch plus the queue answers 503; a gone client's row is freed; /metrics shows the
batch (num_requests_running, batch size per step, step latency) and /v1/spec_decode/metrics
the speculation totals, which add up to the responses' own timings."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

pytest.importorskip("mlx.core")
openai = pytest.importorskip("openai")

from app.serve.protocol import ServedModel  # noqa: E402
from app.serve.server import ServeConfig, Served, build_app, start_in_thread  # noqa: E402
from engines.types import SpecConfig  # noqa: E402
from tests.app.serve.test_serve import MODEL, LONG, counter, gauge, scrape, _wait_for  # noqa: E402

PROMPTS = ["the cat and the dog see the cat and the dog see the cat", "a red bird and an old fish",
           "the big house on the old road and the big house", "see the moon"]
SPECS = [SpecConfig("ngram", 3), SpecConfig("off", 0), SpecConfig("ngram", 7), SpecConfig("ngram", 1)]


@pytest.fixture(scope="module")
def batch_server(engine):
    served = [Served(ServedModel(MODEL, "chat", SpecConfig(method="ngram", steps=3)), engine)]
    running = start_in_thread(build_app(ServeConfig(queue_size=1, max_batch=4), served))
    yield running
    running.stop()


@pytest.fixture
def client(batch_server):
    return openai.OpenAI(base_url=f"{batch_server.url}/v1", api_key="unused", max_retries=0)


def body(prompt: str, spec: SpecConfig, max_tokens: int = 40) -> dict:
    return dict(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                extra_body={"speculative": {"method": spec.method, "steps": spec.steps}})


def test_concurrent_requests_each_get_their_lone_answer(client, batch_server, engine):
    from engines.types import Request
    from engines.runs import run_session

    before = scrape(batch_server)
    answers: dict[int, object] = {}

    def one(i):
        answers[i] = client.chat.completions.create(**body(PROMPTS[i], SPECS[i]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i in range(4):
        alone = run_session(engine, Request(kind="chat", prompt=PROMPTS[i], max_tokens=40, spec=SPECS[i]))
        assert answers[i].choices[0].message.content == alone.text, i
        # each response's figures are its own sequence's rounds (the controller may have drafted
        # fewer than alone: what it offered, not what came out, depends on the batch)
        timings, rounds = answers[i].model_extra["timings"], answers[i].model_extra["rounds"]
        assert [t for r in rounds for t in r["tokens"]] == alone.tokens
        assert timings["predicted_n"] == len(alone.tokens)
        assert timings["draft_n"] == sum(r["proposed"] for r in rounds) <= sum(r.proposed for r in alone.rounds)
        assert timings["draft_n_accepted"] == sum(r["accepted"] for r in rounds)
    after = scrape(batch_server)
    steps = counter(after, "batch_size_count") - counter(before, "batch_size_count")
    single = counter(after, 'batch_size_bucket{le="1.0"}') - counter(before, 'batch_size_bucket{le="1.0"}')
    assert steps > 0 and single < steps  # some steps carried more than one sequence


def test_a_full_batch_and_queue_answer_503_and_a_gone_client_frees_its_row(client, batch_server):
    _wait_for(batch_server, lambda t: gauge(t, "num_requests_running") == 0)
    streams = [client.chat.completions.create(stream=True, **body(PROMPTS[i], SPECS[i], LONG)) for i in range(4)]
    for s in streams:
        next(iter(s))
    _wait_for(batch_server, lambda t: gauge(t, "num_requests_running") == 4)
    waiting = threading.Thread(target=lambda: list(client.chat.completions.create(stream=True, **body(PROMPTS[0], SPECS[0], 8))))
    waiting.start()
    _wait_for(batch_server, lambda t: gauge(t, "num_requests_waiting") == 1)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(**body(PROMPTS[1], SPECS[1]))
    assert refused.value.status_code == 503 and refused.value.body["code"] == "server_busy"
    assert refused.value.response.headers["retry-after"].isdigit()
    streams[0].close()  # a client goes away: its row goes to the waiting request
    waiting.join(timeout=60)
    assert not waiting.is_alive()
    for s in streams[1:]:
        s.close()
    _wait_for(batch_server, lambda t: gauge(t, "num_requests_running") == 0 and gauge(t, "num_requests_waiting") == 0)


def test_spec_decode_metrics_add_up_to_the_responses(client, batch_server):
    def spec_metrics():
        with urllib.request.urlopen(f"{batch_server.url}/v1/spec_decode/metrics") as r:
            return json.loads(r.read())

    _wait_for(batch_server, lambda t: gauge(t, "num_requests_running") == 0)
    before = spec_metrics()
    resp = client.chat.completions.create(**body(PROMPTS[0], SPECS[0]))
    after = spec_metrics()
    timings = resp.model_extra["timings"]
    assert after["total_proposed"] - before["total_proposed"] == timings["draft_n"]
    assert after["total_accepted"] - before["total_accepted"] == timings["draft_n_accepted"]
    # drafts asked: at least what was proposed (an n-gram miss proposes fewer than asked)
    assert after["total_asked"] - before["total_asked"] >= timings["draft_n"]
    assert after["max_batch"] == 4 and 0 <= after["acceptance_rate_ema"] <= 1
    assert set(after) >= {"acceptance_rate_overall", "avg_tokens_per_step", "total_steps", "total_fallback_steps",
                          "total_bonus_tokens", "current_k", "total_asked"}


def test_a_batch_that_cannot_fit_in_memory_is_refused_at_start_in_one_line(engine):
    from engines.types import EngineError
    from engines.batch.cache import kv_bytes_per_token

    per_token = kv_bytes_per_token(engine.model)  # the tiny llama: 2 layers x 2 KV heads x 12 x 4 B x 2
    assert per_token == 2 * 2 * 2 * 12 * 4
    served = [Served(ServedModel(MODEL, "chat", SpecConfig(method="ngram", steps=3)), engine)]
    # a machine with 16 MB: the weights and 8 rows of 4096 tokens (12 MB) cannot fit in its 3/4
    with pytest.raises(EngineError) as refused:
        build_app(ServeConfig(max_batch=8, memory_bytes=16 * 2**20), served)
    assert "--max-batch 8" in str(refused.value) and "\n" not in str(refused.value)
    build_app(ServeConfig(max_batch=8, memory_bytes=2**34), served)  # 16 GB: it fits


def test_bench_serve_and_bench_chat_concurrency_report_every_level(batch_server, engine, tmp_path, capsys):
    """`bench serve --server URL` (our server: speculation off beside it at every level) and
    `bench chat --concurrency` (the batch in process) write one row per level and mode, every
    request counted, the speculative outputs equal to off's at T=0."""
    from app.cli.main import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    common = ["--prompts", str(prompts), "--concurrency", "1,3", "--requests", "5", "-m", "10", "--steps", "4"]
    assert main(["bench", "serve", "--server", batch_server.url, "--out", str(tmp_path / "serve"), *common]) == 0
    assert main(["bench", "chat", "--model", engine.model_path, "--out", str(tmp_path / "chat"), *common]) == 0
    for folder in ("serve", "chat"):
        doc = json.loads(next((tmp_path / folder).glob("bench-concurrency-*.json")).read_text())
        rows = doc["levels"]
        assert [(r["mode"], r["concurrency"]) for r in rows] == [("spec", 1), ("off", 1), ("spec", 3), ("off", 3)]
        assert all(r["requests"] == 5 and r["tokens"] == 50 and r["aggregate_tok_s"] > 0 for r in rows)
        assert all(r["identical_to_off"] for r in rows if r["mode"] == "spec")
        assert any(r["proposed"] > 0 for r in rows if r["mode"] == "spec")
        assert (tmp_path / folder).glob("bench-concurrency-*.csv")
    assert "agg tok/s" in capsys.readouterr().err


def test_the_server_load_read_from_metrics(client, batch_server):
    """What the window shows when connected (engines.remote.counters.server_load): requests
    running while two streams are held open, then the steps' latency, mean batch size and
    tokens per second between two scrapes."""
    import time

    from engines.remote.counters import parse_load_counters, server_load
    from engines.remote.engine import fetch_metrics

    _wait_for(batch_server, lambda t: gauge(t, "num_requests_running") == 0)
    before, t0 = parse_load_counters(fetch_metrics(batch_server.url)), time.monotonic()
    streams = [client.chat.completions.create(stream=True, **body(PROMPTS[i], SPECS[i], LONG)) for i in range(2)]
    for s in streams:
        for _, _chunk in zip(range(20), s):
            pass
    after = parse_load_counters(fetch_metrics(batch_server.url))
    load = server_load(before, after, time.monotonic() - t0)
    for s in streams:
        s.close()
    assert load.running == 2 and load.waiting == 0
    assert load.step_latency_s > 0 and load.tokens_per_s > 0 and 1 < load.mean_batch <= 2


def test_a_prompt_asked_again_is_not_read_again(client, batch_server):
    """The prompt cache (on by default, --prompt-cache MB): the second time a prompt comes, its
    tokens are found, not read -- /metrics counts them (vLLM's prefix_cache_queries / hits) --
    and the answer is the same."""
    prompt = "the old moon and the red bird see the big house on the old road"
    _wait_for(batch_server, lambda t: gauge(t, "num_requests_running") == 0)
    first = client.chat.completions.create(**body(prompt, SPECS[0]))
    before = scrape(batch_server)
    again = client.chat.completions.create(**body(prompt, SPECS[0]))
    after = scrape(batch_server)
    assert again.choices[0].message.content == first.choices[0].message.content
    asked = counter(after, "prefix_cache_queries") - counter(before, "prefix_cache_queries")
    found = counter(after, "prefix_cache_hits") - counter(before, "prefix_cache_hits")
    assert asked > 10 and found == asked  # every prompt token but the last, found


def test_health_says_idle_then_stopped_when_the_batch_loop_faults(engine, monkeypatch):
    """A fault in the scheduler itself (here its gauges, after a step) ends the batch loop: the
    request in it hears a 503, later ones are refused with one, and /health answers 503 so a
    supervisor restarts the server."""
    from app.serve.batching import BatchQueue

    served = [Served(ServedModel(MODEL, "chat", SpecConfig(method="ngram", steps=3)), engine)]
    running = start_in_thread(build_app(ServeConfig(queue_size=1, max_batch=2), served))
    try:
        with urllib.request.urlopen(f"{running.url}/health") as r:
            assert json.loads(r.read()) == {"status": "ok", "ranks": 1,
                                            "engines": {MODEL: {"state": "idle", "running": 0, "waiting": 0}}}

        def gauges_fault(self):
            raise RuntimeError("a fault in the scheduler")

        monkeypatch.setattr(BatchQueue, "_gauges", gauges_fault)
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        for _ in range(2):  # the request in the loop, then one after it stopped
            with pytest.raises(openai.InternalServerError) as err:
                client.chat.completions.create(**body(PROMPTS[0], SPECS[0]))
            assert err.value.status_code == 503 and "restart the server" in str(err.value)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{running.url}/health")
        assert err.value.code == 503
        assert json.loads(err.value.read())["engines"][MODEL]["state"] == "stopped"
    finally:
        running.stop()
