"""The main window: composes the panes and what drives them. No inference code here: a run is a
RunSpec handed to a RunWorker on its own QThread (app.gui.worker), and the engine runs in the
window's engine process (app.gui.engine_process), so a native crash there is a message here.

Layout: controls sidebar | document pane (page list, page) | the mode's pane, with the telemetry
pane underneath. The telemetry pane (pyqtgraph) is built right after the window is first shown,
so the window appears before pyqtgraph is imported.

Each mode's pane keeps its own state (app.gui.views.chat_pane, ocr_pane: transcript, run shown,
A/B result, status line; the conversation; the pages read): switching modes shows the other
mode as it was left. What the window composes, one concern each:
  runs           app.gui.run_controller: one run, top to bottom (Read / Send, Stop)
  document_run   app.gui.document_run: a page read by region
  ab             app.gui.ab_compare: A/B compare, speculation off then on
  autosaving     app.gui.autosave: whether runs are saved; a crashed run's recovery
  session_files  app.gui.session_files: saved sessions reopened; exports
  tuner          app.gui.tuning: Tune…
The window keeps what they share: the panes, `worker` (its `running`) and the threads, and the
signals its runs emit.

At any size (docs/architecture.md): the window's minimum is what the panes need in their
narrowest arrangement; reflow_panes puts OCR's document above its text when the two do not fit
side by side, the speculation strip reflows itself (app.gui.views.telemetry)."""

from __future__ import annotations

import base64
import sys

from PySide6.QtCore import QByteArray, QEvent, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QApplication, QFrame, QMainWindow, QScrollArea, QSizePolicy, QSplitter, QStackedWidget, QVBoxLayout, QWidget,
)

from app import APP_NAME
from app.records.compare import CompareResult
from app.records.documents import page_figures
from app.settings import AppSettings, data_dir, save_settings
from app.gui.ab_compare import AbCompare, series_of
from app.gui.autosave import Autosaving
from app.gui.menus import build_menus
from app.gui.model_jobs import ModelJobs
from app.gui.views.chat_pane import ChatPane
from app.gui.views.controls import ControlsPanel
from app.gui.document_run import DocumentRun
from app.gui.views.document import DocumentView
from app.gui.views.elided_label import ElidedLabel
from app.gui.views.models_dialog import ModelOffer, ModelsDialog, missing_model
from app.gui.views.ocr_pane import OcrPane
from app.gui.server_watch import ServerWatch
from app.gui.session_files import SessionFiles
from app.gui.tuning import Tuner
from app.gui.views.server_dialog import ServerDialog
from app.gui.views.server_load import ServerLoadView
from app.gui.views.transcript import TranscriptView
from app.gui.engine_process import EngineLoader, EngineProcess
from app.gui.run_controller import RunController
from app.gui.worker import EnginePreload, RunWorker, start_worker
from engines.speculative.session import Session
from engines.types import EngineError


GIL_SWITCH_INTERVAL_S = 0.0005
DEFAULT_SIZE = (1480, 920)  # shrunk to the screen, so it also fits 1280x800
# The speculation strip's height in its tallest arrangement (cards in 2 rows above the plots),
# reserved before pyqtgraph is imported so that the window's minimum does not change when the
# plots arrive (tests/app/gui/test_layout.py checks it against TelemetryView.minimumSizeHint).
TELEMETRY_MIN_HEIGHT = 230
ENGINE_QUIT_S = 2.0  # on close, how long the engine process has to end its round and quit before it is killed


def runtime_text(kind: str | None, model: dict) -> str:
    """Which runtime and which compute units a run uses, for the status bar."""
    if kind == "ocr":
        if model.get("runtime") == "coreml":
            return f"Core ML \u00b7 compute units: {model.get('compute_units') or 'all'}"
        if model.get("runtime") == "coreml-twin":
            return "Core ML twin (PyTorch) \u00b7 CPU"
        dtype = f" \u00b7 {model['dtype']}" if model.get("dtype") else ""
        return f"PyTorch \u00b7 CPU{dtype}"
    device = f" \u00b7 {model['device']}" if model.get("device") else ""  # the engine process says (MLX is not loaded here)
    dense = " \u00b7 float32 (dequantized)" if str(model.get("weights", "")).startswith("float32") else ""
    return f"MLX{device}{dense}"


