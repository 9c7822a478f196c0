"""Many requests at once, measured the same way for every server and for the batch in process
(`specscope bench serve`, `bench chat --concurrency N`, bench/serve_concurrency.py).

`c` clients at a time work through a list of requests (each client takes the next request when
its last one ends, as a closed-loop load generator does). Per request: time to first token,
latency, decode tok/s (tokens after the first over the time after the first), drafts proposed
and accepted. Per level: aggregate decode tok/s = all generated tokens over the wall time from
the first request's start to the last one's end; p50 / p95 of TTFT and latency; acceptance.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from engines.types import Engine, Request
from engines.speculative.rounds import Round


@dataclass
class RequestRecord:
    name: str
    tokens: int
    ttft_s: float | None
    latency_s: float
    proposed: int
    accepted: int
    finish: str | None
    text: str
    token_ids: list[int]

    @property
    def decode_tok_s(self) -> float | None:
        if self.ttft_s is None or self.tokens < 2 or self.latency_s <= self.ttft_s:
            return None
        return (self.tokens - 1) / (self.latency_s - self.ttft_s)


def record(name: str, rounds: Iterable[Round], started: float) -> RequestRecord:
    """Reads a request's Rounds as they come; times are taken on arrival, so every server and
    the in-process batch are timed by the same clock."""
    ttft, tokens, proposed, accepted, finish, text, ids = None, 0, 0, 0, None, [], []
    for rnd in rounds:
        if (rnd.tokens or rnd.text) and ttft is None:  # a server that sends no token ids still sends text
            ttft = time.perf_counter() - started
        tokens += len(rnd.tokens)
        ids += rnd.tokens
        if not rnd.prefill:
            proposed += rnd.proposed
            accepted += rnd.accepted
        text.append(rnd.text)
        finish = rnd.finish or finish
    return RequestRecord(name, tokens, ttft, time.perf_counter() - started, proposed, accepted, finish,
                         "".join(text), ids)


def run_clients(make_engine: Callable[[], Engine], requests: list[tuple[str, Request]],
                concurrency: int) -> tuple[list[RequestRecord], float]:
    """`concurrency` threads, each with its own engine (a server client), through the requests.
    Returns the records (in request order) and the wall time."""
    records: list[RequestRecord | None] = [None] * len(requests)
    errors: list[BaseException] = []
    cursor = iter(range(len(requests)))
    lock = threading.Lock()

    def client() -> None:
        try:
            engine = make_engine()
        except BaseException as e:  # said after the others stop
            errors.append(e)
            return
        while True:
            with lock:
                i = next(cursor, None)
            if i is None or errors:
                return
            name, request = requests[i]
            try:
                records[i] = record(name, engine.generate(request), time.perf_counter())
                report = getattr(engine, "last_report", None)
                if not records[i].tokens and report is not None and report.predicted_n:
                    records[i].tokens = report.predicted_n  # the server's usage: it sends no token ids
            except BaseException as e:  # said after the others stop
                errors.append(e)
                return

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(min(concurrency, len(requests)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return records, time.perf_counter() - t0


def run_batched(batch, requests: list[tuple[str, Request]], concurrency: int) -> tuple[list[RequestRecord], float]:
    """The same closed loop in process: at most `concurrency` sequences submitted to a
    BatchEngine (engines/batch) at a time, its step loop driving them all."""
    started: dict[int, tuple[int, float]] = {}  # sequence id -> (request index, submit time)
    rounds: dict[int, list[tuple[Round, float]]] = {}
    pending = list(range(len(requests)))[::-1]
    t0 = time.perf_counter()

    def submit() -> None:
        i = pending.pop()
        seq = batch.submit(requests[i][1])
        started[seq.id], rounds[seq.id] = (i, time.perf_counter()), []

    for _ in range(min(concurrency, len(pending))):
        submit()
    records: list[RequestRecord | None] = [None] * len(requests)
    while batch.busy:
        for seq, rnd in batch.step():
            rounds[seq.id].append((rnd, time.perf_counter()))
            if rnd.finish:
                i, t_start = started[seq.id]
                records[i] = _record_from(requests[i][0], rounds.pop(seq.id), t_start)
                if pending:
                    submit()
    return records, time.perf_counter() - t0


def _record_from(name: str, timed: list[tuple[Round, float]], started: float) -> RequestRecord:
    first = next((t for r, t in timed if r.tokens), None)
    rec = record(name, [r for r, _ in timed], started)
    rec.ttft_s = None if first is None else first - started
    rec.latency_s = timed[-1][1] - started
    return rec


def percentile(values: list[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


def summarize(records: list[RequestRecord], wall_s: float) -> dict:
    tokens = sum(r.tokens for r in records)
    proposed = sum(r.proposed for r in records)
    per_request = [r.decode_tok_s for r in records if r.decode_tok_s is not None]
    return {
        "requests": len(records),
        "tokens": tokens,
        "wall_s": wall_s,
        "aggregate_tok_s": tokens / wall_s if wall_s > 0 else None,
        "per_request_decode_tok_s_median": statistics.median(per_request) if per_request else None,
        "ttft_p50_s": percentile([r.ttft_s for r in records], 0.5),
        "ttft_p95_s": percentile([r.ttft_s for r in records], 0.95),
        "latency_p50_s": percentile([r.latency_s for r in records], 0.5),
        "latency_p95_s": percentile([r.latency_s for r in records], 0.95),
        "proposed": proposed,
        "accepted": sum(r.accepted for r in records),
        "acceptance": sum(r.accepted for r in records) / proposed if proposed else None,
    }
