"""`specscope serve` talks only to its own machine (issue 28): foreign or empty Host values, bodies
that are not JSON and origins not allowed are refused before any generation starts; loopback
names, --allowed-hosts names and --allowed-origins origins are served.

Real sockets throughout: uvicorn on its own thread over a tiny random Llama, requests written with
http.client so that Host, Origin and Content-Type are exactly what a browser (or an attacker's
page) would send. "No generation started" is read from the server's own /metrics."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass

import pytest

pytest.importorskip("mlx.core")
openai = pytest.importorskip("openai")

from app.serve.guard import is_loopback_name, split_host  # noqa: E402
from app.serve.protocol import ServedModel  # noqa: E402
from app.serve.server import ServeConfig, Served, build_app, start_in_thread  # noqa: E402
from engines.types import SpecConfig  # noqa: E402

MODEL = "tiny-llama"
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "the cat and the dog"}],
                   "max_tokens": 4}).encode()
JSON = {"Content-Type": "application/json"}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def error_code(self) -> str:
        return json.loads(self.body)["error"]["code"]


def send(port: int, method: str, path: str, host: str, body: bytes | None = None,
         headers: dict[str, str] | None = None, address: str = "127.0.0.1") -> Reply:
    """One request with exactly the Host (and other headers) given."""
    conn = http.client.HTTPConnection(address, port, timeout=60)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def served_counts(port: int) -> dict[str, float]:
    """The engine's work so far, from /metrics: requests answered and tokens generated."""
    text = send(port, "GET", "/metrics", f"127.0.0.1:{port}").body.decode()
    totals = {"requests": 0.0, "tokens": 0.0, "rounds": 0.0}
    for line in text.splitlines():
        for key, name in (("requests", "specscope:requests_total"), ("tokens", "specscope:tokens_predicted_total"),
                          ("rounds", "specscope:spec_decode_num_drafts_total")):
            if line.startswith(name):
                totals[key] += float(line.split()[-1])
    return totals


def serving(engine, config: ServeConfig, bind: str = "127.0.0.1"):
    served = [Served(ServedModel(MODEL, "chat", SpecConfig(method="ngram", steps=3)), engine)]
    return start_in_thread(build_app(config, served), host=bind)


@pytest.fixture(scope="module")
def server(engine):
    running = serving(engine, ServeConfig())
    yield running
    running.stop()