class MainWindow(QMainWindow):
    run_started = Signal(object)  # the RunSpec
    round_shown = Signal(object)  # a Burst, after the panes have taken it
    run_ended = Signal(str)  # finished | cancelled | errored, after the pane updates
    compare_finished = Signal(object)  # CompareResult
    page_read = Signal(object)  # a PageResult, after its page has ended (OCR)
    telemetry_ready = Signal()
    model_preloaded = Signal(str)  # "" when the chat model is ready, else why it could not load

    def __init__(self, settings: AppSettings | None = None, engine_loader: EngineLoader | None = None,
                 persist: bool = True, autosave: bool = True, preload: bool = False):
        super().__init__()
        self.settings = settings or AppSettings()
        self.persist = persist  # save settings on close (off for tests and screenshots)
        self.preload = preload  # load the chat model in the background once the window shows (the app does)
        # the engines run in a child process (app.gui.engine_process): a native crash there is a
        # message here. engine_loader (tests) runs in that process: a top-level function.
        self.engines = EngineProcess(engine_loader)
        self.mode = "chat"
        self.worker: RunWorker | None = None
        self.thread = None
        self.threads: list = []  # (QThread, RunWorker) pairs, kept alive until the thread finishes
        self.telemetry = None
        self._telemetry_queued = False

        # The worker thread runs Python for every round (reading it from the engine process,
        # the autosave). Every time the GUI thread calls into Qt it releases the GIL, and getting
        # it back waits for the worker's switch interval (5 ms by default); a few dozen such
        # calls per frame add up to visible stutter.
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)

        self.setWindowTitle(APP_NAME)
        self.setAcceptDrops(True)
        self.autosaving = Autosaving(self, autosave)  # whether runs are saved; a crashed run's recovery
        self.session_files = SessionFiles(self)  # saved sessions reopened; exports
        self.ab = AbCompare(self)  # A/B compare: speculation off, then on
        self.runs = RunController(self)  # one run, top to bottom
        self._build_panes()
        output = self._build_output_column()
        self._build_splits(output)
        self._connect_controls()
        self.document_run = DocumentRun(self)  # pages read by region (the layout stage)
        actions = build_menus(self)
        self.run_action, self.stop_action, self.clear_action, self.models_action = actions
        self.autosaving.check_at_start()
        self.controls.apply_settings(self.settings)
        self.mode = self.controls.engine
        self._on_engine_changed(self.controls.engine)
        self._restore_geometry()
        if not self.settings.window_geometry:
            self.resize(*self.default_size())
        # The document beside its text, or above it (reflow_panes): as narrow as the narrower of
        # the two arrangements, as low as the lower; chat shows its pane alone.
        document = self.document.minimumSizeHint()
        self.top_split.setMinimumSize(
            max(document.width(), *(pane.minimumSizeHint().width() for pane in self.panes.values())),
            max(self.chat.minimumSizeHint().height(),
                document.height() + self.top_split.handleWidth() + self.ocr.minimumSizeHint().height()))
        # An explicit minimum, what the content needs in its narrowest arrangement: without one
        # the layout would raise the window's minimum when the plots arrive after the first paint,
        # and offscreen Qt warns "This plugin does not support propagateSizeHints()" on every such
        # change.
        self.setMinimumSize(self.minimumSizeHint())

    def _build_panes(self) -> None:
        """The sidebar, the document, the chat and OCR panes and the telemetry's holder."""
        self.controls = ControlsPanel()
        # The sidebar scrolls when the window is lower than its controls, so that the window's
        # minimum height is the panes', not the sidebar's.
        self.sidebar = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame, objectName="sidebar")
        self.sidebar.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.sidebar.setWidget(self.controls)
        self.sidebar.setMinimumWidth(self.controls.minimumWidth() + self.sidebar.verticalScrollBar().sizeHint().width())
        self.document = DocumentView(paste_dir=data_dir() / "pasted")
        self.document.load_failed.connect(lambda message: self.ocr.transcript.show_message(message, "error"))
        self.document.page_changed.connect(self._show_page_result)
        self.chat = ChatPane()
        self.chat.submitted.connect(self.run)
        self.chat.clear_clicked.connect(self.clear_conversation)
        self.ocr = OcrPane(self.document)
        self.panes = {"chat": self.chat, "ocr": self.ocr}
        self.pane_stack = QStackedWidget()
        for pane in self.panes.values():
            self.pane_stack.addWidget(pane)
            pane.transcript.round_selected.connect(self._select_in_telemetry)
        self.telemetry_holder = QWidget(objectName="telemetryHolder")
        QVBoxLayout(self.telemetry_holder).setContentsMargins(0, 0, 0, 0)
        self.telemetry_holder.setMinimumHeight(TELEMETRY_MIN_HEIGHT)

    def _build_output_column(self) -> QWidget:
        """The mode's pane under its notices: the model offer, a crashed run's recovery, Tune…'s
        offer and the server's load."""
        output = QWidget(objectName="outputPane")
        output_col = QVBoxLayout(output)
        output_col.setContentsMargins(0, 0, 0, 0)
        output_col.setSpacing(0)
        self.model_jobs = ModelJobs(self)  # downloads / conversions, one at a time
        self.models_dialog: ModelsDialog | None = None
        self.model_offer = ModelOffer(self.model_jobs)  # "OCR needs GLM-OCR ... [Download GLM-OCR]"
        self.model_offer.models_requested.connect(self.open_models_dialog)
        output_col.addWidget(self.model_offer)
        output_col.addWidget(self.autosaving.recovery)
        self.tuner = Tuner(self.engines, self)  # Tune…, and its offer when an Auto run has no profile
        self.tuner.tune_requested.connect(self.tune)
        self.round_shown.connect(self.tuner.round_shown)
        output_col.addWidget(self.tuner.offer)
        self.server_load = ServerLoadView()  # the server's batch, while the model is a server's
        self.server_watch = ServerWatch(self)
        self.server_watch.load_measured.connect(self.server_load.show_load)
        self.server_watch.load_failed.connect(self.server_load.show_error)
        output_col.addWidget(self.server_load)
        output_col.addWidget(self.pane_stack, 1)
        return output

    def _build_splits(self, output: QWidget) -> None:
        """Sidebar | (document | output) over the telemetry, and the status bar."""
        self.top_split = QSplitter(Qt.Orientation.Horizontal)
        self.top_split.addWidget(self.document)
        self.top_split.addWidget(output)
        self.top_split.setSizes([510, 490])  # at 1280 px the document bar fits a file name, the text pane its tools
        self.main_split = QSplitter(Qt.Orientation.Vertical)
        self.main_split.addWidget(self.top_split)
        self.main_split.addWidget(self.telemetry_holder)
        self.main_split.setSizes([600, 290])
        self.side_split = QSplitter(Qt.Orientation.Horizontal)
        self.side_split.addWidget(self.sidebar)
        self.side_split.addWidget(self.main_split)
        self.side_split.setStretchFactor(1, 1)
        self.main_split.installEventFilter(self)
        for split in (self.top_split, self.main_split, self.side_split):
            split.setChildrenCollapsible(False)
            split.setHandleWidth(1)
        self.setCentralWidget(self.side_split)
        self.status = ElidedLabel("Ready")
        self.statusBar().addWidget(self.status, 1)
        self.statusBar().addPermanentWidget(self.autosaving.label)
        self.model_label = ElidedLabel(objectName="muted")
        self.statusBar().addPermanentWidget(self.model_label)

    def _connect_controls(self) -> None:
        """The sidebar's and the model jobs' events."""
        self.controls.run_requested.connect(self.run)
        self.controls.stop_requested.connect(self.stop)
        self.controls.compare_requested.connect(self.ab.start)
        self.controls.tune_requested.connect(self.tune)
        self.controls.engine_changed.connect(self._on_engine_changed)
        self.controls.method_combo.currentIndexChanged.connect(self.update_model_offer)
        self.controls.model_combo.currentTextChanged.connect(self.update_model_offer)
        self.controls.model_combo.currentTextChanged.connect(self.watch_server)
        self.controls.draft_edit.textChanged.connect(self.update_model_offer)
        for event in (self.model_jobs.finished, self.model_jobs.cancelled, self.model_jobs.errored):
            event.connect(self.update_model_offer)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        # the model line elides before the run's status line does: at most half the status bar
        self.model_label.setMaximumWidth(max(self.model_label.minimumSizeHint().width(), event.size().width() // 2))

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt's name)
        # the panes' own width, not the window's: the layouts size them after the window's resize
        # (and a window sized before it is shown gets its panes' sizes only when it shows)
        if watched is self.main_split and event.type() == QEvent.Type.Resize:
            self.reflow_panes()
        return False

    def reflow_panes(self) -> None:
        """OCR: the document beside its text when both fit side by side, else above it."""
        need = (self.document.minimumSizeHint().width() + self.pane_stack.minimumSizeHint().width()
                + self.top_split.handleWidth())
        beside = self.mode != "ocr" or self.main_split.width() >= need
        orientation = Qt.Orientation.Horizontal if beside else Qt.Orientation.Vertical
        if self.top_split.orientation() != orientation:
            self.top_split.setOrientation(orientation)

    def default_size(self) -> tuple[int, int]:
        screen = self.screen().availableGeometry() if self.screen() else None
        if screen is None:
            return DEFAULT_SIZE
        return min(DEFAULT_SIZE[0], screen.width()), min(DEFAULT_SIZE[1], screen.height())

    # --- the shown mode's pane ---------------------------------------------------------------
    @property
    def pane(self) -> ChatPane | OcrPane:
        return self.panes[self.mode]

    @property
    def transcript(self) -> TranscriptView:
        return self.pane.transcript

    @property
    def session(self) -> Session | None:
        return self.pane.session

    @session.setter
    def session(self, session: Session | None) -> None:
        self.pane.session = session

    @property
    def session_settings(self) -> dict:
        return self.pane.session_settings

    @session_settings.setter
    def session_settings(self, settings: dict) -> None:
        self.pane.session_settings = settings

    @property
    def last_compare(self) -> CompareResult | None:
        return self.pane.last_compare

    @last_compare.setter
    def last_compare(self, result: CompareResult | None) -> None:
        self.pane.last_compare = result

    # --- window furniture -----------------------------------------------------------------
    def show_about(self) -> None:
        from app.gui.views.about import show_about

        show_about(self, self.session.model if self.session else None)

    def open_readme(self) -> None:
        from app.gui.views.about import open_readme

        open_readme(self)

    def _restore_geometry(self) -> None:
        try:
            if self.settings.window_geometry:
                self.restoreGeometry(QByteArray(base64.b64decode(self.settings.window_geometry)))
        except ValueError:
            pass

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        # After the first paint, not on show: a zero timer set on show fires before the window's
        # first paint, and the plots' import (pyqtgraph) would delay it by a second or more.
        if not self._telemetry_queued:  # the first paint: what waited for it
            self._telemetry_queued = True
            if self.telemetry is None:
                QTimer.singleShot(0, self.ensure_telemetry)
            QTimer.singleShot(0, self.controls.refresh_installed_models)
            if self.preload:
                QTimer.singleShot(0, self.preload_chat_model)

    def preload_chat_model(self) -> None:
        """Loads the chat model on a worker thread as the window opens, so the first Send
        does not wait for it; the status bar says it is loading."""
        if self.running or self.controls.engine != "chat":
            return
        worker = EnginePreload("chat", self.controls.model_path(), self.controls.engine_options(), self.engines)
        worker.loaded.connect(self._on_preloaded)
        worker.failed.connect(self._on_preload_failed)
        thread = start_worker(worker)
        thread.finished.connect(self.forget_finished_threads)
        self.threads.append((thread, worker))
        self.chat.status = "Loading the chat model in the background\u2026"
        if self.mode == "chat":
            self.status.setText(self.chat.status)

    def _on_preloaded(self, model: dict) -> None:
        state = self.chat
        if state.status.startswith("Loading the chat model"):
            state.status = f"Ready \u00b7 {model.get('name', 'the model')} is loaded"
            state.model_label = f"{model.get('name', '?')} \u00b7 {model.get('hash', '')}"
            if self.mode == "chat" and not self.running:
                self.status.setText(state.status)
                self.model_label.setText(state.model_label)
        self.model_preloaded.emit("")

    def _on_preload_failed(self, message: str) -> None:
        state = self.chat
        if state.status.startswith("Loading the chat model"):
            state.status = "Ready"
            if self.mode == "chat" and not self.running:
                self.status.setText("Ready")
        self.model_preloaded.emit(message)  # the first Send reports it, with what to do

    def ensure_telemetry(self):
        """Imports pyqtgraph and builds the plots (after the first paint, to start fast)."""
        if self.telemetry is None:
            from app.gui.views.telemetry import TelemetryView

            self.telemetry = TelemetryView()
            self.telemetry.round_selected.connect(lambda index: self.transcript.select_round(index))
            self.telemetry_holder.layout().addWidget(self.telemetry)
            if self.session is not None:  # rounds that arrived before the plots existed
                self.tuner.show_in(self.telemetry, self.session)
                for rnd in self.session.rounds:
                    self.telemetry.append(rnd)
            self.telemetry_ready.emit()
        return self.telemetry

    def _select_in_telemetry(self, index: int) -> None:
        self.ensure_telemetry().select_round(index)

    def _on_engine_changed(self, engine: str) -> None:
        """Shows the other mode as it was left: its transcript, plots, A/B result and status."""
        old = self.pane
        if engine != self.mode:
            old.status, old.model_label = self.status.text(), self.model_label.text()
        self.mode = engine
        ocr = engine == "ocr"
        self.document.setVisible(ocr)
        self.pane_stack.setCurrentWidget(self.pane)
        self.reflow_panes()
        for pane in self.panes.values():
            # a stack is as wide as its widest page: the hidden chat pane's title bar would hold
            # the OCR layout's text pane at 529 px and squeeze the document's bar at 1280 px
            policy = QSizePolicy.Policy.Preferred if pane is self.pane else QSizePolicy.Policy.Ignored
            pane.setSizePolicy(policy, policy)
        self.controls.run_button.setVisible(ocr)  # chat's primary action is Send, beside the prompt
        self.run_action.setText("Read" if ocr else "Send")
        self.clear_action.setEnabled(not ocr)
        state = self.pane
        self.status.setText(state.status)
        self.model_label.setText(state.model_label)
        if self.telemetry is not None:
            self._show_in_telemetry(state.session, state.last_compare)
        if hasattr(self, "server_watch"):  # (the first call comes before the views are built)
            self.watch_server()
        self.update_model_offer()

    def _show_in_telemetry(self, session: Session | None, compare: CompareResult | None = None) -> None:
        telemetry = self.ensure_telemetry()
        telemetry.clear()
        telemetry.set_baseline(series_of(compare.off) if compare else None)
        telemetry.set_speedup(f"{compare.decode_speedup:.2f}\u00d7" if compare else "\u2013")
        self.tuner.show_in(telemetry, session)
        for rnd in session.rounds if session else []:
            telemetry.append(rnd)
        telemetry.refresh(force=True)

    def clear_conversation(self) -> None:
        """Starts a new chat: no history, an empty transcript, no figures."""
        if self.running or self.mode != "chat":
            return
        self.chat.clear()
        self.status.setText("Ready")
        if self.telemetry is not None:
            self._show_in_telemetry(None)

    def update_model_offer(self, *_event) -> None:
        """The pane says what its mode is missing, with the one button that gets it."""
        c = self.controls
        try:
            offer = missing_model(c.engine, c.model_path(), c.method, c.draft_edit.text().strip(),
                                  layout=self.document.layout_button.isChecked())
        except EngineError as e:  # an unreadable model list: say so, and offer the dialog
            from app.gui.views.models_dialog import Offer

            offer = Offer(str(e), "Open Models\u2026", None)
        self.model_offer.show_offer(offer)

    def watch_server(self, *_event) -> None:
        """While the model is a server's, show what its batch is doing (ServerWatch)."""
        from engines.remote.engine import base_url, is_server_url

        path = self.controls.model_path()
        if self.mode == "chat" and is_server_url(path):
            base = base_url(path.partition("#")[0])
            if base != self.server_watch.base or self.server_load.isHidden():  # a new server: its figures anew
                self.server_load.reset()  # (other settings changing must not wipe figures already shown)
                self.server_load.show()
            self.server_watch.watch(base, self.controls.engine_options().get("api_key"))
        else:
            self.server_watch.stop()
            self.server_load.hide()

    def open_models_dialog(self) -> ModelsDialog:
        """The Models dialog (not modal: downloads go on while the window is used)."""
        if self.models_dialog is None:
            self.models_dialog = ModelsDialog(self.model_jobs, self)
            self.models_dialog.model_removed.connect(self.update_model_offer)
        self.models_dialog.refresh()
        self.models_dialog.show()
        self.models_dialog.raise_()
        return self.models_dialog

    def connect_to_server(self) -> None:
        dialog = ServerDialog(self)
        if dialog.exec():
            self.controls.use_server(dialog.model_ref(), dialog.api_key())

    # --- input ----------------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:
        self.document.dragEnterEvent(event)

    def dropEvent(self, event) -> None:
        if self.running:
            return  # the mode cannot change under a run; drop again when it has ended
        if self.document.accept_mime(event.mimeData()):
            event.acceptProposedAction()
            self.controls.set_engine("ocr")

    def open_documents(self, paths: list[str]) -> int:
        """Files opened from outside the window (command line, Open With, the Dock icon, a
        drop) become pages in the order given (a PDF or TIFF gives all its pages), and the window
        switches to OCR. Returns how many pages were added; a file that cannot be read says so
        in the OCR pane (DocumentView.load_failed)."""
        added = self.document.add_files([str(p) for p in paths])
        if added and not self.running:
            self.controls.set_engine("ocr")
        return added

    def paste(self) -> None:
        if not self.running and self.document.paste(QApplication.clipboard()):
            self.controls.set_engine("ocr")

    # --- runs (app.gui.run_controller) --------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.worker is not None

    def run(self) -> bool:
        """Read (OCR) or Send (chat): a run from the controls; False (said) when it cannot start."""
        return self.runs.run()

    def stop(self) -> None:
        self.runs.stop()

    def _show_page_result(self, index: int) -> None:
        """Clicking a page that has been read shows its own plots and figures."""
        result = None if self.running else self.ocr.result_of(index)
        by_region = None if self.running else self.ocr.layout_page_of(index)
        if by_region is not None:  # its boxes show its regions; a box clicked, that region's rounds
            self.status.setText(f"{by_region.page.label} by region: {page_figures(by_region)}")
        if result is not None and self.telemetry is not None:
            self.session = result.session
            self._show_in_telemetry(result.session)
            s = result.session.stats()
            self.status.setText(f"{result.page.label}: {s.tokens} tokens, {s.decode_tok_s:.1f} tok/s, "
                                f"acceptance {100 * s.acceptance_rate:.0f}% ({result.session.finish})")
            if result.session.finish == "repetition":  # the page's own warning, which the next page replaced
                self.runs.show_repetition(result.session, result.page.label)

    def show_model(self, model: dict, kind: str | None) -> None:
        """The status bar's model line: name, runtime and compute units, hash."""
        self.model_label.setText(f"{model.get('name', '?')} \u00b7 {runtime_text(kind, model)} "
                                 f"\u00b7 {model.get('hash', '')}")

    def tune(self) -> bool:
        """Tune…: measures this machine's costs for the sidebar's chat model, method and
        drafter in the background (app.gui.tuning); the next Auto run uses the profile."""
        return self.tuner.tune(self.controls, self.running, self.runs.pick_paired_drafter)

    def forget_finished_threads(self) -> None:
        self.threads = [(t, w) for t, w in self.threads if t.isRunning()]

    # --- lifecycle ------------------------------------------------------------------------
    def save_settings(self) -> None:
        self.controls.store_settings(self.settings)
        self.settings.window_geometry = base64.b64encode(bytes(self.saveGeometry())).decode()
        try:
            save_settings(self.settings)
        except OSError:
            pass  # a read-only config dir must not break the app

    def shutdown(self, timeout_ms: int = 10000) -> None:
        """Stops a run, ends the engine process and joins the threads (neither outlives the window)."""
        if self.worker is not None:
            self.worker.request_stop()
        self.tuner.cancel()
        # the engine process ends after its round; a load, which nothing can interrupt, is killed
        self.engines.close(ENGINE_QUIT_S)
        self.model_jobs.shutdown(timeout_ms)
        self.tuner.shutdown(timeout_ms)
        for thread, _worker in list(self.threads):  # runs and the background model load
            thread.quit()
            thread.wait(timeout_ms)  # their engine process has ended: they end at once
        self.threads = []

    def closeEvent(self, event) -> None:
        if self.persist:
            self.save_settings()
        self.server_watch.stop()
        self.shutdown()
        super().closeEvent(event)
