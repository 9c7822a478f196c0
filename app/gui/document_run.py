"""A document read by region in the window, page after page: the layout stage finds each page's
regions in the engine process and they are read together there (app/gui/page_job.py); this
controller shows what comes back and goes on to the next page.

Whether a page is read by region follows `specscope ocr --layout auto`: when the document's
Layout button is on (the default), no Region is drawn, the model is not a server's, and the
layout model paired with the OCR model is installed. Without it pages are read whole, and a
line says how to get it (the model offer above the pane has the button).

What the window shows, as it comes: the page's boxes (app/gui/views/layout_boxes.py), each in
its state's colour with its last characters read; the batch's aggregate tok/s and rows over
time under the page (views/batch_view.py); the followed region's rounds in the transcript and
the speculation strip -- the first region read, until a box is clicked, then that one; the
document's Markdown (views/markdown_view.py), as engines.glm_ocr.document.markdown_pages writes
it, updated as each region is read. A converted layout model that runs on PyTorch instead (Core
ML did not load it) is said once, above the text, as `specscope ocr` says it on stderr."""

from __future__ import annotations

import hashlib
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.gui.page_job import BatchStepped, ReadPage, RegionRead, RegionsFound
from app.gui.page_worker import PageSpec, PageWorker
from app.gui.views.layout_boxes import LayoutOverlay, RegionStates
from app.gui.views.markdown_view import MarkdownView
from app.gui.worker import start_worker
from app.records.bursts import Burst
from app.records.documents import LayoutPage, export_document, page_figures
from engines.speculative.session import Session
from engines.types import EngineError

STATE_OF_FINISH = {None: "skipped", "cancelled": "stopped"}  # a region's end -> its box's state ("done" else)
PAGE_STATE_OF_FINISH = {"repetition": "repetition", "length": "length", "cancelled": "cancelled"}


def layout_path(model: str) -> str | None:
    """The installed layout model paired with the OCR model ("" = the downloaded GLM-OCR)."""
    from app.gui.engine_process import DEFAULT_OCR_MODEL
    from app.models.lookup import paired_layout

    if model.startswith(("http://", "https://")):
        return None
    try:
        return paired_layout(model or DEFAULT_OCR_MODEL)
    except EngineError:
        return None


def missing_layout(model: str) -> str | None:
    """One line when the catalog's GLM-OCR is read without its layout model (as the CLI's auto
    says it); None when it is installed or the model is the user's own."""
    from app.gui.engine_process import DEFAULT_OCR_MODEL
    from app.models import catalog
    from app.models.lookup import layout_for

    name = model or DEFAULT_OCR_MODEL
    try:
        if catalog.find(name) is None or layout_path(model) is not None:
            return None
        wanted = layout_for(name)
    except EngineError:
        return None
    return (f"The layout model {wanted} is not installed: pages are read whole meanwhile "
            f"(Download above, or `specscope models get {wanted}`, gets it).")


