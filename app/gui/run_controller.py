"""One run in the window, top to bottom: `run` -> `start` (builds the Request from the controls
and the shown pane, starts a RunWorker on its own QThread: app/gui/worker.py) ->
`_on_engine_loaded` -> `_on_round` (buffers) -> `_show_pending` (draws within a time budget) ->
`_on_finished` | `_on_cancelled` | `_on_errored`. OCR reads a document one page per run:
`read_document` asks the OCR pane for the pages not read yet, and `_on_finished` starts the next
page until the pane says the reading has ended; a page read by region is app/gui/document_run.py's.
An A/B compare (app/gui/ab_compare.py) is two runs started here.

The window keeps what every job shares -- `worker` (its `running`), the threads, the signals
run_started / round_shown / run_ended / page_read -- and the panes; this controller drives them."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict

from PySide6.QtCore import QObject, QTimer

from app.gui.ab_compare import A_B_ON
from app.gui.worker import RunSpec, RunWorker, start_worker
from app.records.bursts import Burst
from app.records.sessions import page_record
from engines.speculative.repetition import acceptance_jump
from engines.speculative.rounds import fallback_note
from engines.speculative.session import Session
from engines.types import EngineError, Request, SpecConfig
from engines.validation import validate

SHOW_INTERVAL_MS = 15  # how often buffered rounds are drawn
SHOW_BUDGET_S = 0.012  # and for how long at most, so the event loop always gets its turn


class RunController(QObject):
    """Drives the window's runs. A QObject living on the GUI thread: the workers' signals reach
    its bound methods queued, on this thread."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.fallback: str | None = None  # the shown run's drafter fallback, if its drafter failed
        self.pending: deque[Burst] = deque()  # rounds received but not drawn yet
        self.pending_end = None  # (handler, payload) of a run end that waits for them
        self.flush_timer = QTimer(self)
        self.flush_timer.setInterval(SHOW_INTERVAL_MS)
        self.flush_timer.timeout.connect(self._show_pending)

    def run(self) -> bool:
        """Starts a run from the controls (chat: send; OCR: read the pages, or the region);
        False (with a message) when it cannot start."""
        w = self.window
        if w.running:
            return False
        w.ab.cancel()
        if w.controls.engine == "ocr":
            return self.read_document()
        return self.start(label="")

    def read_document(self) -> bool:
        """OCR: reads the pages not read yet, in order, one run per page (or the region drawn);
        by region when the layout model is there (app.gui.document_run)."""
        w = self.window
        w.ocr.reading = w.ocr.plan_reading()
        if w.ocr.reading is None:
            return False
        if not self.read_next_page():
            w.ocr.reading = None
            return False
        if not w.ocr.reading.region:
            w.document_run.say_if_missing()
        return True

    def read_next_page(self) -> bool:
        w = self.window
        layout = w.document_run.layout_for_next_page()
        if layout is not None:
            if not w.document_run.read_page(layout):
                w.ocr.page_not_started()
                return False
            return True
        label, image = w.ocr.page_starting()
        if not self.start(label, image=image):
            w.ocr.page_not_started()
            return False
        return True

    def build_request(self, spec: SpecConfig | None = None, image: str | None = None) -> Request:
        """The run the controls describe. Raises EngineError for what the user must fix first."""
        w = self.window
        c = w.controls
        request = Request(kind=c.engine, max_tokens=c.max_tokens_spin.value(),
                          spec=spec or c.spec_config(), sampling=c.sampling(), max_repeat=c.max_repeat)
        if c.engine == "ocr":
            w.ocr.fill(request, image, c.task_combo.currentData())
        else:
            w.chat.fill(request, c.system_edit.toPlainText().strip() or None)
        validate(request)  # the same check as the CLI's and the server's (engines.validation)
        return request

    def start(self, label: str, spec: SpecConfig | None = None, image: str | None = None) -> bool:
        w = self.window
        if w.tuner.running:  # a run beside the measurement would skew it, and share its model
            w.transcript.show_message("Tune\u2026 is measuring this machine: runs wait until it ends "
                                      "(or cancel it: Run \u203a Tune Speculation\u2026)", "info")
            return False
        try:
            request = self.build_request(spec, image)
        except EngineError as e:
            w.transcript.show_message(str(e), "info")
            return False
        self.pick_paired_drafter(request)
        saving = w.autosaving.on
        page = w.ocr.run_page() if request.kind == "ocr" else None
        run = RunSpec(request=request, model=w.controls.model_path(),
                      options=w.controls.engine_options(), settings=self.run_settings(),
                      autosave=w.autosaving.path_for(request.kind), label=label,
                      page=page_record(page) if page is not None else None)
        self._begin_panes(request, label)
        if saving and not w.autosaving.on:  # the autosave folder failed just now: say so with this run
            w.transcript.show_message(w.autosaving.message, "warning")
        w.worker = RunWorker(run, w.engines)
        w.worker.engine_loaded.connect(self._on_engine_loaded)
        w.worker.prefill_progressed.connect(self._on_prefill_progressed)
        w.worker.round_finished.connect(self._on_round)
        w.worker.autosave_failed.connect(w.autosaving.show_failed)
        # bound methods of this window, never lambdas: a lambda would run on the worker thread
        w.worker.finished.connect(self._on_worker_finished)
        w.worker.cancelled.connect(self._on_worker_cancelled)
        w.worker.errored.connect(self._on_worker_errored)
        w.thread = start_worker(w.worker)
        w.thread.finished.connect(w.forget_finished_threads)
        w.threads.append((w.thread, w.worker))  # both live until the thread has finished
        w.controls.set_running(True)
        w.chat.set_running(True)
        w.status.setText("Loading the model\u2026")
        w.run_started.emit(run)
        return True

    def run_settings(self) -> dict:
        """The window's settings as a run records them (the window's geometry left out)."""
        w = self.window
        w.controls.store_settings(w.settings)
        settings = asdict(w.settings)
        settings.pop("window_geometry", None)
        settings.pop("window_state", None)
        return settings

    def pick_paired_drafter(self, request: Request) -> None:
        """MTP without a drafter chosen: the chat target's paired assistant, as the CLI does."""
        w = self.window
        if request.kind == "chat" and request.spec.method == "mtp" and not request.spec.draft_model:
            from app.models.lookup import paired_drafter

            model = w.controls.model_path()
            try:
                request.spec.draft_model = paired_drafter(model) if model else None
            except EngineError:
                pass  # the offer above the pane says what is missing; the engine says it too

    def _begin_panes(self, request: Request, label: str) -> None:
        w = self.window
        self.fallback = None
        w.transcript.hide_message()
        w.transcript.show_rendered(False)
        if request.kind == "chat":
            w.chat.begin(request, label, second_of_compare=label == A_B_ON)
        else:
            w.ocr.begin(label, second_of_compare=label == A_B_ON)
        w.session = None
        if w.telemetry is not None:
            w.telemetry.clear()

    def stop(self) -> None:
        w = self.window
        if w.worker is not None:
            w.worker.request_stop()
            w.status.setText("Stopping after this round\u2026")
        w.ab.cancel()

    def _on_engine_loaded(self, session: Session) -> None:
        w = self.window
        w.session = session
        w.session_settings = w.worker.spec.settings if w.worker else {}
        w.show_model(session.model, session.request.get("kind"))
        w.status.setText(w.ocr.progress_text() or "Running\u2026")  # "Reading page 2 (2 of 5)…"
        if w.telemetry is not None:
            w.tuner.show_in(w.telemetry, session)

    def _on_prefill_progressed(self, progress) -> None:
        w = self.window
        w.status.setText(progress.describe().capitalize() + " \u2014 Esc stops")

    def _on_round(self, burst: Burst) -> None:
        """Queued from the worker. Only buffers: a fast engine can emit rounds faster than the
        panes draw them, and Qt delivers all queued events in one batch, so drawing here would
        starve the event loop. `_show_pending` drains the buffer within a time budget."""
        w = self.window
        if w.session is not None:
            w.session.add(burst.round)
        self.pending.append(burst)
        if not self.flush_timer.isActive():
            self.flush_timer.start()

    def _show_pending(self) -> None:
        w = self.window
        deadline = time.perf_counter() + SHOW_BUDGET_S
        last = None
        while self.pending and time.perf_counter() < deadline:
            last = self.pending.popleft()
            self._show_burst(last)
        if last is not None and not last.round.prefill and last.round.wall_s > 0:
            rnd = last.round
            w.status.setText(f"Round {rnd.index} \u00b7 {len(rnd.tokens) / rnd.wall_s:.1f} tok/s"
                             + (f" \u00b7 {self.fallback}" if self.fallback else ""))
        if not self.pending:
            self.flush_timer.stop()
            if self.pending_end is not None:
                handler, payload = self.pending_end
                self.pending_end = None
                handler(payload)

    def _show_burst(self, burst: Burst) -> None:
        w = self.window
        rnd = burst.round
        self.fallback = self.fallback or fallback_note(rnd)  # the drafter failed: said until the run ends
        w.transcript.append_burst(burst)
        if w.telemetry is not None:
            w.telemetry.append(rnd)
        w.round_shown.emit(burst)

    def _on_worker_finished(self, session: Session) -> None:
        self._after_pending(self._on_finished, session)

    def _on_worker_cancelled(self, session: Session) -> None:
        self._after_pending(self._on_cancelled, session)

    def _on_worker_errored(self, message: str) -> None:
        self._after_pending(self._on_errored, message)

    def _after_pending(self, handler, payload) -> None:
        """Run-end handling waits until every round has been shown."""
        if self.pending:
            self.pending_end = (handler, payload)
        else:
            handler(payload)

    def end_run(self) -> None:
        w = self.window
        w.worker = None
        w.controls.set_running(False)
        w.chat.set_running(False)
        if w.persist:
            w.save_settings()

    def _on_finished(self, session: Session) -> None:
        w = self.window
        self.end_run()
        stats = session.stats()
        w.status.setText(f"Finished ({session.finish or 'done'}): {stats.tokens} tokens, "
                         f"{stats.rounds} rounds, {stats.decode_tok_s:.1f} tok/s"
                         + (f" \u00b7 {stats.fallback}" if stats.fallback else ""))
        if w.telemetry is not None:
            w.telemetry.refresh(force=True)
        if session.finish == "repetition":
            self.show_repetition(session, w.ocr.current_label())
        if w.ab.active:
            w.ab.run_finished(session)
            w.run_ended.emit("finished")
            return
        if session.request.get("kind") == "chat":
            w.chat.remember_turn(session)
        if w.ocr.reading is not None:
            self._page_ended(session)
            if w.ocr.reading.queue:
                if self.read_next_page():
                    return
                w.ocr.reading = None
                w.run_ended.emit("errored")
                return
            summary = w.ocr.reading_ended()
            if summary:
                w.status.setText(summary)
        w.run_ended.emit("finished")

    def _page_ended(self, session: Session) -> None:
        w = self.window
        result = w.ocr.page_ended(session)
        if result is not None:
            w.page_read.emit(result)

    def show_repetition(self, session: Session, page_label: str | None = None) -> None:
        """A run stopped because it repeated itself: say so, and show what speculation saw."""
        w = self.window
        note = next((r.note for r in reversed(session.rounds) if r.note and "repeats" in r.note),
                    "stopped: the output repeats itself")
        where = f" on {page_label}" if page_label else ""
        jump = acceptance_jump(session.rounds)
        signal = ""
        if jump is not None:
            recent, before = jump
            signal = (f" Draft acceptance rose to {100 * recent:.0f}% over the last rounds "
                      f"(from {100 * before:.0f}%): the model was copying itself.")
        w.transcript.show_message(f"{note[0].upper()}{note[1:]}{where}.{signal} "
                                  "(\u201cStop loops at\u201d under Sampling, or --max-repeat, sets how many "
                                  "copies end a run; Off lets it run to max tokens.)", "warning")

    def _on_cancelled(self, session: Session) -> None:
        w = self.window
        self.end_run()
        w.status.setText(f"Stopped after {len(session.rounds)} rounds")
        if session.request.get("kind") == "chat" and session.text:
            w.chat.remember_turn(session)
        w.ab.cancel()
        if w.ocr.reading is not None:
            self._page_ended(session)
            read = len(w.ocr.results) + len(w.ocr.layout_pages)
            w.status.setText(f"Stopped after {len(session.rounds)} rounds; {read} page{'s' * (read != 1)} read "
                             "are kept \u2014 Read goes on from the next page")
            w.ocr.reading_stopped()
        if w.telemetry is not None:
            w.telemetry.refresh(force=True)
        w.run_ended.emit("cancelled")

    def _on_errored(self, message: str) -> None:
        w = self.window
        self.end_run()
        w.ab.cancel()
        if w.ocr.reading is not None:
            w.ocr.reading_failed(message)
        w.transcript.show_message(message, "error")
        w.status.setText("Error")
        w.run_ended.emit("errored")
