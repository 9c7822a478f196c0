"""RemoteEngine: an OpenAI-compatible server driven through the official `openai` client, its
stream turned into Rounds.

What each server lets us see, and so what a Round holds:
- `specscope serve`: every SSE chunk carries the engine's own Round record (exact).
- llama.cpp's llama-server: asked for `timings_per_token`, every chunk (one token) carries the
  slot's running `draft_n` / `draft_n_accepted`; a rise in them marks a verification step, whose
  accepted drafts plus the target's token arrive as the next chunks. Token ids are not sent
  (-1 = id not reported); llama.cpp accepts a draft prefix, so the per-position flags follow.
- vLLM, SGLang and any other server: one Round per chunk with no draft figures; its Prometheus
  counters are read before and after the request and the difference is the response's totals
  (exact only when no other request ran meanwhile). SGLang's `meta_info` is read when present.
Whatever a server does not report is None in `ServerReport`, never a made-up number.
"""

from __future__ import annotations

import base64
import mimetypes
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from engines.types import EngineError, Request, ShouldStop, one_line
from engines.remote.counters import SpecCounters, parse_spec_counters
from engines.speculative.rounds import Round

UNKNOWN_TOKEN = -1  # a token the server emitted without telling its id
SERVER_KINDS = ("specscope", "llamacpp", "vllm", "sglang")
TIMEOUT_S = 600.0


@dataclass
class ServerReport:
    """What the server said about the last response. None = the server did not report it."""

    server: str  # one of SERVER_KINDS or "openai-compatible"
    source: str  # where the draft figures came from: "rounds" | "timings" | "metrics" | "meta_info" | "none"
    prompt_n: int | None = None
    predicted_n: int | None = None
    predicted_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    num_drafts: int | None = None  # verification steps that carried drafts
    accepted_per_pos: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        def shown(value) -> str:
            return "unknown" if value is None else str(value)

        return (f"{self.server}: draft_n {shown(self.draft_n)}, draft_n_accepted {shown(self.draft_n_accepted)} "
                f"(from {self.source}), prompt_n {shown(self.prompt_n)}, predicted_n {shown(self.predicted_n)}")