class DocumentRun(QObject):
    """The window's reading of pages by region (the window's `worker` while a page is read)."""

    regions_found = Signal(object)  # RegionsFound, after the boxes are drawn
    region_changed = Signal(int, str)  # a region's index and its new state, after its box is redrawn
    region_selected = Signal(int)  # after its rounds are shown
    markdown_changed = Signal(str)  # the document's Markdown, after the view shows it
    page_ended = Signal(object)  # the LayoutPage, after the page's state is marked

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        document = window.document
        self.overlay = LayoutOverlay(document.view)
        self.overlay.region_clicked.connect(self.select_region)
        document.page_changed.connect(self._show_boxes_of)
        document.layout_button.setChecked(window.settings.ocr_layout != "off")
        document.layout_toggled.connect(self._on_layout_toggled)
        self.markdown = MarkdownView()
        window.ocr.add_markdown_view(self.markdown)
        window.page_read.connect(self._on_page_read_whole)
        self.batch = None  # the BatchView, made at the first page read by region (pyqtgraph)
        self.boxes: dict[int, RegionStates] = {}  # by the document's page index
        self.bursts: dict[tuple[int, int], list[Burst]] = {}  # (page index, region index) -> its rounds
        self.page_markdown: dict[int, str] = {}  # by page index: the page's Markdown as the engine process wrote it
        self.model: dict = {}
        self.worker: PageWorker | None = None
        self.index = -1  # the page being read
        self.following = True  # the transcript follows the first region read until a box is clicked
        self.runtime_notes_said: set[str] = set()  # a layout model's runtime note is said once

    # --- whether, and how to start -----------------------------------------------------------
    def layout_for_next_page(self) -> str | None:
        """The layout model for the next page of the reading, or None: read it whole."""
        w = self.window
        if not w.document.layout_button.isChecked() or (w.ocr.reading is not None and w.ocr.reading.region):
            return None
        return layout_path(w.controls.model_path())

    def say_if_missing(self) -> None:
        if self.window.document.layout_button.isChecked():
            line = missing_layout(self.window.controls.model_path())
            if line:
                self.window.transcript.show_message(line, "info")

    def _on_layout_toggled(self, on: bool) -> None:
        self.window.settings.ocr_layout = "auto" if on else "off"
        self.window.update_model_offer()

    def read_page(self, layout: str) -> bool:
        """Starts the reading's next page by region; False (said) when it cannot start."""
        w = self.window
        label, image = w.ocr.page_starting()
        self.index, page = w.ocr.reading.current
        if w.tuner.running:
            w.transcript.show_message("Tune\u2026 is measuring this machine: runs wait until it ends", "info")
            return False
        try:
            request = w.runs.build_request(image=image)
        except EngineError as e:
            w.transcript.show_message(str(e), "info")
            return False
        from app.settings import data_dir

        crops = data_dir() / "regions" / hashlib.sha256(Path(image).read_bytes()).hexdigest()[:16]
        job = ReadPage("", w.controls.engine_options(), request, layout, page.number, str(crops),
                       max_batch=w.controls.max_batch)
        spec = PageSpec(job, page, w.controls.model_path(), w.runs.run_settings(), autosave=w.autosaving.on)
        self._begin(label)
        self.worker = worker = PageWorker(spec, w.engines)
        worker.engine_loaded.connect(self._on_engine_loaded)
        worker.regions_found.connect(self._on_regions_found)
        worker.region_started.connect(self._on_region_started)
        worker.batch_stepped.connect(self._on_batch_stepped)
        worker.region_read.connect(self._on_region_read)
        worker.autosave_failed.connect(w.autosaving.show_failed)
        worker.finished.connect(self._on_finished)
        worker.cancelled.connect(self._on_cancelled)
        worker.errored.connect(self._on_errored)
        thread = start_worker(worker)
        thread.finished.connect(w.forget_finished_threads)
        w.threads.append((thread, worker))
        w.worker = worker  # Stop, and the window's `running`
        w.controls.set_running(True)
        w.status.setText("Loading the model\u2026")
        w.run_started.emit(spec)
        return True

    def _begin(self, label: str) -> None:
        w = self.window
        w.runs.fallback = None
        w.transcript.hide_message()
        w.ocr.begin(label, second_of_compare=False)
        w.session = None
        self.following = True
        # a page read again (after a Stop, or the whole document again) shows only this reading:
        # the rounds of the one before would run on into it, in the boxes' text and the Markdown
        self.boxes.pop(self.index, None)
        self.page_markdown.pop(self.index, None)
        for key in [key for key in self.bursts if key[0] == self.index]:
            del self.bursts[key]
        self.overlay.show_states(None)
        if w.telemetry is not None:
            w.telemetry.clear()

    # --- the page's events (GUI thread) ---------------------------------------------------------
    def _on_engine_loaded(self, model: dict) -> None:
        self.model = model
        self.window.show_model(model, "ocr")
        self.window.status.setText("Finding the page's regions\u2026")

    def _on_regions_found(self, found: RegionsFound) -> None:
        states = RegionStates(list(found.regions))
        self.boxes[self.index] = states
        if self.window.document.index == self.index:
            self.overlay.show_states(states)
        batch = self._batch_view()
        batch.clear()
        batch.show()
        n = len(found.regions)
        self.window.status.setText(f"Layout: {n} region{'s' * (n != 1)} in {found.seconds:.2f} s \u00b7 reading them "
                                   "together")
        notes = [found.note] if found.note else []
        if found.runtime_note and found.runtime_note not in self.runtime_notes_said:
            self.runtime_notes_said.add(found.runtime_note)
            notes.insert(0, found.runtime_note)
        if notes:
            self.window.transcript.show_message(" ".join(n[0].upper() + n[1:].rstrip(".") + "." for n in notes), "info")
        self._update_progress()
        self.regions_found.emit(found)

    def _on_region_started(self, index: int) -> None:
        self._set_state(index, "reading")
        if self.following and self.boxes[self.index].selected is None:
            self.select_region(index, follow=True)

    def _on_batch_stepped(self, event: BatchStepped) -> None:
        states = self.boxes.get(self.index)
        w = self.window
        for index, burst in event.rounds:
            self.bursts.setdefault((self.index, index), []).append(burst)
            states.add(index, burst)
            if self.window.document.index == self.index:
                self.overlay.update(index)
            if states.selected == index:
                w.transcript.append_burst(burst)
                if w.session is not None:
                    w.session.add(burst.round)
                if w.telemetry is not None:
                    w.telemetry.append(burst.round)
        rows = len({index for index, _burst in event.rounds})  # a region joining has its first token and a round
        self._batch_view().add_step(event.at, rows, sum(len(b.round.tokens) for _i, b in event.rounds))
        self._update_progress()

    def _on_region_read(self, event: RegionRead) -> None:
        self._set_state(event.index, STATE_OF_FINISH.get(event.finish, "done"))
        self._update_progress()
        self._show_markdown()

    def _set_state(self, index: int, state: str) -> None:
        states = self.boxes.get(self.index)
        if states is None:
            return
        states.states[index] = state
        if self.window.document.index == self.index:
            self.overlay.update(index)
        self.region_changed.emit(index, state)

    def _update_progress(self) -> None:
        states = self.boxes.get(self.index)
        if states is None or self.batch is None:
            return
        counts = {s: list(states.states.values()).count(s) for s in ("reading", "waiting", "done")}
        waiting = f" \u00b7 {counts['waiting']} waiting" if counts["waiting"] else ""
        self.batch.set_progress(f"{counts['reading']} reading{waiting} \u00b7 {counts['done']}/{len(states.regions)} done")

    # --- the page's end ---------------------------------------------------------------------------
    def _on_finished(self, page: LayoutPage) -> None:
        w = self._ended(page, "finished")
        if w.ocr.reading.queue:
            if not w.runs.read_next_page():
                w.ocr.reading = None
                w.run_ended.emit("errored")
            return
        summary = w.ocr.reading_ended()
        w.status.setText(summary or f"Read {page.page.label} by region: {page_figures(page)}")
        w.run_ended.emit("finished")

    def _on_cancelled(self, page: LayoutPage) -> None:
        w = self._ended(page, "cancelled")
        read = len(w.ocr.results) + len(w.ocr.layout_pages)
        w.status.setText(f"Stopped; {read} page{'s' * (read != 1)} read are kept \u2014 Read goes on from the next page")
        w.ocr.reading_stopped()
        w.run_ended.emit("cancelled")

    def _on_errored(self, message: str) -> None:
        w = self.window
        self.worker = None
        w.runs.end_run()
        for index, state in (self.boxes.get(self.index) or RegionStates([])).states.items():
            if state in ("reading", "waiting"):
                self._set_state(index, "stopped")
        w.ocr.reading_failed(message)
        w.transcript.show_message(message, "error")
        w.status.setText("Error")
        w.run_ended.emit("errored")

    def _ended(self, page: LayoutPage, outcome: str):
        """The page's end. It is kept (and not read again) when every region ended on its own,
        whether or not the run was stopped after; with a region cancelled it is marked stopped
        and the next Read reads it again, as a whole page cut short is."""
        w, worker = self.window, self.worker
        if worker is not None and worker.markdown is not None:
            self.page_markdown[self.index] = worker.markdown
        read = outcome == "finished" or (worker is not None and worker.read_to_its_end())
        self.worker = None
        w.runs.end_run()
        for index, state in list(self.boxes.get(self.index, RegionStates([])).states.items()):
            if state in ("reading", "waiting"):
                self._set_state(index, "stopped")
        finish = "cancelled" if not read else next(
            (s.finish for s in page.sessions if s.finish in ("repetition", "length")), None)
        w.ocr.layout_page_ended(page, PAGE_STATE_OF_FINISH.get(finish, "read"), keep=read)
        if w.telemetry is not None:
            w.telemetry.refresh(force=True)
        self._show_markdown()
        self.page_ended.emit(page)
        return w

    # --- showing -----------------------------------------------------------------------------------
    def select_region(self, index: int, follow: bool = False) -> None:
        """Shows region `index` of the page in view: its box outlined, its rounds in the transcript
        and the speculation strip. A click stops the transcript following the first region."""
        w, page_index = self.window, self.window.document.index
        states = self.boxes.get(page_index)
        if states is None or states.region(index) is None:
            return
        self.following = self.following and follow
        previous, states.selected = states.selected, index
        for i in {previous, index} - {None}:
            self.overlay.update(i)
        region = states.region(index)
        bursts = self.bursts.get((page_index, index), [])
        w.transcript.clear()
        w.transcript.begin_response(f"{w.document.pages[page_index].label} \u00b7 region {index + 1} "
                                    f"{region.label} ({region.task})")
        session = Session(request={"kind": "ocr", "task": region.task}, model=self.model)
        telemetry = w.ensure_telemetry()
        telemetry.clear()
        for burst in bursts:
            w.transcript.append_burst(burst)
            session.add(burst.round)
            telemetry.append(burst.round)
        telemetry.refresh(force=True)
        w.session = session
        self.region_selected.emit(index)

    def _show_boxes_of(self, page_index: int) -> None:
        self.overlay.show_states(self.boxes.get(page_index))

    def _show_markdown(self) -> None:
        """The document's Markdown as Copy as Markdown gives it (export_document, the CLI's
        formatter: a heading per page when there are several): the pages read, whole or by
        region, and the one being read so far."""
        from engines.glm_ocr.document import ReadRegion

        w = self.window
        states = self.boxes.get(self.index)
        reading = None
        if self.worker is not None and states is not None:
            page = w.document.pages[self.index]
            reading = LayoutPage(page, [ReadRegion(page.number, r, "".join(
                b.round.text for b in self.bursts.get((self.index, r.index), [])))
                for r in states.regions if states.states.get(r.index) in ("done", "stopped")], layout="")
        pages = w.ocr.pages_read(reading)
        markdown = export_document(pages, "md") if pages else ""
        n = len(pages) - (reading is not None)
        status = [f"{n} page{'s' * (n != 1)}"] if n else []
        if reading is not None:
            status.append(f"reading {reading.page.label}")
        self.markdown.show_markdown(markdown, " \u00b7 ".join(status))
        self.markdown.show()
        self.markdown_changed.emit(markdown)

    def _on_page_read_whole(self, _result) -> None:
        """A page read whole joins the document the pane shows, once the pane is there."""
        if not self.markdown.isHidden():
            self._show_markdown()

    def _batch_view(self):
        if self.batch is None:
            from app.gui.views.batch_view import BatchView

            self.batch = BatchView()
            self.window.document.layout().addWidget(self.batch)
        return self.batch
