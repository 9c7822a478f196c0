"""The batch scheduler's front door: many requests (chat, or GLM-OCR pages and regions) share
one target forward per step.

Requests are admitted on the event loop (at most `max_batch` running plus `queue_size`
waiting; the next gets 503 with Retry-After), handed to ONE scheduler thread through an inbox,
and that thread steps the batch (chat: engines/batch's BatchEngine; OCR: engines/glm_ocr's
OcrBatch): each step reads what joins and runs one forward over every running sequence. Each
sequence's Rounds go back to its own request's coroutine, which streams or collects them.

An engine the batch cannot hold (a chat model decoding plainly, an OCR engine without
`sequence`, a remote server) is stepped the same way as a batch of one (`OneAtATime`): its
requests run through its own `generate`, one after another, one Round per step.

A client that disconnects sets its `stop` event; the engine reads it at the start of the next
step, so its row is freed within one step.

Tensor parallel (engines/distributed): the engine is rank 0's. When no step is running, the
thread sends the other ranks a heartbeat every second. A lost rank cannot be recovered in the
process: every request in flight and every new one is answered 503, the server says which
rank in one line on stderr and exits, and mlx.launch stops the other ranks."""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Callable, Iterator

from app.serve.metrics import ServeMetrics
from app.serve.protocol import ApiError, ParsedRequest

if TYPE_CHECKING:
    from engines.batch.engine import BatchEngine
    from engines.glm_ocr.batch import OcrBatch
    from engines.types import Engine, Request
from engines.speculative.rounds import Round

RETRY_AFTER_S = 2
DONE = object()
IDLE_S = 1.0  # an idle tensor-parallel engine's heartbeat period
LOST_EXIT_AFTER_S = 1.0  # time for the 503s to go out before the process exits
LOST_EXIT_CODE = 3


@dataclass
class Admission:
    """A request on its way into the batch: what to run, and where its Rounds go."""

    served: object  # server.Served
    parsed: ParsedRequest
    stop: threading.Event
    prompt_n: list
    push: Callable[[object], None]  # thread-safe: hands a Round, an error or DONE to the request
    group: object = None  # the request, when it asks for n > 1 choices
    index: int = 0  # which choice


