"""`specscope serve`: OpenAI-compatible HTTP over the project's engines. No Qt.

HTTP stack: Starlette on uvicorn. Both are maintained by the Encode team and used by vLLM and
SGLang's own OpenAI servers (through FastAPI); Starlette's StreamingResponse watches for the
client's disconnect while it streams (ASGI spec < 2.4, which uvicorn speaks) and cancels the
response, which is what lets a gone client stop its generation within one round. aiohttp would
do as well; Starlette needs no framework of its own around four routes.

Chat and OCR requests are batched (app/serve/batching.py, `--max-batch N`): up to N sequences
share one target forward per step, each with its own speculation, and `queue_size` more may
wait for a row (OCR: engines/glm_ocr/batch.py; on Core ML a batch of one); `--max-batch 1` is a
batch of one. A chat model the batch cannot hold (and any other engine) goes through the same
queue as a batch of one (batching.py's OneAtATime): one request at a time in arrival order,
`queue_size` waiting behind it. The next request gets 503 with Retry-After, and each Round goes
to the event loop, which streams it (SSE) or collects it (non-streaming)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.serve.batching import BatchQueue, OneAtATime
from app.serve.guard import RequestGuard, normalized_origins
from app.serve.memory import check_memory, physical_memory
from app.serve.metrics import CONTENT_TYPE_LATEST, ServeMetrics
from app.serve.protocol import (ApiError, ParsedRequest, ServedModel, chunk, completion, completion_id, finish_reason,
                                parse_chat_request, reply_chunks, reply_completion, round_record, timings, usage)
from engines.types import Engine, EngineError
from engines.mlx_chat.context import check_fits
from engines.speculative.rounds import Round

LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_MAX_BATCH = 4


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # clients send it as "Authorization: Bearer KEY"
    insecure: bool = False  # allow a non-loopback host without a key
    queue_size: int = 4  # requests that may wait for the engine (or for a row of the batch)
    max_batch: int = DEFAULT_MAX_BATCH  # sequences per target forward (chat, OCR); 1 = a batch of one
    memory_bytes: int | None = None  # the machine's memory for the batch's check (None: measured)
    prompt_cache_mb: int = 512  # prompts read before, kept for requests that start the same (0: off)
    allowed_hosts: tuple[str, ...] = ()  # Host names served besides the loopback ones (app/serve/guard.py)
    allowed_origins: tuple[str, ...] = ()  # browser origins that may call (CORS); others get 403
    ranks: int = 1  # processes the chat model is split over (tensor parallel; /health says it)

    def check(self) -> None:
        if self.host not in LOOPBACK and not self.api_key and not self.insecure:
            raise EngineError(f"--host {self.host} opens the server beyond this machine: "
                              "give --api-key KEY, or --insecure to serve without one")
        if self.queue_size < 0:
            raise EngineError("--queue-size must be >= 0")
        if not 1 <= self.max_batch <= 64:
            raise EngineError("--max-batch must be in 1..64")
        if self.prompt_cache_mb < 0:
            raise EngineError("--prompt-cache must be >= 0 (MB; 0 turns it off)")


@dataclass
class Served:
    """A model and the engine that answers for it."""

    model: ServedModel
    engine: Engine
    batch: object = None  # a BatchEngine built by the caller (tensor parallel's rank 0), driven as given


def row_batch(served: Served, config: ServeConfig):
    """What the model's BatchQueue steps: a BatchEngine for a chat model the batch can hold (a
    ChatEngine), an OcrBatch for an OCR model, else OneAtATime over the engine (a model whose
    caches cannot be batched says why on stderr once)."""
    from engines.mlx_chat.engine import ChatEngine

    if served.batch is not None:  # its maker checked its memory (each rank holds a shard)
        return served.batch
    if served.model.kind == "ocr" and hasattr(served.engine, "sequence"):
        from engines.glm_ocr.batch import OcrBatch

        batch = OcrBatch(served.engine, max_batch=config.max_batch)
        runtime = served.engine.runtime
        if batch.max_batch > 1:  # (Core ML holds one row: OcrBatch makes it a batch of one)
            check_memory(runtime.kv_bytes_per_token(), batch.max_batch, runtime.cache_length,
                         runtime.weights_bytes(), config.memory_bytes or physical_memory())
        return batch
    if served.model.kind != "chat" or not isinstance(served.engine, ChatEngine):
        return OneAtATime(served.engine)
    from mlx.utils import tree_flatten

    from engines.batch.cache import UnbatchableModel, kv_bytes_per_token
    from engines.batch.controller import DraftBudget
    from engines.batch.engine import BatchEngine
    from engines.batch.prompt_cache import PromptCache

    try:
        # one row drafts what it asks, as a lone request does (the cap weighs rows against each other)
        budget = DraftBudget.tuned(served.model.spec, served.engine.model_path) if config.max_batch > 1 else None
        engine = BatchEngine(served.engine, max_batch=config.max_batch, budget=budget)
    except UnbatchableModel as e:
        print(f"specscope serve: {served.model.id} runs one request at a time: {e}", file=sys.stderr, flush=True)
        return OneAtATime(served.engine)
    weights = sum(v.nbytes for _, v in tree_flatten(served.engine.model.parameters()))
    kept = config.prompt_cache_mb * 2**20
    check_memory(kv_bytes_per_token(served.engine.model), config.max_batch, served.engine.context_length or 4096,
                 weights + kept,
                 config.memory_bytes or physical_memory())
    if kept:
        engine.prompt_cache = PromptCache(engine.prefill_chunk, kept)
    return engine


def ranks_report(queues: dict) -> dict:
    """Tensor parallel: the ranks, the last step's wall and broadcast time on rank 0, and how
    many forwards the divergence check found identical on every rank."""
    for q in queues.values():
        engine = getattr(q, "engine", None)
        if getattr(engine, "bus", None) is not None:
            step = engine.last_step
            return {"ranks": engine.ranks, "rank_checked_forwards": engine.checked,
                    "rank_times": [{"rank": r, "forwards": t.forwards, "compute_s": round(t.compute_s, 6),
                                    "wait_s": round(t.wait_s, 6), "draft_s": round(t.draft_s, 6),
                                    "drafted": t.drafted} for r, t in enumerate(engine.times)],
                    "rank_broadcasts": engine.bus.sent, "rank_broadcast_s": round(engine.bus.comm_s, 6),
                    "last_step": None if step is None else {"wall_s": round(step.wall_s, 6),
                                                            "compute_s": round(step.compute_s, 6),
                                                            "broadcast_s": round(step.broadcast_s, 6),
                                                            "forwards": step.forwards}}
    return {}


def check_prompt(served: Served, parsed: ParsedRequest) -> int | None:
    """Counts the prompt's tokens (llama.cpp's prompt_n) and refuses one that cannot fit, with
    the engine's own check (engines.mlx_chat.context)."""
    count = getattr(served.engine, "count_prompt_tokens", None)
    if count is None:
        return None
    prompt_n = count(parsed.request)
    try:
        check_fits(prompt_n, parsed.request.max_tokens, context_of(served))
    except EngineError as e:
        raise ApiError(400, str(e), "context_length_exceeded", "messages") from None
    return prompt_n


