"""`specscope serve` driven by the official `openai` client, over real HTTP on 127.0.0.1.

One server per module (uvicorn on its own thread, port chosen by the OS) over a tiny random
Llama loaded through the product's loader. The tiny model never emits EOS, so every run goes to
max_tokens: long runs are how a test keeps the engine busy."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("mlx.core")
openai = pytest.importorskip("openai")

from app.serve.protocol import ServedModel  # noqa: E402
from app.serve.server import ServeConfig, Served, build_app, start_in_thread  # noqa: E402
from engines.types import Request, SpecConfig  # noqa: E402
from engines.remote.counters import parse_spec_counters  # noqa: E402
from engines.runs import run_session  # noqa: E402

MODEL = "tiny-llama"
PROMPT = "the cat and the dog see the cat and the dog see the cat"
LONG = 3000  # max_tokens of a run that keeps the engine busy for seconds (cancelled before its end)


@pytest.fixture(scope="module", params=[1, 4], ids=["one-at-a-time", "batch-4"])
def server(engine, request):
    """Every test runs against both front doors: one request at a time (--max-batch 1) and
    the batch (--max-batch 4); the answers must not tell them apart."""
    served = [Served(ServedModel(MODEL, "chat", SpecConfig(method="ngram", steps=3)), engine)]
    running = start_in_thread(build_app(ServeConfig(queue_size=1, max_batch=request.param), served))
    running.extra["max_batch"] = request.param
    yield running
    running.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def local_run(engine, max_tokens=24, spec=None):
    request = Request(kind="chat", prompt=PROMPT, max_tokens=max_tokens, spec=spec or SpecConfig(method="ngram", steps=3))
    return run_session(engine, request)


def scrape(server) -> str:
    with urllib.request.urlopen(f"{server.url}/metrics") as r:
        return r.read().decode()


def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"specscope:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")


def counter(text: str, name: str) -> float:
    return sum(float(line.split()[1]) for line in text.splitlines() if line.startswith(f"specscope:{name}"))


def ask(client, **kw):
    body = dict(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=24)
    return client.chat.completions.create(**(body | kw))


def test_non_streaming_answer_equals_the_local_engine_with_timings_and_rounds(client, engine):
    local = local_run(engine)
    resp = ask(client)
    assert resp.choices[0].message.content == local.text
    timings, rounds = resp.model_extra["timings"], resp.model_extra["rounds"]
    assert [r["tokens"] for r in rounds] == [r.tokens for r in local.rounds]
    assert timings["predicted_n"] == len(local.tokens) == resp.usage.completion_tokens
    assert timings["prompt_n"] == engine.count_prompt_tokens(Request(prompt=PROMPT)) == resp.usage.prompt_tokens
    assert timings["draft_n"] == local.stats().proposed > 0
    assert timings["draft_n_accepted"] == local.stats().accepted
    assert timings["predicted_per_second"] > 0
    assert resp.choices[0].finish_reason == "length"


def test_streaming_sends_one_round_per_chunk_and_timings_last(client, engine):
    local = local_run(engine)
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
    rounds = [c.model_extra["round"] for c in chunks if "round" in (c.model_extra or {})]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == local.text
    assert [(r["proposed"], r["accepted"], r["tokens"]) for r in rounds] == \
        [(r.proposed, r.accepted, r.tokens) for r in local.rounds]
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.model_extra["timings"]["draft_n"] == sum(r["proposed"] for r in rounds)
    assert final.model_extra["timings"]["draft_n_accepted"] == sum(r["accepted"] for r in rounds)
    assert chunks[-1].usage.completion_tokens == len(local.tokens)


def test_metrics_counters_add_up_to_the_responses_timings(client, server):
    before = parse_spec_counters(scrape(server))
    before_text = scrape(server)
    answers = [ask(client, max_tokens=n) for n in (9, 17)]
    after = parse_spec_counters(scrape(server))
    after_text = scrape(server)
    timings = [a.model_extra["timings"] for a in answers]
    rounds = [r for a in answers for r in a.model_extra["rounds"]]
    diff = after.minus(before)
    assert diff.draft_tokens == sum(t["draft_n"] for t in timings) > 0
    assert diff.accepted_tokens == sum(t["draft_n_accepted"] for t in timings)
    assert diff.drafts == sum(1 for r in rounds if r["proposed"])
    per_pos = {j: sum(1 for r in rounds if len(r["accept_flags"]) > j and r["accept_flags"][j]) for j in range(3)}
    assert {p: v for p, v in diff.accepted_per_pos.items() if v} == {p: v for p, v in per_pos.items() if v}
    for name, key in (("tokens_predicted_total", "predicted_n"), ("prompt_tokens_total", "prompt_n")):
        assert counter(after_text, name) - counter(before_text, name) == sum(t[key] for t in timings)


def test_per_request_speculative_overrides_the_launch_setting(client, engine):
    off = ask(client, extra_body={"speculative": {"method": "off"}})
    assert off.model_extra["timings"]["draft_n"] == 0
    assert off.choices[0].message.content == local_run(engine).text  # lossless: same greedy text
    two = ask(client, extra_body={"speculative": {"steps": 2}})
    proposed = [r["proposed"] for r in two.model_extra["rounds"]]
    assert max(proposed) == 2  # the launch setting drafts 3
    preset = ask(client, extra_body={"speculative": {"preset": "throughput"}})  # B = 2: one draft a round
    assert max(r["proposed"] for r in preset.model_extra["rounds"]) == 1


def _stream_long(client, **kw):
    return ask(client, stream=True, max_tokens=LONG, **kw)


def _wait_for(server, predicate, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = scrape(server)
        if predicate(text):
            return text
        time.sleep(0.02)
    raise AssertionError("the server never reached the expected state")


def test_disconnect_cancels_the_generation(client, server):
    idle = _wait_for(server, lambda t: gauge(t, "requests_processing") == 0)
    stream = _stream_long(client)
    for _, chunk in zip(range(3), stream):
        pass
    stream.close()  # the client goes away mid-stream
    after = _wait_for(server, lambda t: gauge(t, "requests_processing") == 0)
    generated = counter(after, "tokens_predicted_total") - counter(idle, "tokens_predicted_total")
    assert 0 < generated < LONG  # stopped long before its max_tokens
    assert counter(after, 'requests_total{outcome="cancelled"}') > counter(idle, 'requests_total{outcome="cancelled"}')


def test_concurrent_clients_are_queued_one_at_a_time_and_a_full_queue_answers_503(client, server, engine):
    if server.extra["max_batch"] != 1:
        pytest.skip("one at a time is --max-batch 1; the batch's queue: tests/app/serve/test_batch_serve.py")
    _wait_for(server, lambda t: gauge(t, "requests_processing") == 0)
    first = _stream_long(client)
    next(iter(first))  # running now
    windows: dict[str, tuple[float, float]] = {}

    def queued():
        chunks = []
        for c in ask(client, stream=True):
            chunks.append(time.monotonic())
        windows["second"] = (chunks[0], chunks[-1])

    second = threading.Thread(target=queued)
    second.start()
    _wait_for(server, lambda t: gauge(t, "requests_deferred") == 1)  # waiting behind the first
    with pytest.raises(openai.APIStatusError) as refused:
        ask(client)
    assert refused.value.status_code == 503
    assert refused.value.response.headers["retry-after"].isdigit()
    assert refused.value.body["code"] == "server_busy"
    first_end = None
    for _, chunk in zip(range(5), first):
        first_end = time.monotonic()
    first.close()
    second.join(timeout=60)
    # the queued request produced nothing while the first one held the engine
    assert windows["second"][0] > first_end


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}).encode(), 404, "model_not_found"),
    (json.dumps({"model": MODEL, "messages": []}).encode(), 400, "invalid_messages"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "the " * 4100}]}).encode(), 400,
     "context_length_exceeded"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}).encode(), 400,
     "invalid_value"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                 "speculative": {"method": "telepathy"}}).encode(), 400, "invalid_speculative"),
])
def test_bad_requests_get_an_openai_style_error(server, body, status, code):
    req = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req)
    assert err.value.code == status
    error = json.loads(err.value.read())["error"]
    assert error["code"] == code and error["message"] and error["type"]


def test_unknown_model_through_the_client(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["code"] == "model_not_found"


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with urllib.request.urlopen(f"{server.url}/health") as r:
        assert json.loads(r.read()) == {"status": "ok", "ranks": 1,
                                        "engines": {MODEL: {"state": "idle", "running": 0, "waiting": 0}}}


def test_an_api_key_is_required_when_set(engine):
    served = [Served(ServedModel(MODEL, "chat"), engine)]
    running = start_in_thread(build_app(ServeConfig(api_key="sesame"), served))
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{running.url}/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=f"{running.url}/v1", api_key="sesame", max_retries=0)
        assert [m.id for m in good.models.list().data] == [MODEL]
    finally:
        running.stop()


def test_a_public_host_needs_a_key_or_insecure():
    from engines.types import EngineError

    with pytest.raises(EngineError, match="--api-key"):
        ServeConfig(host="0.0.0.0").check()
    ServeConfig(host="0.0.0.0", api_key="k").check()
    ServeConfig(host="0.0.0.0", insecure=True).check()


def test_the_remote_engine_against_specscope_serve_matches_the_local_engine(server, engine):
    from engines.remote.engine import RemoteEngine

    remote = RemoteEngine.load(server.url)
    assert (remote.server, remote.model) == ("specscope", MODEL)
    spec = SpecConfig(method="ngram", steps=3)
    local = local_run(engine, spec=spec)
    request = Request(kind="chat", prompt=PROMPT, max_tokens=24, spec=spec)
    rounds = list(remote.generate(request))
    assert [r.tokens for r in rounds] == [r.tokens for r in local.rounds]
    assert [(r.proposed, r.accepted, r.accept_flags) for r in rounds] == \
        [(r.proposed, r.accepted, r.accept_flags) for r in local.rounds]
    assert remote.decode(rounds[1].tokens) == engine.decode(rounds[1].tokens)
    assert remote.last_report.draft_n == local.stats().proposed
    assert remote.last_report.draft_n_accepted == local.stats().accepted


@pytest.mark.parametrize("kind", ["vllm", "sglang", "openai-compatible"])
def test_a_server_without_per_round_records_is_read_through_its_prometheus_counters(server, engine, kind):
    """How the remote engine reads vLLM and SGLang: no draft figures in the stream, so the
    response's totals are the difference of the server's /metrics counters before and after.
    Run against the real `specscope serve` taken as that kind of server (its counters carry
    vLLM's names), so the totals can be checked against the engine's own rounds; the rounds
    themselves stay without draft figures, never invented."""
    from engines.remote.engine import RemoteEngine

    remote = RemoteEngine(url=server.url, model=MODEL, server=kind)
    local = local_run(engine, max_tokens=20)  # the server's launch setting: ngram, 3 drafts
    request = Request(kind="chat", prompt=PROMPT, max_tokens=20, spec=SpecConfig(method="ngram", steps=3))
    rounds = list(remote.generate(request))
    assert "".join(r.text for r in rounds) == local.text
    assert all(r.proposed == 0 and r.tokens == [] for r in rounds)
    assert "not reported" in rounds[0].note and rounds[-1].finish == "length"
    report, stats = remote.last_report, local.stats()
    assert (report.server, report.source) == (kind, "metrics")
    assert (report.draft_n, report.draft_n_accepted) == (stats.proposed, stats.accepted) and stats.accepted > 0
    assert report.num_drafts == sum(1 for r in local.rounds if r.proposed)
    per_pos = {j: sum(1 for r in local.rounds if len(r.accept_flags) > j and r.accept_flags[j]) for j in range(3)}
    assert {p: v for p, v in report.accepted_per_pos.items() if v} == {p: v for p, v in per_pos.items() if v}
    assert report.predicted_n == 20 and report.prompt_n > 0  # from the stream's usage chunk


def test_the_cli_refuses_a_public_host_without_a_key_in_one_line(capsys):
    from app.cli.main import main

    assert main(["serve", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--api-key" in err and "Traceback" not in err


def test_cli_chat_on_the_server_prints_the_local_text_and_the_servers_figures(server, engine, capsys):
    from app.cli.main import main

    local = local_run(engine)
    assert main(["chat", "--server", server.url, "--prompt", PROMPT, "-m", "24", "--steps", "3"]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip("\n") == local.text
    assert f"draft_n {local.stats().proposed}, draft_n_accepted {local.stats().accepted} (from rounds)" in err


def test_cli_bad_server_url_is_one_line(capsys):
    from app.cli.main import main

    assert main(["chat", "--server", "http://127.0.0.1:9", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach" in err


def test_bench_chat_on_the_server_beside_the_local_engine_and_beside_a_baseline_server(server, engine, tmp_path, capsys):
    from app.cli.main import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPT + "\n")
    common = ["--prompts", str(prompts), "--runs", "1", "--warmup", "0", "-m", "12", "--steps", "3"]
    assert main(["bench", "chat", "--server", server.url, "--model", engine.model_path,
                 "--out", str(tmp_path / "local"), *common]) == 0
    assert main(["bench", "chat", "--server", server.url, "--baseline-server", server.url,
                 "--out", str(tmp_path / "twin"), *common]) == 0
    for folder, baseline in (("local", "local engine"), ("twin", server.url)):
        doc = json.loads(next((tmp_path / folder).glob("bench-*.json")).read_text())
        assert doc["settings"]["baseline"] == baseline
        case = doc["cases"][0]
        # the same engine and request on both sides: the same text, and the server's figures kept
        assert case["identical"] and case["tokens"] == 12 and case["acceptance"] > 0
        assert doc["settings"]["server_reports"][0]["draft_n"] > 0
    assert "baseline: local engine" in capsys.readouterr().err


def test_n_choices(client, server, engine):
    """OpenAI's n: n choices, each its own sequence (in the batch, sharing the prompt's prefill).
    At T=0 every choice is the lone answer; with a seed, choice 0 is the n=1 answer for that
    seed and the others differ; a stream tags each delta with its choice and ends each choice
    with its own finish_reason and timings; usage counts every choice."""
    alone = local_run(engine, max_tokens=16)
    resp = ask(client, max_tokens=16, n=3)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert all(c.message.content == alone.text for c in resp.choices)
    assert resp.usage.completion_tokens == 3 * len(alone.tokens)
    assert all(c.model_extra["timings"]["predicted_n"] == len(alone.tokens) for c in resp.choices)

    one = ask(client, max_tokens=16, temperature=1.0, seed=7)
    three = ask(client, max_tokens=16, temperature=1.0, seed=7, n=3)
    assert three.choices[0].message.content == one.choices[0].message.content
    assert len({c.message.content for c in three.choices}) > 1

    texts, finished = {0: "", 1: ""}, {}
    for c in ask(client, max_tokens=16, n=2, stream=True):
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finished[ch.index] = (ch.finish_reason, c.model_extra["timings"]["predicted_n"])
    assert texts == {0: alone.text, 1: alone.text}
    assert finished == {0: ("length", 16), 1: ("length", 16)}


@pytest.mark.parametrize("n", [0, 9, "2", True])
def test_n_out_of_range_is_refused(server, n):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": n}).encode()
    req = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req)
    assert refused.value.code == 400 and json.loads(refused.value.read())["error"]["param"] == "n"
