"""A slim, non-modal notice above the conversation: one line of text and up to two buttons.
Used to offer reopening a run that a crash cut short (the window stays usable meanwhile)."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget


class Notice(QFrame):
    accepted = Signal()  # the action button was pressed
    dismissed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, objectName="notice")
        self.label = QLabel(wordWrap=True)
        self.action_button = QPushButton()
        self.dismiss_button = QPushButton("Dismiss")
        self.action_button.clicked.connect(self._accept)
        self.dismiss_button.clicked.connect(self._dismiss)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.addWidget(self.label, 1)
        row.addWidget(self.action_button)
        row.addWidget(self.dismiss_button)
        self.hide()

    def offer(self, text: str, action: str) -> None:
        self.label.setText(text)
        self.action_button.setText(action)
        self.show()

    def _accept(self) -> None:
        self.hide()
        self.accepted.emit()

    def _dismiss(self) -> None:
        self.hide()
        self.dismissed.emit()