def context_of(served: Served) -> int | None:
    return getattr(served.engine, "context_length", None)


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def build_app(config: ServeConfig, served: list[Served]) -> Starlette:
    config.check()
    metrics = ServeMetrics()
    queues = {s.model.id: BatchQueue(row_batch(s, config), config.queue_size, metrics, check_prompt) for s in served}
    by_id = {s.model.id: s for s in served}
    models = {s.model.id: s.model for s in served}

    def authorized(http: HttpRequest) -> bool:
        return not config.api_key or http.headers.get("authorization", "") == f"Bearer {config.api_key}"

    def unauthorized() -> JSONResponse:
        return error_response(ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                                       "invalid_api_key"))

    async def health(http: HttpRequest) -> Response:
        return health_report(queues, config.ranks)

    async def list_models(http: HttpRequest) -> Response:
        if not authorized(http):
            return unauthorized()
        created = int(time.time())
        return JSONResponse({"object": "list", "data": [
            {"id": m.id, "object": "model", "created": created, "owned_by": "specscope", "kind": m.kind,
             "speculative": {"method": m.spec.method, "steps": m.spec.steps, "adaptive": m.spec.adaptive}}
            for m in models.values()]})

    async def prometheus(http: HttpRequest) -> Response:
        if not authorized(http):
            return unauthorized()
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    async def spec_decode_metrics(http: HttpRequest) -> Response:
        if not authorized(http):
            return unauthorized()
        return JSONResponse(metrics.spec.as_dict() | {"max_batch": config.max_batch} | ranks_report(queues))

    async def chat_completions(http: HttpRequest) -> Response:
        if not authorized(http):
            return unauthorized()
        try:
            body = json.loads(await http.body())
        except (ValueError, UnicodeDecodeError):
            return error_response(ApiError(400, "the request body is not valid JSON", "invalid_json"))
        parsed = None
        try:
            parsed = parse_chat_request(body, models, lambda model_id: context_of(by_id[model_id]))
            if parsed.reply is not None:  # answered without the model (text sent to an OCR model)
                metrics.requests.labels(outcome="stop").inc()
                return fixed_reply(parsed)
            queue = queues[parsed.model]
            queue.admit(parsed.n)
        except ApiError as e:
            _remove(parsed)
            metrics.requests.labels(outcome="refused").inc()
            return error_response(e)
        stop = threading.Event()
        prompt_n: list = []
        rounds = choice_rounds(queue, by_id[parsed.model], parsed, stop, prompt_n)
        try:
            # The first round (or the request's refusal) before any header goes out, so a bad
            # request still gets its 4xx status.
            first = await anext(rounds)
        except StopAsyncIteration:  # its client left while it waited
            _remove(parsed)
            return Response(status_code=499)
        except (ApiError, EngineError) as e:
            await _drain(rounds, stop, parsed)
            metrics.requests.labels(outcome="refused").inc()
            return error_response(e if isinstance(e, ApiError) else ApiError(400, str(e), "invalid_request"))
        except BaseException:
            await _drain(rounds, stop, parsed)
            raise
        decode = by_id[parsed.model].engine.decode
        if parsed.stream:
            return StreamingResponse(sse(parsed, first, rounds, stop, prompt_n, decode, metrics),
                                     media_type="text/event-stream")
        return await collected_reply(http, parsed, first, rounds, stop, prompt_n, decode, metrics)

    return Starlette(routes=[
        Route("/health", health),
        Route("/v1/models", list_models),
        Route("/metrics", prometheus),
        Route("/v1/spec_decode/metrics", spec_decode_metrics),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ], middleware=guard_middleware(config))


