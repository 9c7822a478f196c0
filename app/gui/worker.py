"""A run on its own QThread, with the engine in the window's engine process
(app.gui.engine_process): the superqt `_qthreading` pattern, a job's replies become signals,
abort is cooperative between rounds.

The GUI thread never waits on a model: starting the engine process, reading its replies and
the autosave writes all happen on this thread; loading, hashing the model and every target
forward happen in the engine process. Stop reaches the engine between rounds, and a round
already on its way is the last one shown, so a run stops within one round. Signals are
past-tense events; exactly one of finished / cancelled / errored is emitted per run, then
`done`. The autosave is written here, in the window's process, so every round received is
saved even when the engine process dies; its end then says errored, with the message."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.gui.engine_process import EngineProcess, StopFlag
from app.records.bursts import Burst
from app.records.sessions import Autosave
from engines.types import EngineError, Request
from engines.speculative.session import Session
from engines.speculative.trace import TraceError


@dataclass
class RunSpec:
    """Everything one run needs, decided on the GUI thread."""

    request: Request
    model: str = ""  # path; "" = the default for request.kind
    options: dict = field(default_factory=dict)  # load_engine options (e.g. runtime="torch")
    settings: dict = field(default_factory=dict)  # the window's settings, recorded with the run
    autosave: Path | None = None
    label: str = ""  # what the run is for ("", "A/B: off", "A/B: on")
    page: dict | None = None  # OCR: the document page read (app.records.sessions.page_record), for the autosave


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

    def __init__(self, spec: RunSpec, engines: EngineProcess):
        super().__init__()
        self.spec = spec
        self.engines = engines
        self.stop = StopFlag()
        self.session: Session | None = None
        self.autosave: Autosave | None = None

    def request_stop(self) -> None:
        """Called from the GUI thread: the engine process stops between rounds."""
        self.engines.request_stop(self.stop)

    @Slot()
    def run(self) -> None:
        self.started.emit()
        try:
            outcome = self.engines.run(self.spec.request, self.spec.model, self.spec.options, self.stop,
                                       on_loaded=self._loaded, on_prefill=self.prefill_progressed.emit,
                                       on_burst=self._received)
        except EngineError as e:  # the engine's own, or the engine process died (one line each)
            self._end("errored", str(e))
            self.errored.emit(str(e))
        except Exception as e:  # a bug here must not take the window down
            traceback.print_exc()
            message = f"{type(e).__name__}: {e}"
            self._end("errored", message)
            self.errored.emit(message)
        else:
            self._end(outcome)
            (self.cancelled if outcome == "cancelled" else self.finished).emit(self.session)
        finally:
            if self.autosave is not None:
                self.autosave.close()
            self.done.emit()

    def _loaded(self, model: dict) -> None:
        self.session = Session(request=self.spec.request.to_dict(), model=model)
        self.autosave = self._open_autosave()
        self.engine_loaded.emit(Session(self.session.request, model, machine=self.session.machine,
                                        started_at=self.session.started_at))

    def _received(self, burst: Burst) -> None:
        self.session.add(burst.round)
        if self.autosave is not None:
            self.autosave.write_burst(burst)
        self.round_finished.emit(burst)

    def _open_autosave(self) -> Autosave | None:
        """The autosave is telemetry: when it cannot be written the run goes on and says so."""
        if self.spec.autosave is None:
            return None
        try:
            return Autosave(self.spec.autosave, self.session, self.spec.settings,
                            on_error=self.autosave_failed.emit, page=self.spec.page)
        except TraceError as e:
            self.autosave_failed.emit(str(e))
            return None

    def _end(self, outcome: str, message: str | None = None) -> None:
        if self.autosave is not None:
            self.autosave.write_end(outcome, message)  # a failure here was already said (on_error)


class EnginePreload(QObject):
    """Loads an engine in the engine process ahead of the first run (the window starts one for
    the chat model as it opens, so the first Send does not wait for MLX and the weights)."""

    loaded = Signal(object)  # the model info
    failed = Signal(str)  # one line; the first run reports it again, with what to do
    done = Signal()

    def __init__(self, kind: str, model: str, options: dict, engines: EngineProcess):
        super().__init__()
        self.kind, self.model, self.options, self.engines = kind, model, options, engines

    @Slot()
    def run(self) -> None:
        try:
            info = self.engines.load(self.kind, self.model, self.options)
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
