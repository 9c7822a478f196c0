"""Past sessions from the autosave folder."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from app.records.sessions import list_sessions


class SessionsDialog(QDialog):
    """Past sessions from the autosave folder, newest first."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Sessions")
        self.resize(760, 420)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Started", "Kind", "Model", "Rounds", "Outcome", "Input"])
        self.tree.setRootIsDecorated(False)
        self.tree.itemDoubleClicked.connect(lambda *_: self.accept())
        for e in list_sessions():
            item = QTreeWidgetItem([time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.started_at)),
                                    e.kind, e.model, str(e.rounds), e.outcome or "interrupted", e.preview])
            item.setData(0, Qt.ItemDataRole.UserRole, str(e.path))
            self.tree.addTopLevelItem(item)
        for i in range(5):
            self.tree.resizeColumnToContents(i)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        col = QVBoxLayout(self)
        col.addWidget(self.tree)
        col.addWidget(buttons)

    def chosen_path(self) -> str | None:
        item = self.tree.currentItem()
        return item.data(0, Qt.ItemDataRole.UserRole) if item else None