def health_report(queues: dict, ranks: int) -> JSONResponse:
    """What a supervisor or a load balancer polls: 200 while every model's engine can serve,
    503 once one cannot (its ranks lost, its batch loop ended) -- then restart the server."""
    engines = {model_id: q.state() for model_id, q in queues.items()}
    lost = [q.lost for q in queues.values() if getattr(q, "lost", None) is not None]
    if lost:
        return JSONResponse({"status": "rank lost", "ranks": ranks, "error": str(lost[0]),
                             "engines": engines}, status_code=503)
    if any(e["state"] == "stopped" for e in engines.values()):
        return JSONResponse({"status": "engine stopped", "ranks": ranks, "engines": engines},
                            status_code=503)
    return JSONResponse({"status": "ok", "ranks": ranks, "engines": engines})


def guard_middleware(config: ServeConfig) -> list[Middleware]:
    """Host / Origin / Content-Type refusals first (app/serve/guard.py), then CORS headers for the
    allowed origins only (none are sent without --allowed-origins)."""
    origins = normalized_origins(config.allowed_origins)
    middleware = [Middleware(RequestGuard, check_host=config.host in LOOPBACK or bool(config.allowed_hosts),
                             allowed_hosts=frozenset(h.lower() for h in config.allowed_hosts),
                             allowed_origins=origins)]
    if origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=sorted(origins),
                                     allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"]))
    return middleware


async def collected_reply(http: HttpRequest, parsed: ParsedRequest, first: tuple[int, Round],
                          rounds: AsyncIterator[tuple[int, Round]], stop: threading.Event, prompt_n: list,
                          decode, metrics: ServeMetrics) -> Response:
    """A non-streaming request's reply: every choice's rounds collected, then one completion; a
    client gone while they run stops the engine at its next round."""
    collected: list[list[Round]] = [[] for _ in range(parsed.n)]
    try:
        async for i, rnd in _chain(first, rounds):
            collected[i].append(rnd)
            if await http.is_disconnected():
                stop.set()  # the engine stops at its next round
    except ApiError as e:  # failed mid-request (a lost rank of a tensor-parallel model: 503)
        metrics.requests.labels(outcome="error").inc()
        return error_response(e)
    finally:
        await _drain(rounds, stop, parsed)
    metrics.prompt_tokens.inc((prompt_n[0] if prompt_n else None) or 0)
    metrics.requests.labels(outcome=collected[0][-1].finish or "stop").inc()
    return JSONResponse(completion(completion_id(), parsed.model, collected, prompt_n[0] if prompt_n else None, decode))


def fixed_reply(parsed: ParsedRequest) -> Response:
    cid = completion_id()
    if not parsed.stream:
        return JSONResponse(reply_completion(cid, parsed.model, parsed.reply, parsed.n))
    events = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in reply_chunks(cid, parsed.model, parsed.reply, parsed.n)]
    return StreamingResponse(iter([*events, "data: [DONE]\n\n"]), media_type="text/event-stream")


