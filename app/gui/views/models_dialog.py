"""The Models dialog (what `specscope models list` shows, with Download / Cancel / Remove and a
progress bar) and the offer a pane makes when its mode needs a model that is not there
(`ModelOffer`: what is missing and the one button that gets it).

Both watch the window's ModelJobs (app.gui.model_jobs), so a download started in one shows in the
other, and neither blocks the GUI thread: app.models runs on the job's worker thread."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView, QDialog, QDialogButtonBox, QFrame, QHBoxLayout, QHeaderView, QLabel,
    QProgressBar, QPushButton, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget,
)

from app.gui.model_jobs import JobProgress, ModelJobs
from app.models import catalog, store
from app.models.convert_job import conversion_needed
from app.gui.engine_process import DEFAULT_OCR_MODEL
from engines.types import EngineError

COLUMNS = ("Model", "Role", "State", "On disk", "Where", "Pairs with")
PROGRESS_STEPS = 1000  # QProgressBar takes ints: the fraction in thousandths


def state_text(st: store.ModelStatus) -> str:
    if st.downloading:
        return "downloading"
    return "installed" if st.installed else "not installed"


class ModelsDialog(QDialog):
    """Every model the catalog knows (built-in and the user's), as `specscope models list`."""

    model_removed = Signal(str)  # model id

    def __init__(self, jobs: ModelJobs, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.setObjectName("modelsDialog")
        self.resize(900, 420)
        self.jobs = jobs
        self.train_settings: dict = {}  # TrainConfig fields for "Train a drafter…" (the defaults: 15 minutes)
        self.table = QTreeWidget(rootIsDecorated=False, uniformRowHeights=False, alternatingRowColors=True)
        self.table.setHeaderLabels(COLUMNS)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.header().setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.details = QLabel(wordWrap=True, objectName="hint")
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.download_button = QPushButton("Download", objectName="primary")
        self.cancel_button = QPushButton("Cancel Download")
        self.remove_button = QPushButton("Remove")
        self.train_button = QPushButton("Train a drafter\u2026")
        self.train_button.setToolTip("Train an MTP drafter for this chat model on this machine (about 15 minutes; "
                                     "Cancel keeps a checkpoint and training again resumes)")
        self.download_button.clicked.connect(self.download_selected)
        self.train_button.clicked.connect(self.train_selected)
        self.cancel_button.clicked.connect(self.jobs.cancel)
        self.remove_button.clicked.connect(self.remove_selected)
        self.progress = QProgressBar(maximum=PROGRESS_STEPS, textVisible=True)
        self.progress_text = QLabel(objectName="muted")
        self.message = QLabel(wordWrap=True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.folder = QLabel(f"Models live in {store.models_dir()}", objectName="muted")
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.close)

        buttons = QHBoxLayout()
        for b in (self.download_button, self.cancel_button, self.remove_button, self.train_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        col = QVBoxLayout(self)
        col.addWidget(self.table, 1)
        col.addWidget(self.details)
        col.addLayout(buttons)
        col.addWidget(self.progress)
        col.addWidget(self.progress_text)
        col.addWidget(self.message)
        bottom = QHBoxLayout()
        bottom.addWidget(self.folder, 1)
        bottom.addWidget(close)
        col.addLayout(bottom)

        jobs.started.connect(self._on_job_started)
        jobs.progressed.connect(self._on_job_progressed)
        jobs.finished.connect(self._on_job_finished)
        jobs.cancelled.connect(self._on_job_cancelled)
        jobs.errored.connect(self._on_job_errored)
        self.progress.setVisible(False)
        self.progress_text.setVisible(False)
        self.refresh()

    # --- the list -------------------------------------------------------------------------
    def refresh(self) -> None:
        selected = self.selected_id()
        self.table.clear()
        try:
            entries = catalog.load_catalog()
        except EngineError as e:
            self.message.setText(str(e))
            return
        for entry in entries:
            st = store.status(entry, entries)
            if self.jobs.running_id in (entry.id, entry.repo_id):
                st.downloading = True
            where = str(st.path or entry.repo_id or entry.package or entry.path or "")
            size = store.human_size(st.size_on_disk) if st.size_on_disk else ""
            item = QTreeWidgetItem([entry.title, entry.role, state_text(st), size, where, entry.pairs_with or ""])
            item.setData(0, Qt.ItemDataRole.UserRole, (entry, st))
            item.setToolTip(0, entry.note or entry.id)
            item.setToolTip(4, where)
            self.table.addTopLevelItem(item)
            if entry.id == selected:
                item.setSelected(True)
        self._update_buttons()

    def selected(self) -> tuple[catalog.CatalogEntry, store.ModelStatus] | None:
        items = self.table.selectedItems()
        return items[0].data(0, Qt.ItemDataRole.UserRole) if items else None

    def selected_id(self) -> str | None:
        chosen = self.selected()
        return chosen[0].id if chosen else None

    def select(self, model_id: str) -> None:
        for i in range(self.table.topLevelItemCount()):
            item = self.table.topLevelItem(i)
            item.setSelected(item.data(0, Qt.ItemDataRole.UserRole)[0].id == model_id)

    def _update_buttons(self) -> None:
        chosen = self.selected()
        busy = self.jobs.running_id is not None
        entry, st = chosen if chosen else (None, None)
        self.download_button.setEnabled(bool(entry) and entry.source == "hub" and not st.installed and not busy)
        self.remove_button.setEnabled(bool(entry) and entry.source != "pypi" and (st.installed or bool(st.size_on_disk))
                                      and self.jobs.running_id != entry.id)
        self.cancel_button.setEnabled(busy)
        self.train_button.setEnabled(bool(entry) and self.can_train(entry, st) and not busy)
        if entry is None:
            self.details.setText("Choose a model to see what it needs.")
            return
        lines = [f"{entry.id} \u00b7 {entry.licence or 'licence not stated'}"
                 + (" \u00b7 gated: accept its licence on the hub and log in (`hf auth login`) first"
                    if entry.gated else "")]
        lines += [f"Missing: {m}" for m in st.missing]
        self.details.setText("\n".join(lines))

    # --- actions --------------------------------------------------------------------------
    def download_selected(self) -> bool:
        model_id = self.selected_id()
        return bool(model_id) and self.download(model_id)

    def download(self, model_id: str) -> bool:
        self.message.setText("")
        if not self.jobs.start(model_id):
            self.message.setText(f"{self.jobs.running_id} is downloading: one download at a time")
            return False
        return True

    def can_train(self, entry: catalog.CatalogEntry, st: store.ModelStatus) -> bool:
        """A chat model that is installed and has no drafter of its own (built-in pair)."""
        return entry.role == "chat" and st.installed and not entry.pairs_with

    def train_selected(self) -> bool:
        model_id = self.selected_id()
        if not model_id:
            return False
        self.message.setText("")
        if not self.jobs.train_drafter(model_id, **self.train_settings):
            self.message.setText(f"{self.jobs.running_id} is busy: one job at a time")
            return False
        return True

    def remove_selected(self) -> None:
        model_id = self.selected_id()
        if not model_id:
            return
        try:
            freed = store.remove(model_id)
        except EngineError as e:
            self.message.setText(str(e))
        else:
            self.message.setText(f"Removed {model_id}" + (f" ({store.human_size(freed)} freed)" if freed else ""))
            self.model_removed.emit(model_id)
        self.refresh()

    # --- job events -----------------------------------------------------------------------
    def _on_job_started(self, model_id: str) -> None:
        self.progress.setValue(0)
        self.progress.setFormat(f"{model_id}: %p%")
        self.progress_text.setText("Loading the model\u2026" if self.jobs.kind == "train" else "Asking the hub for the file list\u2026")
        self.progress.setVisible(True)
        self.progress_text.setVisible(True)
        self.refresh()

    def _on_job_progressed(self, p: JobProgress) -> None:
        self.progress.setValue(int(round(p.fraction * PROGRESS_STEPS)))
        what = {"convert": "Core ML conversion", "train": "drafter training"}.get(p.phase, "download")
        self.progress.setFormat(f"{p.model_id} \u00b7 {what}: %p%")
        self.progress_text.setText(p.text)

    def _on_job_finished(self, model_id: str, path: str) -> None:
        if self.jobs.kind == "train":
            self._job_ended(f"A drafter for {model_id} is ready ({path}); MTP on {model_id} uses it")
        else:
            self._job_ended(f"{model_id} is ready: {path}")

    def _on_job_cancelled(self, model_id: str) -> None:
        if self.jobs.kind == "train":
            self._job_ended(f"Training a drafter for {model_id} stopped; its checkpoint is kept: train again to resume")
        else:
            self._job_ended(f"Download of {model_id} cancelled; nothing was kept")

    def _on_job_errored(self, model_id: str, message: str) -> None:
        self._job_ended(f"{model_id}: {message}")

    def _job_ended(self, message: str) -> None:
        self.progress.setVisible(False)
        self.progress_text.setVisible(False)
        self.message.setText(message)
        self.refresh()


class ModelOffer(QFrame):
    """A pane's note that its mode needs a model, with the one button that gets it, then that
    job's progress and a Cancel button."""

    models_requested = Signal()  # the user asked for the Models dialog

    def __init__(self, jobs: ModelJobs, parent: QWidget | None = None):
        super().__init__(parent, objectName="modelOffer")
        self.jobs = jobs
        self.model_id: str | None = None  # what the button gets; None: it opens the dialog
        self.text = QLabel(wordWrap=True)
        self.button = QPushButton(objectName="primary")
        self.button.clicked.connect(self._on_clicked)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(jobs.cancel)
        self.progress = QProgressBar(maximum=PROGRESS_STEPS, textVisible=True)
        self.progress_text = QLabel(objectName="muted")
        row = QHBoxLayout()
        row.addWidget(self.text, 1)
        row.addWidget(self.button)
        row.addWidget(self.cancel_button)
        col = QVBoxLayout(self)
        col.setContentsMargins(12, 8, 12, 8)
        col.addLayout(row)
        col.addWidget(self.progress)
        col.addWidget(self.progress_text)
        jobs.started.connect(self._on_job_started)
        jobs.progressed.connect(self._on_job_progressed)
        jobs.finished.connect(self._on_job_finished)
        jobs.cancelled.connect(self._on_job_cancelled)
        jobs.errored.connect(self._on_job_errored)
        self._show_progress(False)
        self.setVisible(False)

    def show_offer(self, offer: "Offer | None") -> None:
        """Show what is missing and the button that gets it; None withdraws the offer (unless
        its download is still running: that stays in view)."""
        if offer is None:
            if self.jobs.running_id is None or self.jobs.running_id != self.model_id:
                self.setVisible(False)
            return
        self.text.setText(offer.text)
        self.button.setText(offer.button)
        self.model_id = offer.model_id
        self._show_progress(self.jobs.running_id is not None and self.jobs.running_id == offer.model_id)
        self.setVisible(True)

    def _on_clicked(self) -> None:
        if self.model_id is None:
            self.models_requested.emit()
        elif not self.jobs.start(self.model_id):
            self.text.setText(f"{self.jobs.running_id} is downloading: one download at a time")

    def _show_progress(self, shown: bool) -> None:
        self.progress.setVisible(shown)
        self.progress_text.setVisible(shown)
        self.cancel_button.setVisible(shown)
        self.button.setEnabled(not shown)

    def _on_job_started(self, model_id: str) -> None:
        if model_id == self.model_id:
            self.progress.setValue(0)
            self.progress_text.setText("Loading the model\u2026" if self.jobs.kind == "train" else "Asking the hub for the file list\u2026")
            self._show_progress(True)

    def _on_job_progressed(self, p: JobProgress) -> None:
        if p.model_id == self.model_id:
            self.progress.setValue(int(round(p.fraction * PROGRESS_STEPS)))
            self.progress.setFormat(("Converting for Core ML" if p.phase == "convert" else "Downloading") + ": %p%")
            self.progress_text.setText(p.text)

    def _on_job_finished(self, model_id: str, _path: str) -> None:
        if model_id == self.model_id:  # the window withdraws the offer once the model is there
            self._show_progress(False)

    def _on_job_cancelled(self, model_id: str) -> None:
        if model_id == self.model_id:
            self._show_progress(False)
            self.text.setText(f"Download of {model_id} cancelled; nothing was kept. {self.text.text()}")

    def _on_job_errored(self, model_id: str, message: str) -> None:
        if model_id == self.model_id:  # say why; the button stays to try again
            self._show_progress(False)
            self.text.setText(message)


@dataclass(frozen=True)
class Offer:
    text: str  # what is missing
    button: str  # the label of the one button that gets it
    model_id: str | None  # what the button downloads; None: it opens the Models dialog


def missing_model(engine: str, model: str, method: str, draft_model: str, layout: bool = True) -> Offer | None:
    """What the chosen mode needs and does not have, and the one button that gets it: OCR with
    no model chosen needs the downloaded GLM-OCR (and on macOS its Core ML conversion), and with
    Layout on its layout model (pages are read whole meanwhile; on macOS its Core ML conversion
    is offered too, the layout stage running on PyTorch meanwhile); a chat target chosen by catalog
    id must be downloaded; MTP needs the target's paired assistant."""
    entries = catalog.load_catalog()
    if engine == "ocr":
        entry = catalog.find(DEFAULT_OCR_MODEL, entries)
        if model or entry is None:
            return None  # the user chose a model; the run says if it is not one
        st = store.status(entry, entries)
        if not st.installed:
            size = f"about {store.human_size(entry.size_bytes)}, " if entry.size_bytes else ""
            return Offer(f"OCR needs GLM-OCR, which is not downloaded ({size}{entry.licence or 'licence on its page'}).",
                         "Download GLM-OCR", entry.id)
        if conversion_needed(entry):
            return Offer("GLM-OCR is downloaded but not converted for Core ML yet (a few minutes, once).",
                         "Convert GLM-OCR for Core ML", entry.id)
        pair = catalog.pair_of(entry, entries)
        if layout and pair is not None and pair.role == "layout" and not store.status(pair, entries).installed:
            name = pair.title.split(" (")[0]
            size = f", about {store.human_size(pair.size_bytes)}" if pair.size_bytes else ""
            return Offer(f"Layout: GLM-OCR reads a page region by region with {name}, which is not downloaded"
                         f"{size}; pages are read whole meanwhile.", f"Download {name}", pair.id)
        if layout and pair is not None and pair.role == "layout" and conversion_needed(pair):
            name = pair.title.split(" (")[0]
            return Offer(f"Layout: {name} is downloaded but not converted for Core ML yet (a minute or two, once); "
                         "it runs on PyTorch meanwhile.", f"Convert {name} for Core ML", pair.id)
        return None
    target = (catalog.find(model, entries) or store.entry_at(Path(model), entries)) if model else None
    if target is not None and target.source == "hub" and not store.status(target, entries).installed:
        return Offer(f"{target.title} is not downloaded.", f"Download {target.title}", target.id)
    if method != "mtp" or draft_model:
        return None
    pair = catalog.pair_of(target, entries) if target is not None else None
    if pair is None or pair.role != "drafter":
        return Offer("Gemma 4 assistant (MTP) needs a Gemma 4 target paired with its assistant drafter: "
                     "download one in Models\u2026, or give the assistant's folder as Drafter.",
                     "Open Models\u2026", None)
    if not store.status(pair, entries).installed:
        return Offer(f"MTP on {target.title} needs its assistant drafter, {pair.title}, which is not downloaded.",
                     f"Download {pair.title}", pair.id)
    return None
