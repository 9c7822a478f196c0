"""Tune…'s progress (not modal: the window stays usable): what is being tuned, which stage the
measurement is in (the model loading, the forward latency pass by pass over the widths, the
acceptance prompt by prompt), a progress bar, Cancel, and at the end either what was measured
or one line saying why it failed. The Tuner (app.gui.tuning) drives it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.gui.model_jobs import JobProgress

STAGES = {"load": "Loading the model", "latency": "Forward latency by width", "batch": "Forward latency by batch size",
          "acceptance": "Acceptance on the calibration set"}


class TuneDialog(QDialog):
    cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Tune Speculation")
        self.setModal(False)
        self.setMinimumWidth(460)
        self.what = QLabel(wordWrap=True, objectName="paneTitle")
        self.stage = QLabel(objectName="muted")
        self.bar = QProgressBar(minimum=0, maximum=1000, textVisible=False)
        self.detail = QLabel(wordWrap=True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error = QLabel(wordWrap=True, visible=False)
        self.error.setStyleSheet("color: #c0392b")  # as the other dialogs' problem lines
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self._cancel)
        self.close_button = QPushButton("Close")
        self.close_button.clicked.connect(self.hide)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.close_button)
        col = QVBoxLayout(self)
        col.addWidget(self.what)
        col.addWidget(self.stage)
        col.addWidget(self.bar)
        col.addWidget(self.detail)
        col.addWidget(self.error)
        col.addLayout(buttons)

    def show_started(self, what: str) -> None:
        self.what.setText(f"Tuning {what}")
        self.stage.setText("Starting\u2026")
        self.detail.setText("Measures this machine's costs once; Auto then chooses the draft length from them.")
        self.error.hide()
        self.bar.setValue(0)
        self.bar.show()
        self.cancel_button.setEnabled(True)
        self.adjustSize()

    def show_progress(self, p: JobProgress) -> None:
        self.stage.setText(STAGES.get(p.phase, p.phase))
        self.detail.setText(p.text[0].upper() + p.text[1:] if p.text else "")
        self.bar.setValue(round(1000 * p.fraction))
        self.adjustSize()  # wrapped lines: a shown dialog does not grow by itself

    def show_finished(self, path: str, summary: str = "") -> None:
        self.stage.setText("Done")
        self.bar.setValue(1000)
        self.detail.setText(f"{summary} The profile is saved ({path}); the next run with Auto uses it.".lstrip())
        self.cancel_button.setEnabled(False)
        self.adjustSize()

    def show_cancelled(self) -> None:
        self.stage.setText("Cancelled")
        self.detail.setText("Nothing was saved.")
        self.cancel_button.setEnabled(False)

    def show_failed(self, message: str) -> None:
        self.stage.setText("Failed")
        self.error.setText(message)
        self.error.show()
        self.cancel_button.setEnabled(False)
        self.adjustSize()

    def _cancel(self) -> None:
        self.stage.setText("Cancelling after this step\u2026")
        self.cancel_button.setEnabled(False)
        self.cancel_requested.emit()
