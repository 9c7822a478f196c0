"""`specscope serve` over a chat model the batch cannot hold (a tiny Mamba: recurrent layers,
tests/engines/mlx_chat/checkpoints.py), which goes through the same queue as a batch of one
(app/serve/batching.py's OneAtATime): over real HTTP with the openai client, concurrent clients
each get their lone answer, one after another, and a client beyond --queue-size gets 503. The
adapter itself, over the same engine: an engine's error reaches its request only."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("mlx.core")
openai = pytest.importorskip("openai")

from app.serve.batching import OneAtATime  # noqa: E402
from app.serve.protocol import ServedModel  # noqa: E402
from app.serve.server import ServeConfig, Served, build_app, start_in_thread  # noqa: E402
from engines.runs import run_session  # noqa: E402
from engines.types import Request, Sampling, SpecConfig  # noqa: E402
from tests.app.serve.test_serve import gauge, scrape, _wait_for  # noqa: E402
from tests.engines.chat import load_chat  # noqa: E402

MODEL = "tiny-mamba"
PROMPTS = ["the cat is big and the dog is small", "a red bird and an old fish"]
SPEC = SpecConfig(method="ngram", steps=3)  # the server's launch setting: this model decodes plainly
LONG = 1500  # tokens of the first request: the engine stays busy while the others arrive


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    from tests.engines.mlx_chat.checkpoints import make_tiny_mamba

    engine = load_chat(make_tiny_mamba(tmp_path_factory.mktemp("mamba") / "mamba"))
    assert engine.loop is None  # the batch cannot hold it
    return engine


@pytest.fixture(scope="module")
def server(mamba):
    served = [Served(ServedModel(MODEL, "chat", SPEC), mamba)]
    running = start_in_thread(build_app(ServeConfig(queue_size=1, max_batch=4), served))
    yield running
    running.stop()


def lone(engine, prompt: str, max_tokens: int, **options):
    return run_session(engine, Request(kind="chat", prompt=prompt, max_tokens=max_tokens, spec=SPEC, **options))


def test_two_clients_get_their_lone_answers_one_after_another_and_a_third_gets_503(server, mamba):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    _wait_for(server, lambda t: gauge(t, "requests_processing") == 0)
    # the first runs long (no repetition stop: a tiny random model loops)
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}],
                                           max_tokens=LONG, stream=True, extra_body={"max_repeat": 0})
    first_chunks = iter(first)
    first_text = [next(first_chunks).choices[0].delta.content or ""]  # running now
    second: dict = {}

    def waiting():
        second["answer"] = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=24)

    thread = threading.Thread(target=waiting)
    thread.start()
    # it waits behind the first, which the engine runs alone
    _wait_for(server, lambda t: gauge(t, "requests_deferred") == 1 and gauge(t, "requests_processing") == 1)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=4)
    assert refused.value.status_code == 503 and refused.value.body["code"] == "server_busy"
    assert refused.value.response.headers["retry-after"].isdigit()
    first_text += [c.choices[0].delta.content or "" for c in first_chunks]
    thread.join(timeout=120)
    assert not thread.is_alive()

    assert "".join(first_text) == lone(mamba, PROMPTS[0], LONG, max_repeat=0).text
    alone = lone(mamba, PROMPTS[1], 24)
    answer = second["answer"]
    assert answer.choices[0].message.content == alone.text
    rounds = answer.model_extra["rounds"]
    assert [r["tokens"] for r in rounds] == [r.tokens for r in alone.rounds]
    assert "speculation unavailable" in rounds[0]["note"]  # served plainly, and the request hears why
    _wait_for(server, lambda t: gauge(t, "requests_processing") == 0 and gauge(t, "requests_deferred") == 0)


def test_an_engine_error_reaches_its_request_only(mamba):
    """A request the engine refuses (a temperature below 0, which the server's own check would
    have refused first) fails alone: the request behind it runs, and one whose client left while
    it waited ends cancelled without running."""
    batch = OneAtATime(mamba)
    bad = batch.submit(Request(kind="chat", prompt=PROMPTS[0], max_tokens=8, sampling=Sampling(temperature=-1.0)))
    good = batch.submit(Request(kind="chat", prompt=PROMPTS[1], max_tokens=8, spec=SPEC))
    gone = batch.submit(Request(kind="chat", prompt=PROMPTS[1], max_tokens=8), should_stop=lambda: True)
    outcomes: dict[int, list] = {bad.id: [], good.id: [], gone.id: []}
    while batch.busy:
        for turn, outcome in batch.step():
            outcomes[turn.id].append(outcome)
    assert len(outcomes[bad.id]) == 1 and "temperature" in str(outcomes[bad.id][0])
    assert [r.tokens for r in outcomes[good.id]] == [r.tokens for r in lone(mamba, PROMPTS[1], 8).rounds]
    assert [(r.finish, r.tokens) for r in outcomes[gone.id]] == [("cancelled", [])]
