"""Chat mode's pane: the conversation and the prompt row under it, and what chat keeps while the
window shows OCR: the history sent with the next message, the run shown, its A/B result and
its status line. The window starts and ends runs; this pane says what a chat run shows."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QToolButton, QVBoxLayout, QWidget

from app.records.compare import CompareResult
from app.records.documents import Page, PageResult
from app.gui.views.prompt import PromptEdit
from app.gui.views.transcript import TranscriptView
from engines.speculative.session import Session
from engines.types import EngineError, Request


class ChatPane(QWidget):
    submitted = Signal()  # Enter in the prompt, or Send
    clear_clicked = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.history: list[dict] = []  # the conversation, {"role", "content"}
        self.pending_prompt = ""  # sent, not answered yet (a failed run keeps it for the next Send)
        self.session: Session | None = None  # the run shown
        self.session_settings: dict = {}
        self.last_compare: CompareResult | None = None
        self.status = "Ready"  # the status bar's text while chat is not shown
        self.model_label = ""

        self.transcript = TranscriptView()
        self.transcript.title.setText("Conversation")
        self.prompt = PromptEdit(placeholderText="Message \u2014 Enter to send, Shift+Enter for a new line",
                                 objectName="prompt")
        self.prompt.setFixedHeight(70)
        self.prompt.submitted.connect(self.submitted)
        self.send_button = QPushButton("Send", objectName="primary", toolTip="Send (Enter)")
        self.send_button.clicked.connect(self.submitted)
        self.clear_button = QToolButton(text="Clear", toolTip="Clear the conversation (Ctrl+L)", autoRaise=True)
        self.clear_button.clicked.connect(self.clear_clicked)
        self.prompt_row = QWidget(objectName="promptRow")
        row = QHBoxLayout(self.prompt_row)
        row.setContentsMargins(10, 8, 10, 10)
        row.addWidget(self.clear_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.prompt, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.transcript, 1)
        column.addWidget(self.prompt_row)

    def fill(self, request: Request, system: str | None) -> None:
        """The chat part of a Request: the prompt typed (or the one a failed run left), the
        system prompt and the conversation so far. EngineError when there is nothing to send."""
        prompt = self.prompt.toPlainText().strip() or self.pending_prompt
        if not prompt:
            raise EngineError("type a message first")
        request.prompt = prompt
        request.system = system
        request.history = list(self.history)

    def begin(self, request: Request, label: str, second_of_compare: bool) -> None:
        """A run starts: the user's turn (once per A/B compare) and an empty reply under it."""
        if not second_of_compare:
            self.transcript.add_turn("user", request.prompt)
            self.pending_prompt = request.prompt
            self.prompt.clear()
        self.transcript.begin_response("Assistant" + (f" \u00b7 {label}" if label else ""))

    def remember_turn(self, session: Session) -> None:
        self.history += [{"role": "user", "content": session.request.get("prompt", "")},
                         {"role": "assistant", "content": session.text}]
        self.pending_prompt = ""

    def clear(self) -> None:
        """A new chat: no history, an empty transcript, no run shown (the model stays loaded)."""
        self.history, self.pending_prompt = [], ""
        self.transcript.clear()
        self.transcript.hide_message()
        self.session, self.session_settings, self.last_compare, self.status = None, {}, None, "Ready"

    def set_running(self, running: bool) -> None:
        self.send_button.setEnabled(not running)

    def document_results(self) -> list[PageResult]:
        """What the text exports hold in chat: the last reply, as one page."""
        if self.session is None or not self.session.rounds:
            return []
        return [PageResult(Page("chat", 1, 1, ""), self.session)]