class BatchQueue:
    def __init__(self, engine: "BatchEngine | OcrBatch | OneAtATime", queue_size: int, metrics: ServeMetrics,
                 check_prompt: Callable[[object, ParsedRequest], int | None]):
        self.engine = engine
        self.capacity = engine.max_batch + queue_size
        self.metrics = metrics
        self.check_prompt = check_prompt
        self.admitted = 0
        self.prefix_seen = (0, 0)  # the prompt cache's token counts already in /metrics
        self.lock = threading.Lock()
        self.inbox: queue.Queue = queue.Queue()
        self.sinks: dict[int, Admission] = {}  # sequence id -> its request
        self.first_choice: dict[int, object] = {}  # id(request) -> its choice 0's sequence (twins share its prefill)
        self.idle = getattr(engine, "idle", None)  # tensor parallel: rank 0's heartbeat
        self.lost: Exception | None = None  # tensor parallel: the lost rank; nothing more is served
        self.stopped: BaseException | None = None  # the scheduler's own fault; nothing more is served
        if hasattr(engine, "on_lost"):
            engine.on_lost = self._lost
        self.thread = threading.Thread(target=self._loop, name="specscope-batch", daemon=True)
        self.thread.start()

    # -- the event loop's side --------------------------------------------------------------------
    def state(self) -> dict:
        """/health's view: "stopped" when the batch loop's thread has ended (nothing more will
        be served: the server needs a restart), else decoding or idle with the batch's rows."""
        if self.lost is not None:
            state = "rank lost"
        elif self.stopped is not None or not self.thread.is_alive():
            state = "stopped"
        else:
            state = "decoding" if self.engine.busy else "idle"
        return {"state": state, "running": self.engine.size,
                "waiting": len(self.engine.joining) + self.inbox.qsize()}

    def admit(self, count: int = 1) -> None:
        """Room for `count` sequences (a request's n choices), all or none. A request with more
        choices than rows and queue hold is taken when nothing else is: its choices wait for rows."""
        if self.lost is not None:
            raise _unavailable(self.lost)
        if self.stopped is not None:
            raise _stopped(self.stopped)
        with self.lock:
            if self.admitted and self.admitted + count > self.capacity:
                raise ApiError(503, "the server is busy (its batch and queue are full); retry later", "server_busy",
                               kind="server_error", headers={"Retry-After": str(RETRY_AFTER_S)})
            self.admitted += count

    async def rounds(self, served, parsed: ParsedRequest, stop: threading.Event,
                     prompt_n: list, group: object = None, index: int = 0) -> AsyncIterator[Round]:
        """This request's Rounds (or its choice `index`'s), produced by the scheduler thread,
        delivered on the event loop."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()
        self.inbox.put(Admission(served, parsed, stop, prompt_n,
                                 lambda item: loop.call_soon_threadsafe(items.put_nowait, item), group, index))
        while (item := await items.get()) is not DONE:
            if isinstance(item, BaseException):
                raise item
            yield item

    # -- the scheduler thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._schedule()
        except BaseException as e:  # a fault of the scheduler itself: everyone waiting hears it
            self.stopped = e
            self._fail_all(_stopped(e))
            self._refuse_inbox(_stopped(e))
            print(f"specscope serve: the batch loop stopped ({type(e).__name__}: {e}); /health now answers 503: "
                  "restart the server", file=sys.stderr, flush=True)

    def _schedule(self) -> None:
        while self.lost is None:
            self._take_inbox(block=not self.engine.busy, timeout=IDLE_S if self.idle else None)
            if not self.engine.busy:
                if self.idle is not None and self.inbox.empty():
                    try:
                        self.idle()
                    except Exception:  # a lost rank: _lost has answered everyone
                        return
                continue
            t0 = time.perf_counter()
            try:
                out = self.engine.step()
            except Exception as e:  # a fault in the step: every request in it hears it
                if self.lost is not None:
                    return
                self._fail_all(e)
                continue
            self.metrics.observe_step(self.engine.size, time.perf_counter() - t0)
            step = getattr(self.engine, "last_step", None)  # tensor parallel: the ranks' times
            if step is not None:
                self.metrics.observe_ranks(step.broadcast_s, self.engine.times)
            for seq, rnd in out:
                admission = self.sinks[seq.id]
                if isinstance(rnd, Exception):  # its engine failed this request alone (OneAtATime)
                    admission.push(rnd)
                    self._finish(seq.id)
                    continue
                self.metrics.count_round(rnd)
                admission.push(rnd)
                if rnd.finish:
                    self._finish(seq.id)
            self._gauges()

    def _take_inbox(self, block: bool, timeout: float | None = None) -> None:
        """Submit what arrived: an invalid request never enters the batch (its error goes
        back to it alone)."""
        while True:
            try:
                a = self.inbox.get(block=block, timeout=timeout)
            except queue.Empty:
                return
            block = False
            try:
                a.prompt_n.append(self.check_prompt(a.served, a.parsed))
                twin = self.first_choice.get(id(a.group)) if a.group is not None and a.index else None
                seq = self.engine.submit(a.parsed.request, should_stop=a.stop.is_set, twin_of=twin)
            except Exception as e:
                a.push(e)
                a.push(DONE)
                self._leave()
                continue
            self.sinks[seq.id] = a
            if a.group is not None and a.index == 0:
                self.first_choice[id(a.group)] = seq
            self._gauges()

    def _finish(self, seq_id: int) -> None:
        a = self.sinks.pop(seq_id)
        a.push(DONE)
        if a.group is not None and a.index == 0:
            self.first_choice.pop(id(a.group), None)
        self._leave()

    def _fail_all(self, error: Exception) -> None:
        for seq_id, a in list(self.sinks.items()):
            a.push(error)
            self._finish(seq_id)
        self.engine.clear()

    def _refuse_inbox(self, error: ApiError) -> None:
        """Requests that arrived but never joined: each hears `error`."""
        while True:
            try:
                a = self.inbox.get_nowait()
            except queue.Empty:
                return
            a.push(error)
            a.push(DONE)

    def _lost(self, error: Exception) -> None:
        """A rank of a tensor-parallel engine was lost (called from the scheduler thread, or
        from the engine's watchdog while this thread waits in a collective): 503 to everyone,
        one line, exit."""
        if self.lost is not None:
            return
        self.lost = error
        self._fail_all(_unavailable(error))
        self._refuse_inbox(_unavailable(error))
        print(f"specscope serve: {error}; exiting", file=sys.stderr, flush=True)
        threading.Timer(LOST_EXIT_AFTER_S, os._exit, (LOST_EXIT_CODE,)).start()

    def _leave(self) -> None:
        with self.lock:
            self.admitted -= 1

    def _gauges(self) -> None:
        cache = self.engine.prompt_cache
        if cache is not None:  # counters move by what the step added
            self.metrics.prefix_queries.inc(cache.asked_tokens - self.prefix_seen[0])
            self.metrics.prefix_hits.inc(cache.hit_tokens - self.prefix_seen[1])
            self.prefix_seen = (cache.asked_tokens, cache.hit_tokens)
        running = self.engine.size
        self.metrics.requests_running.set(running)
        self.metrics.requests_waiting.set(len(self.engine.joining))
        self.metrics.requests_processing.set(running)
        self.metrics.requests_deferred.set(len(self.engine.joining))


@dataclass
class Turn:
    """A request waiting for OneAtATime's engine, or running on it."""

    id: int
    request: "Request"
    should_stop: Callable[[], bool]
    rounds: Iterator[Round] | None = None  # its engine.generate, once it runs
    last: Round | None = None  # the last Round it yielded, as the engine holds it


@dataclass
class OneAtATime:
    """An engine the batch cannot hold, as BatchQueue's batch of one: its requests run through
    engine.generate one after another in arrival order (a request's n choices each alone, one
    after another), each step one Round of the running request. Cancelling is the engine's own
    (it polls `should_stop` between its Rounds)."""

    engine: "Engine"
    running: Turn | None = None
    joining: deque = field(default_factory=deque)  # Turns waiting, in arrival order
    _ids: itertools.count = field(default_factory=itertools.count)
    max_batch = 1
    prompt_cache = None  # (the chat batch's; BatchQueue reads it)

    @property
    def busy(self) -> bool:
        return self.running is not None or bool(self.joining)

    @property
    def size(self) -> int:
        return 0 if self.running is None else 1

    def submit(self, request: "Request", should_stop: Callable[[], bool] | None = None, *, twin_of=None) -> Turn:
        """Queues `request` behind the others (`twin_of`, an earlier choice of the same request,
        changes nothing here: each choice runs alone)."""
        turn = Turn(next(self._ids), request, should_stop or (lambda: False))
        self.joining.append(turn)
        return turn

    def step(self) -> list[tuple[Turn, Round | Exception]]:
        """Waiting requests whose clients left end as "cancelled" without running; then the
        running request's next Round (the first waiting one starts when none runs). An error
        of the engine is the running request's outcome in place of a Round: it alone hears it,
        and the next one runs."""
        gone = [t for t in self.joining if t.should_stop()]
        for turn in gone:
            self.joining.remove(turn)
        out: list[tuple[Turn, Round | Exception]] = [(t, _closing(t, "cancelled")) for t in gone]
        if self.running is None and self.joining:
            self.running = self.joining.popleft()
        turn = self.running
        if turn is None:
            return out
        try:
            if turn.rounds is None:
                turn.rounds = self.engine.generate(turn.request, should_stop=turn.should_stop)
            rnd = next(turn.rounds, None)
        except Exception as e:
            self._let_go()
            return out + [(turn, e)]
        if rnd is None:  # its Rounds ran out without a finishing one: the engine marked its last
            # one after yielding it (engines/remote), or never did
            rnd = _closing(turn, (turn.last.finish if turn.last else None) or "stop")
        else:
            # a copy goes out: what the engine changes in its Round after yielding it must not
            # reach the request, which hears of the end from the closing Round above
            turn.last, rnd = rnd, copy.copy(rnd)
        if rnd.finish:
            self._let_go()
        return out + [(turn, rnd)]

    def clear(self) -> None:
        """Drops every request, running or waiting (each has heard why)."""
        if self.running is not None:
            self._let_go()
        self.joining.clear()

    def _let_go(self) -> None:
        """The running request's generate closed (a generator's `finally` runs now, not when it
        is collected) and the engine free for the next."""
        close = getattr(self.running.rounds, "close", None)  # (the protocol's Iterator may not have one)
        if close is not None:
            close()
        self.running = None


def _closing(turn: Turn, finish: str) -> Round:
    """A Round that ran no forward and only ends its request (as the batch's cancelled ones do)."""
    return Round(index=turn.last.index + 1 if turn.last else 0, proposed=0, accepted=0, tokens=[], from_draft=[],
                 text="", accept_flags=[], draft_s=0.0, verify_s=0.0, wall_s=0.0, prefill=turn.last is None,
                 finish=finish)


def _stopped(error: BaseException) -> ApiError:
    return ApiError(503, f"the batch loop stopped ({type(error).__name__}: {error}); restart the server",
                    "engine_stopped", kind="server_error")


def _unavailable(error: Exception) -> ApiError:
    return ApiError(503, f"the model's ranks are broken ({error}); the server is exiting", "rank_lost",
                    kind="server_error")