@dataclass
class RemoteEngine:
    url: str  # the server's base URL, without /v1
    model: str  # the model id the server serves
    server: str  # one of SERVER_KINDS or "openai-compatible"
    api_key: str | None = None
    last_report: ServerReport | None = None
    _pieces: dict[int, str] = field(default_factory=dict)  # token id -> its text, as the server sent it

    @classmethod
    def load(cls, url: str, api_key: str | None = None, model: str | None = None, **_options) -> "RemoteEngine":
        """Asks the server which models it serves (and whose server it is: /v1/models' owned_by).
        `url` may name the model after a '#' (server_ref's form, what the window keeps)."""
        url, _, named = url.partition("#")
        model = model or named or None
        base = base_url(url)
        client = _client(base, api_key)
        try:
            models = client.models.list().data
        except Exception as e:  # connection refused, 401, not an OpenAI-compatible server...
            raise EngineError(f"cannot reach an OpenAI-compatible server at {base}: {one_line(e)}") from None
        if not models:
            raise EngineError(f"the server at {base} serves no model")
        ids = [m.id for m in models]
        if model is not None and model not in ids:
            raise EngineError(f"the server at {base} does not serve {model!r} (it serves: {', '.join(ids)})")
        chosen = next(m for m in models if m.id == (model or ids[0]))
        owner = (getattr(chosen, "owned_by", "") or "").lower()
        server = next((k for k in SERVER_KINDS if k in owner), "openai-compatible")
        return cls(url=base, model=chosen.id, server=server, api_key=api_key)

    @property
    def model_path(self) -> str:
        return server_ref(self.url, self.model)

    def model_info(self) -> dict:
        return {"path": self.model_path, "name": self.model, "server": self.server, "url": self.url,
                "model_type": "remote", "hash": None}

    def decode(self, token_ids: list[int]) -> str:
        try:
            return "".join(self._pieces[t] for t in token_ids)
        except KeyError:
            raise EngineError(f"{self.server} does not report token ids") from None

    # -- one request -------------------------------------------------------------------------
    def generate(self, request: Request, should_stop: ShouldStop | None = None, *,
                 on_prefill=None) -> Iterator[Round]:  # on_prefill: the server reports no prefill progress
        should_stop = should_stop or (lambda: False)
        before = self._scrape_counters() if self.server in ("vllm", "sglang", "openai-compatible") else None
        assembler = self._assembler()
        client = _client(self.url, self.api_key)
        started = time.perf_counter()
        try:
            stream = client.chat.completions.create(stream=True, **self._body(request))
        except Exception as e:
            raise EngineError(f"the server refused the request: {one_line(e)}") from None
        last: Round | None = None
        try:
            for chunk in stream:
                for rnd in assembler.feed(chunk, time.perf_counter() - started):
                    if rnd.finish is None and should_stop():
                        rnd.finish = "cancelled"
                    last = rnd
                    yield rnd
                    if rnd.finish == "cancelled":
                        return  # closing the stream (finally) drops the connection: the server stops
            for rnd in assembler.flush(time.perf_counter() - started):
                last = rnd
                yield rnd
        finally:
            stream.close()
        if last is not None and last.finish is None:
            last.finish = "stop"
        self.last_report = assembler.report()
        if before is not None:
            self._add_counter_totals(before)

    def _body(self, request: Request) -> dict:
        body: dict = {
            "model": self.model,
            "messages": _messages(request),
            "max_tokens": request.max_tokens,
            "temperature": request.sampling.temperature,
            "top_p": request.sampling.top_p,
            "stream_options": {"include_usage": True},
        }
        extra: dict = {}
        if request.sampling.seed is not None:
            body["seed"] = request.sampling.seed
        if request.sampling.top_k:
            extra["top_k"] = request.sampling.top_k
        if request.stop:
            body["stop"] = request.stop
        if self.server == "llamacpp":
            extra["timings_per_token"] = True  # running draft_n / draft_n_accepted on every chunk
        if self.server == "specscope":
            spec = request.spec
            extra["speculative"] = {"method": spec.method, "steps": spec.steps, "adaptive": spec.adaptive}
        if extra:
            body["extra_body"] = extra
        return body

    def _assembler(self):
        if self.server == "specscope":
            return SpecscopeRounds(self._pieces)
        if self.server == "llamacpp":
            return LlamaCppRounds()
        return ChunkRounds(self.server)

    def _scrape_counters(self) -> SpecCounters | None:
        text = fetch_metrics(self.url, self.api_key)
        return parse_spec_counters(text) if text is not None else None

    def _add_counter_totals(self, before: SpecCounters | None) -> None:
        after = self._scrape_counters()
        report = self.last_report
        if before is None or after is None or report is None or report.draft_n is not None:
            return
        diff = after.minus(before)
        if diff.draft_tokens is None:
            return
        report.source = "metrics"
        report.draft_n = int(diff.draft_tokens)
        report.draft_n_accepted = None if diff.accepted_tokens is None else int(diff.accepted_tokens)
        report.num_drafts = None if diff.drafts is None else int(diff.drafts)
        report.accepted_per_pos = {p: int(v) for p, v in diff.accepted_per_pos.items()}


# -- chunks -> Rounds, one assembler per kind of server -------------------------------------------
def _extra(obj, name: str):
    """A field the OpenAI schema does not know (timings, round, meta_info): pydantic keeps it."""
    extra = getattr(obj, "model_extra", None) or {}
    return extra.get(name)


def _content(chunk) -> tuple[str, str | None]:
    if not chunk.choices:
        return "", None
    choice = chunk.choices[0]
    return (choice.delta.content or "") if choice.delta else "", choice.finish_reason


def _finish(reason: str | None) -> str | None:
    return {"stop": "stop", "length": "length", None: None}.get(reason, "stop")


