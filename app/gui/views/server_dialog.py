"""Connect to Server…: an OpenAI-compatible server (llama.cpp, vLLM, SGLang, `specscope serve`)
as the model. The dialog only takes the address; connecting happens on the run's worker thread,
whose one-line error (refused, 401, unknown model) the transcript shows."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QWidget

from engines.types import EngineError
from engines.remote.engine import server_ref


class ServerDialog(QDialog):
    def __init__(self, parent: QWidget | None = None, url: str = "http://127.0.0.1:8080", model: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Connect to Server")
        self.url_edit = QLineEdit(url, placeholderText="http://host:port")
        self.key_edit = QLineEdit(placeholderText="none", echoMode=QLineEdit.EchoMode.Password)
        self.model_edit = QLineEdit(model, placeholderText="the first model the server lists")
        self.problem = QLabel(visible=False, wordWrap=True)
        self.problem.setStyleSheet("color: #c0392b")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Connect")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Server URL", self.url_edit)
        form.addRow("API key", self.key_edit)
        form.addRow("Model", self.model_edit)
        form.addRow(self.problem)
        form.addRow(buttons)

    def accept(self) -> None:
        try:
            self.model_ref()
        except EngineError as e:  # stays open, with what to fix
            self.problem.setText(str(e))
            self.problem.setVisible(True)
            return
        super().accept()

    def model_ref(self) -> str:
        """What the model box holds for this server: "http://host:port#model-id"."""
        return server_ref(self.url_edit.text(), self.model_edit.text().strip() or None)

    def api_key(self) -> str | None:
        return self.key_edit.text().strip() or None