async def sse(parsed: ParsedRequest, first: tuple[int, Round], rounds: AsyncIterator[tuple[int, Round]],
              stop: threading.Event, prompt_n: list, decode, metrics: ServeMetrics) -> AsyncIterator[str]:
    """One SSE event per round: the text as the OpenAI delta of its choice, the Round as
    `round`. A choice's last event carries its finish_reason and `timings`; `usage` (when asked)
    follows them all."""
    cid, created = completion_id(), int(time.time())
    collected: list[list[Round]] = [[] for _ in range(parsed.n)]
    ended: set[int] = set()
    n = None

    def event(payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def final(i: int) -> str:
        ended.add(i)
        last = collected[i][-1] if collected[i] else None
        return event(chunk(cid, parsed.model, created, {}, finish_reason(last), index=i,
                           timings=timings(collected[i], n)))

    try:
        for i in range(parsed.n):
            yield event(chunk(cid, parsed.model, created, {"role": "assistant", "content": ""}, index=i))
        async for i, rnd in _chain(first, rounds):
            collected[i].append(rnd)
            n = prompt_n[0] if prompt_n else None
            yield event(chunk(cid, parsed.model, created, {"content": rnd.text}, index=i, round=round_record(rnd, decode)))
            if rnd.finish is not None and parsed.n > 1:
                yield final(i)
        for i in range(parsed.n):
            if i not in ended:
                yield final(i)
        if parsed.include_usage:
            yield event({"id": cid, "object": "chat.completion.chunk", "created": created, "model": parsed.model,
                         "choices": [], "usage": usage(n, [r for c in collected for r in c])})
        yield "data: [DONE]\n\n"
        metrics.prompt_tokens.inc(n or 0)
        metrics.requests.labels(outcome=collected[0][-1].finish or "stop").inc()
    except (ApiError, EngineError) as e:
        body = e.body() if isinstance(e, ApiError) else {"error": {"message": str(e), "type": "server_error"}}
        yield event(body)
    finally:
        # Reached also when Starlette cancels the response because the client went away.
        if not collected[0] or collected[0][-1].finish is None:
            metrics.requests.labels(outcome="cancelled").inc()
        stop.set()
        _remove(parsed)


async def choice_rounds(queue, served: Served, parsed: ParsedRequest, stop: threading.Event,
                        prompt_n: list) -> AsyncIterator[tuple[int, Round]]:
    """Every choice's Rounds, tagged with its index, as they come. n = 1 is the request's own
    Rounds; n > 1 runs n sequences (each its own seed; in a batch they share the prefill)."""
    if parsed.n == 1:
        async for rnd in queue.rounds(served, parsed, stop, prompt_n):
            yield 0, rnd
        return
    merged: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int) -> None:
        try:
            async for rnd in queue.rounds(served, replace(parsed, request=parsed.choice(i)), stop, prompt_n,
                                          group=parsed, index=i):
                await merged.put((i, rnd))
        except BaseException as e:  # handed to the reader, which raises it
            await merged.put((i, e))
        finally:
            await merged.put((i, done))

    tasks = [asyncio.create_task(pump(i)) for i in range(parsed.n)]
    running = parsed.n
    try:
        while running:
            i, item = await merged.get()
            if item is done:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        if running:  # closed early (a refusal, a gone client): the other choices stop too
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _chain(first: Round, rest: AsyncIterator[Round]) -> AsyncIterator[Round]:
    yield first
    async for rnd in rest:
        yield rnd


async def _drain(rounds: AsyncIterator[Round], stop: threading.Event, parsed: ParsedRequest | None) -> None:
    """Stops the engine and waits for its thread to let go, so the request's file can go."""
    stop.set()
    try:
        async for _ in rounds:
            pass
    except BaseException:
        pass
    _remove(parsed)


def _remove(parsed: ParsedRequest | None) -> None:
    if parsed is not None and parsed.image_file:
        try:
            os.unlink(parsed.image_file)
        except OSError:
            pass


@dataclass
class RunningServer:
    """A uvicorn server on its own thread (tests, and the GUI if it ever serves)."""

    server: object
    thread: threading.Thread
    port: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_in_thread(app: Starlette, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="specscope-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise EngineError(f"the server did not start on {host}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(server, thread, port=bound)


def serve_forever(app: Starlette, config: ServeConfig) -> None:
    import uvicorn

    uvicorn.run(app, host=config.host, port=config.port, log_level="info", lifespan="off")