EVIL = "evil.example.com:{port}"
REFUSALS = [  # (what, method, Host, body, headers, status, code); {port} is the bound port
    ("foreign Host", "POST", EVIL, CHAT, JSON, 403, "host_not_allowed"),
    ("foreign Host, its own Origin, text/plain (the rebinding attack)", "POST", EVIL, CHAT,
     {"Content-Type": "text/plain", "Origin": "http://" + EVIL}, 403, "host_not_allowed"),
    ("foreign Host listing models", "GET", EVIL, None, {}, 403, "host_not_allowed"),
    ("empty Host", "POST", ":{port}", CHAT, JSON, 403, "host_not_allowed"),
    ("a name that starts like a loopback address", "POST", "127.0.0.1.evil.example.com:{port}", CHAT, JSON, 403,
     "host_not_allowed"),
    ("localhost as a DNS label", "POST", "localhost.evil.example.com:{port}", CHAT, JSON, 403, "host_not_allowed"),
    ("an IPv6 literal that is not loopback", "POST", "[2001:db8::1]:{port}", CHAT, JSON, 403, "host_not_allowed"),
    ("IPv6 loopback on another port", "POST", "[::1]:1", CHAT, JSON, 403, "host_not_allowed"),
    ("localhost without the port (port 80)", "POST", "localhost", CHAT, JSON, 403, "host_not_allowed"),
    ("text/plain body", "POST", "127.0.0.1:{port}", CHAT, {"Content-Type": "text/plain"}, 415,
     "unsupported_media_type"),
    ("form body", "POST", "127.0.0.1:{port}", b"model=tiny-llama&messages=hi",
     {"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
    ("no Content-Type", "POST", "127.0.0.1:{port}", CHAT, {}, 415, "unsupported_media_type"),
    ("an Origin not allowed", "POST", "localhost:{port}", CHAT, JSON | {"Origin": "http://evil.example.com"}, 403,
     "origin_not_allowed"),
    ("a preflight from an Origin (none allowed)", "OPTIONS", "localhost:{port}", None,
     {"Origin": "http://evil.example.com", "Access-Control-Request-Method": "POST"}, 403, "origin_not_allowed"),
]


@pytest.mark.parametrize("what, method, host, body, headers, status, code", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_with_its_status_and_no_generation_started(server, what, method, host, body, headers, status, code):
    port = server.port
    before = served_counts(port)
    headers = {k: v.format(port=port) for k, v in headers.items()}
    reply = send(port, method, "/v1/models" if method == "GET" else "/v1/chat/completions", host.format(port=port),
                 body, headers)
    assert (reply.status, reply.error_code()) == (status, code)
    error = json.loads(reply.body)["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert not any(name.startswith("access-control-") for name in reply.headers)
    assert served_counts(port) == before  # nothing generated, nothing counted


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.5.6.7", "[::1]", "app.localhost", "LOCALHOST"])
def test_loopback_names_with_the_bound_port_are_served(server, host):
    before = served_counts(server.port)
    reply = send(server.port, "POST", "/v1/chat/completions", f"{host}:{server.port}", CHAT,
                 JSON | {"Content-Type": "application/json; charset=utf-8"})
    assert reply.status == 200, reply.body
    assert json.loads(reply.body)["usage"]["completion_tokens"] == 4
    assert not any(name.startswith("access-control-") for name in reply.headers)  # no CORS unless asked
    assert served_counts(server.port)["tokens"] == before["tokens"] + 4


def test_ipv6_loopback_bind_serves_its_literal_and_refuses_a_foreign_host(engine):
    with socket.socket(socket.AF_INET6) as probe:
        try:
            probe.bind(("::1", 0))
        except OSError as e:
            pytest.skip(f"no IPv6 loopback here: {e}")
    running = serving(engine, ServeConfig(host="::1"), bind="::1")
    try:
        port = running.port
        ok = send(port, "GET", "/v1/models", f"[::1]:{port}", address="::1")
        assert ok.status == 200 and [m["id"] for m in json.loads(ok.body)["data"]] == [MODEL]
        refused = send(port, "POST", "/v1/chat/completions", f"evil.example.com:{port}", CHAT, JSON, address="::1")
        assert (refused.status, refused.error_code()) == (403, "host_not_allowed")
    finally:
        running.stop()


def test_allowed_hosts_adds_a_name_on_any_port_and_nothing_else(engine):
    running = serving(engine, ServeConfig(allowed_hosts=("specscope.local", "Proxy.Example.org")))
    try:
        port = running.port
        for host in ("specscope.local", f"specscope.local:{port}", "proxy.example.org:443", f"localhost:{port}"):
            reply = send(port, "POST", "/v1/chat/completions", host, CHAT, JSON)
            assert reply.status == 200, (host, reply.body)
        refused = send(port, "POST", "/v1/chat/completions", f"other.local:{port}", CHAT, JSON)
        assert (refused.status, refused.error_code()) == (403, "host_not_allowed")
    finally:
        running.stop()


def test_allowed_origins_answer_the_preflight_for_their_origin_only(engine):
    origin = "http://localhost:3000"
    running = serving(engine, ServeConfig(allowed_origins=(origin,)))
    try:
        port, host = running.port, f"localhost:{running.port}"
        preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        ok = send(port, "OPTIONS", "/v1/chat/completions", host, None, preflight | {"Origin": origin})
        assert ok.status == 200 and ok.headers["access-control-allow-origin"] == origin
        assert "POST" in ok.headers["access-control-allow-methods"]
        before = served_counts(port)
        other = send(port, "OPTIONS", "/v1/chat/completions", host, None, preflight | {"Origin": "http://localhost:3001"})
        assert (other.status, other.error_code()) == (403, "origin_not_allowed")
        assert "access-control-allow-origin" not in other.headers
        post = send(port, "POST", "/v1/chat/completions", host, CHAT, JSON | {"Origin": "http://evil.example.com"})
        assert (post.status, post.error_code()) == (403, "origin_not_allowed")
        assert served_counts(port) == before
        # the allowed origin's real request: answered, with its CORS header
        real = send(port, "POST", "/v1/chat/completions", host, CHAT, JSON | {"Origin": origin})
        assert real.status == 200 and real.headers["access-control-allow-origin"] == origin
        # and a foreign Host stays refused even with the allowed Origin
        rebound = send(port, "POST", "/v1/chat/completions", f"evil.example.com:{port}", CHAT, JSON | {"Origin": origin})
        assert (rebound.status, rebound.error_code()) == (403, "host_not_allowed")
    finally:
        running.stop()


def test_off_loopback_the_key_guards_and_the_flags_still_apply(engine):
    """ServeConfig.host says where the server is meant to listen; this test binds 127.0.0.1 all
    the same, so it does not open the machine while it runs."""
    running = serving(engine, ServeConfig(host="0.0.0.0", api_key="sesame"))
    try:
        port, lan = running.port, f"192.168.1.20:{running.port}"  # a LAN name the server cannot know
        key = {"Authorization": "Bearer sesame"}
        assert send(port, "POST", "/v1/chat/completions", lan, CHAT, JSON | key).status == 200
        assert send(port, "POST", "/v1/chat/completions", lan, CHAT, JSON).status == 401
        assert send(port, "POST", "/v1/chat/completions", lan, CHAT, key | {"Content-Type": "text/plain"}).status == 415
        origin = send(port, "POST", "/v1/chat/completions", lan, CHAT, JSON | key | {"Origin": "http://evil.example.com"})
        assert (origin.status, origin.error_code()) == (403, "origin_not_allowed")
    finally:
        running.stop()
    running = serving(engine, ServeConfig(host="0.0.0.0", api_key="sesame", allowed_hosts=("gpu-box.lan",)))
    try:
        port, key = running.port, {"Authorization": "Bearer sesame"}
        assert send(port, "POST", "/v1/chat/completions", f"gpu-box.lan:{port}", CHAT, JSON | key).status == 200
        refused = send(port, "POST", "/v1/chat/completions", f"192.168.1.20:{port}", CHAT, JSON | key)
        assert (refused.status, refused.error_code()) == (403, "host_not_allowed")
    finally:
        running.stop()


def test_the_openai_client_and_the_remote_engine_are_unaffected(engine):
    """They send JSON and a real Host; with a key and an allowed origin configured they still work."""
    from engines.types import Request
    from engines.remote.engine import RemoteEngine

    running = serving(engine, ServeConfig(api_key="sesame", allowed_origins=("http://localhost:3000",)))
    try:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="sesame", max_retries=0)
        resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "the cat"}],
                                              max_tokens=5)
        assert resp.usage.completion_tokens == 5
        remote = RemoteEngine.load(running.url, api_key="sesame")
        rounds = list(remote.generate(Request(kind="chat", prompt="the cat", max_tokens=5,
                                              spec=SpecConfig(method="ngram", steps=3))))
        assert sum(len(r.tokens) for r in rounds) == 5
    finally:
        running.stop()


@pytest.mark.parametrize("value, parsed", [
    ("localhost:8000", ("localhost", 8000)), ("127.0.0.1", ("127.0.0.1", None)), ("[::1]:80", ("[::1]", 80)),
    ("Example.COM:1", ("example.com", 1)), (":8000", None), ("", None), ("[::1", None), ("a:b", None),
    ("a:80:80", None), ("[::1]x", None),
])
def test_split_host(value, parsed):
    assert split_host(value) == parsed


@pytest.mark.parametrize("name, loopback", [
    ("localhost", True), ("a.b.localhost", True), ("127.0.0.1", True), ("127.255.0.9", True), ("[::1]", True),
    ("[0:0:0:0:0:0:0:1]", True), ("128.0.0.1", False), ("localhost.example", False), ("[::2]", False),
    ("127.1", False), ("", False), ("0.0.0.0", False),
])
def test_is_loopback_name(name, loopback):
    assert is_loopback_name(name) is loopback