class SpecscopeRounds:
    """`specscope serve` sends its engine's Round in every chunk (and each token's text)."""

    def __init__(self, pieces: dict[int, str]):
        self.pieces = pieces
        self.rounds: list[Round] = []
        self.timings: dict = {}

    def feed(self, chunk, t_s: float) -> list[Round]:
        self.timings = _extra(chunk, "timings") or self.timings
        record = _extra(chunk, "round")
        if record is None:
            return []
        rnd = Round.from_dict(record)
        self.pieces.update(zip(rnd.tokens, record.get("token_texts", [])))
        self.rounds.append(rnd)
        return [rnd]

    def flush(self, t_s: float) -> list[Round]:
        return []

    def report(self) -> ServerReport:
        t = self.timings
        return ServerReport(
            server="specscope", source="rounds", prompt_n=t.get("prompt_n"), predicted_n=t.get("predicted_n"),
            predicted_per_second=t.get("predicted_per_second"),
            draft_n=sum(r.proposed for r in self.rounds), draft_n_accepted=sum(r.accepted for r in self.rounds),
            num_drafts=sum(1 for r in self.rounds if r.proposed),
            accepted_per_pos=_per_pos(self.rounds),
        )


class LlamaCppRounds:
    """llama-server with timings_per_token: one chunk per token, each with the slot's running
    predicted_n / draft_n / draft_n_accepted. A rise in draft_n is a verification step: its
    accepted drafts and the target's own token are that chunk and the ones after it."""

    def __init__(self):
        self.rounds: list[Round] = []
        self.seen = {"predicted_n": 0, "draft_n": 0, "draft_n_accepted": 0}
        self.timings: dict = {}
        self.open: dict | None = None  # the verification step being filled
        self.last_t = 0.0

    def feed(self, chunk, t_s: float) -> list[Round]:
        text, reason = _content(chunk)
        timings = _extra(chunk, "timings") or {}
        if timings:
            self.timings = timings
        out: list[Round] = []
        new_tokens = max(timings.get("predicted_n", self.seen["predicted_n"]) - self.seen["predicted_n"], 0)
        if text and not new_tokens:
            new_tokens = 1  # a server that sent text without its running count: one token per chunk
        if new_tokens:
            drafted = timings.get("draft_n", 0) - self.seen["draft_n"]
            accepted = timings.get("draft_n_accepted", 0) - self.seen["draft_n_accepted"]
            if drafted > 0:
                out += self._close(t_s)
                self.open = {"proposed": drafted, "accepted": accepted, "tokens": 0, "text": ""}
            if self.open is None:
                out.append(self._round(0, 0, new_tokens, text, t_s))
            else:
                self.open["tokens"] += new_tokens
                self.open["text"] += text
                if self.open["tokens"] >= self.open["accepted"] + 1:
                    out += self._close(t_s)
            for key in self.seen:
                self.seen[key] = timings.get(key, self.seen[key] + (new_tokens if key == "predicted_n" else 0))
        if reason is not None:
            out += self._close(t_s)
            if not out and self.rounds:
                self.rounds[-1].finish = _finish(reason)  # already yielded: nothing to mark
            elif out:
                out[-1].finish = _finish(reason)
        return out

    def flush(self, t_s: float) -> list[Round]:
        return self._close(t_s)

    def _close(self, t_s: float) -> list[Round]:
        if self.open is None:
            return []
        step, self.open = self.open, None
        return [self._round(step["proposed"], step["accepted"], step["tokens"], step["text"], t_s)]

    def _round(self, proposed: int, accepted: int, n_tokens: int, text: str, t_s: float) -> Round:
        from_draft = [i < accepted for i in range(n_tokens)]
        rnd = Round(
            index=len(self.rounds), proposed=proposed, accepted=accepted, tokens=[UNKNOWN_TOKEN] * n_tokens,
            from_draft=from_draft, text=text, accept_flags=[j < accepted for j in range(proposed)],
            draft_s=0.0, verify_s=0.0, wall_s=t_s - self.last_t, t_s=t_s, prefill=not self.rounds, steps=proposed,
        )
        self.last_t = t_s
        self.rounds.append(rnd)
        return rnd

    def report(self) -> ServerReport:
        t = self.timings
        return ServerReport(
            server="llamacpp", source="timings", prompt_n=t.get("prompt_n"), predicted_n=t.get("predicted_n"),
            predicted_per_second=t.get("predicted_per_second"),
            # llama.cpp leaves draft_n out while it is 0; a speculating server reports it once it drafted
            draft_n=t.get("draft_n"), draft_n_accepted=t.get("draft_n_accepted"),
            num_drafts=sum(1 for r in self.rounds if r.proposed) if "draft_n" in t else None,
            accepted_per_pos=_per_pos(self.rounds) if "draft_n" in t else {},
        )


class ChunkRounds:
    """Any other server: one Round per content chunk, no draft figures (they come from its
    /metrics afterwards, as totals). Token counts per chunk are not reported either."""

    def __init__(self, server: str):
        self.server = server
        self.rounds: list[Round] = []
        self.usage = None
        self.meta: dict = {}
        self.last_t = 0.0

    def feed(self, chunk, t_s: float) -> list[Round]:
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        self.meta = _extra(chunk, "meta_info") or self.meta  # SGLang, where it sends it
        text, reason = _content(chunk)
        if not text and reason is None:
            return []
        rnd = Round(index=len(self.rounds), proposed=0, accepted=0, tokens=[], from_draft=[], text=text,
                    accept_flags=[], draft_s=0.0, verify_s=0.0, wall_s=t_s - self.last_t, t_s=t_s,
                    prefill=not self.rounds, finish=_finish(reason),
                    note=None if self.rounds else "draft figures per round not reported by this server")
        self.last_t = t_s
        self.rounds.append(rnd)
        return [rnd]

    def flush(self, t_s: float) -> list[Round]:
        return []

    def report(self) -> ServerReport:
        report = ServerReport(server=self.server, source="none")
        if self.usage is not None:
            report.prompt_n, report.predicted_n = self.usage.prompt_tokens, self.usage.completion_tokens
        if "spec_verify_ct" in self.meta or "spec_accept_length" in self.meta:
            report.source = "meta_info"
            report.num_drafts = self.meta.get("spec_verify_ct")
        return report


def _per_pos(rounds: list[Round]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for r in rounds:
        for j, ok in enumerate(r.accept_flags):
            counts[j] = counts.get(j, 0) + int(ok)
    return counts


# -- plumbing ------------------------------------------------------------------------------------
def base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise EngineError(f"a server URL starts with http:// or https://, got {url!r}")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def server_ref(url: str, model: str | None) -> str:
    """One string for a server and its model ("http://host:port#model-id"): how a model path
    names a remote model."""
    return f"{base_url(url)}#{model}" if model else base_url(url)


def is_server_url(text: str | None) -> bool:
    return bool(text) and text.strip().startswith(("http://", "https://"))


def _client(base: str, api_key: str | None):
    from openai import OpenAI

    # The client insists on a key; a server without auth ignores it.
    return OpenAI(base_url=f"{base}/v1", api_key=api_key or "none", timeout=TIMEOUT_S, max_retries=0)


def fetch_metrics(base: str, api_key: str | None = None) -> str | None:
    """The server's Prometheus text, or None when it has no /metrics (llama-server without --metrics)."""
    req = urllib.request.Request(f"{base}/metrics")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return None


def _messages(request: Request) -> list[dict]:
    if request.kind == "ocr":
        if not request.image:
            raise EngineError("an OCR request needs an image")
        return [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image_data_url(request.image)}},
            {"type": "text", "text": request.task},
        ]}]
    messages = [{"role": "system", "content": request.system}] if request.system else []
    messages += list(request.history)
    messages.append({"role": "user", "content": request.prompt})
    return messages


def image_data_url(path: str) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise EngineError(f"cannot read image {path}: {e.strerror}") from None
    mime = mimetypes.guess_type(path)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
