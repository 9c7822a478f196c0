"""The output pane: text streams in bursts, one per round. Characters that came from accepted
drafts are tinted; the target's own tokens are plain (the legend says so). In a composed run
(n-gram beside a model drafter) the drafts the n-gram lookup made are blue and underlined, the
model drafter's keep the green (Round.draft_source): told apart without colour too. The text is kept
verbatim (Markdown, tables, LaTeX stay as the engine wrote them), so copying gives plain text;
"Render Markdown" shows it rendered, Markdown and HTML tables (GLM-OCR writes either) as
tables. Chat turns stack into a conversation; OCR pages follow each other under their names."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import (
    QApplication, QHBoxLayout, QLabel, QPlainTextEdit, QStackedWidget, QTextBrowser, QTextEdit,
    QToolButton, QToolTip, QVBoxLayout, QWidget,
)

from app.records.bursts import Burst

DRAFT_FG, DRAFT_BG = QColor("#0b6b3a"), QColor("#d9f2e3")
NGRAM_FG, NGRAM_BG = QColor("#0b3d91"), QColor("#dbeafe")  # composed runs: the n-gram lookup's drafts
SELECTED_BG = QColor("#ffd666")
ROLE_FG = QColor("#6e6e73")


@dataclass
class Span:
    round_index: int
    start: int  # document positions (QTextCursor units)
    end: int
    burst: Burst


class OutputEdit(QPlainTextEdit):
    """Read-only text that tells which burst the mouse is on."""

    burst_clicked = Signal(int)

    def __init__(self, owner: "TranscriptView"):
        super().__init__()
        self.owner = owner
        self.setReadOnly(True)
        self.setMouseTracking(True)
        self.setFrameShape(QPlainTextEdit.Shape.NoFrame)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)

    def mouseMoveEvent(self, event) -> None:
        super().mouseMoveEvent(event)
        span = self.owner.span_at(self.cursorForPosition(event.position().toPoint()).position())
        if span is None:
            QToolTip.hideText()
            return
        r = span.burst.round
        kind = "prefill" if r.prefill else f"{r.accepted}/{r.proposed} drafts accepted"
        QToolTip.showText(event.globalPosition().toPoint(),
                          f"round {r.index} \u00b7 {kind} \u00b7 {len(r.tokens)} tokens \u00b7 {r.wall_s * 1000:.1f} ms",
                          self)

    def mouseReleaseEvent(self, event) -> None:
        super().mouseReleaseEvent(event)
        if not self.textCursor().hasSelection():
            span = self.owner.span_at(self.cursorForPosition(event.position().toPoint()).position())
            if span is not None:
                self.burst_clicked.emit(span.round_index)


def legend_swatch(text: str, fg: QColor, bg: QColor | None, tip: str, underline: bool = False) -> QLabel:
    style = f"color:{fg.name()};" + (f"background:{bg.name()};" if bg else "border:1px solid #c7c7cc;")
    style += "text-decoration:underline;" if underline else ""
    label = QLabel(text, objectName="legend", toolTip=tip)
    label.setStyleSheet(style + "border-radius:4px;padding:1px 6px;")
    return label


class TranscriptView(QWidget):
    round_selected = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("transcript")
        self.spans: list[Span] = []
        self._starts: list[int] = []
        self.response_start = 0
        self.selected: int | None = None
        # the same text as Markdown for the rendered view: headings (speaker, page name) as
        # bold paragraphs of their own, so a table right under one still starts a table
        self.markdown_parts: list[str] = []

        self.edit = OutputEdit(self)
        font = QFont("DejaVu Sans Mono")
        font.setStyleHint(QFont.StyleHint.Monospace)
        font.setPointSizeF(10.5)
        self.edit.setFont(font)
        self.edit.burst_clicked.connect(self.select_round)
        self.edit.burst_clicked.connect(self.round_selected)
        self.rendered = QTextBrowser(openExternalLinks=True)
        self.rendered.setFrameShape(QTextBrowser.Shape.NoFrame)
        self.pages = QStackedWidget()
        self.pages.addWidget(self.edit)
        self.pages.addWidget(self.rendered)

        self.draft_format = QTextCharFormat()
        self.draft_format.setForeground(DRAFT_FG)
        self.draft_format.setBackground(DRAFT_BG)
        self.ngram_format = QTextCharFormat()
        self.ngram_format.setForeground(NGRAM_FG)
        self.ngram_format.setBackground(NGRAM_BG)
        self.ngram_format.setFontUnderline(True)
        self.target_format = QTextCharFormat()
        self.role_format = QTextCharFormat()
        self.role_format.setForeground(ROLE_FG)
        self.role_format.setFontWeight(QFont.Weight.Bold)
        self.user_format = QTextCharFormat()
        self.user_format.setForeground(QColor("#1d1d1f"))

        self.title = QLabel("Output", objectName="paneTitle")
        self.status = QLabel(objectName="muted")
        self.message = QLabel(objectName="message", wordWrap=True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message_close = QToolButton(text="\u2715", autoRaise=True, toolTip="Dismiss")
        self.message_close.clicked.connect(self.hide_message)
        self.render_button = QToolButton(text="Render Markdown", checkable=True, autoRaise=True,
                                         toolTip="Show the text with its Markdown rendered: headings, lists, and "
                                                 "Markdown or HTML tables as tables. Off: the text exactly as emitted")
        self.render_button.toggled.connect(self._toggle_rendered)
        self.copy_button = QToolButton(text="Copy", autoRaise=True, toolTip="Copy the output as plain text")
        self.copy_button.clicked.connect(self.copy_output)

        # The colour legend sits in the title bar, or on a line of its own under it when the pane
        # is too narrow for both (resizeEvent): the bar never pushes the pane wider than it is.
        self.legend = QWidget()
        legend_row = QHBoxLayout(self.legend)
        legend_row.setContentsMargins(0, 0, 0, 0)
        legend_row.addWidget(legend_swatch("accepted draft", DRAFT_FG, DRAFT_BG,
                                           "Tokens the target accepted from a drafter (in a composed run: the model "
                                           "drafter's, MTP or draft model)"))
        self.ngram_swatch = legend_swatch("n-gram draft", NGRAM_FG, NGRAM_BG, "Composed runs: tokens the target "
                                          "accepted from the n-gram lookup (blue, underlined)", underline=True)
        self.ngram_swatch.hide()  # shown once a composed run's n-gram drafts are
        legend_row.addWidget(self.ngram_swatch)
        legend_row.addWidget(legend_swatch("target token", QColor("#1d1d1f"), None,
                                           "Tokens the target produced itself (one per round at least)"))
        legend_row.addStretch(1)
        bar = QHBoxLayout()
        bar.setContentsMargins(12, 8, 8, 6)
        bar.addWidget(self.title)
        bar.addSpacing(10)
        bar.addWidget(self.legend)
        bar.addStretch(1)
        bar.addWidget(self.status)
        bar.addWidget(self.render_button)
        bar.addWidget(self.copy_button)
        self.bar = bar
        self.legend_line = QHBoxLayout()
        self.legend_line.setContentsMargins(12, 0, 8, 6)
        message_row = QHBoxLayout()
        message_row.setContentsMargins(0, 0, 0, 0)
        message_row.addWidget(self.message, 1)
        message_row.addWidget(self.message_close)
        self.message_box = QWidget(objectName="messageBox")
        self.message_box.setLayout(message_row)
        self.message_box.hide()
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(0)
        col.addLayout(bar)
        col.addLayout(self.legend_line)
        col.addWidget(self.message_box)
        col.addWidget(self.pages, 1)

    # --- reflow ---------------------------------------------------------------------------
    def one_line_width(self) -> int:
        """The title bar's width with the legend in it."""
        widgets = (self.title, self.legend, self.status, self.render_button, self.copy_button)
        shown = [w for w in widgets if not w.isHidden()]
        return (12 + 8 + 10 + sum(w.sizeHint().width() for w in shown)
                + self.bar.spacing() * (len(shown) - 1))

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        """With the legend on its own line: the pane may be that narrow (resizeEvent moves it)."""
        hint = super().minimumSizeHint()
        in_bar = self.legend_line.indexOf(self.legend) < 0
        legend = self.legend.sizeHint()
        width = max(self.one_line_width() - legend.width() - 10, legend.width() + 20)
        return QSize(min(hint.width(), width), hint.height() + (legend.height() + 6 if in_bar else 0))

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._place_legend(event.size().width())

    def _place_legend(self, width: int) -> None:
        below = width < self.one_line_width()
        if below != (self.legend_line.indexOf(self.legend) >= 0):
            (self.bar if below else self.legend_line).removeWidget(self.legend)
            if below:
                self.legend_line.addWidget(self.legend)
            else:
                self.bar.insertWidget(2, self.legend)

    # --- conversation ---------------------------------------------------------------------
    def clear(self) -> None:
        self.edit.clear()
        self.rendered.clear()
        self._reset_spans()
        self.response_start = 0
        self.markdown_parts = []

    def _heading(self, cursor: QTextCursor, heading: str) -> None:
        if not self.edit.document().isEmpty():
            cursor.insertText("\n\n", self.target_format)
            self.markdown_parts.append("\n\n")
        cursor.insertText(heading + "\n", self.role_format)
        self.markdown_parts.append(f"**{heading}**\n\n")

    def _reset_spans(self) -> None:
        self.spans, self._starts, self.selected = [], [], None
        self.edit.setExtraSelections([])

    def _cursor_at_end(self) -> QTextCursor:
        cursor = self.edit.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor

    def add_turn(self, role: str, text: str) -> None:
        """A finished turn of the conversation (the user's prompt, an earlier reply)."""
        cursor = self._cursor_at_end()
        self._heading(cursor, "You" if role == "user" else "Assistant")
        cursor.insertText(text, self.user_format if role == "user" else self.target_format)
        self.markdown_parts.append(text)

    def begin_response(self, heading: str | None = None) -> None:
        """Bursts that follow make up one response; round indices restart."""
        self._reset_spans()
        cursor = self._cursor_at_end()
        if heading is not None:
            self._heading(cursor, heading)
        self.response_start = cursor.position()

    def append_burst(self, burst: Burst) -> None:
        bar = self.edit.verticalScrollBar()
        following = bar.value() >= bar.maximum() - 4
        cursor = self._cursor_at_end()
        start = cursor.position()
        drafted_format = self.draft_format
        # a round of the chain with n-gram tokens after it ("mtp+ngram") keeps the drafter's
        # colour: its text does not say where the chain ended (the by-position plot splits it)
        if burst.round.draft_source == "ngram" and burst.spans:
            drafted_format = self.ngram_format
            if self.ngram_swatch.isHidden():  # the legend grows: it may need its own line now
                self.ngram_swatch.show()
                self._place_legend(self.width())
        for piece, drafted in burst.segments():
            cursor.insertText(piece, drafted_format if drafted else self.target_format)
            self.markdown_parts.append(piece)
        self.spans.append(Span(burst.round.index, start, cursor.position(), burst))
        self._starts.append(start)
        if following:
            bar.setValue(bar.maximum())

    def response_text(self) -> str:
        """The current response as plain text, exactly as the engine emitted it."""
        cursor = self._cursor_at_end()
        cursor.setPosition(self.response_start, QTextCursor.MoveMode.KeepAnchor)
        return cursor.selectedText().replace("\u2029", "\n")

    def copy_output(self) -> None:
        text = self.edit.textCursor().selectedText().replace("\u2029", "\n") or self.response_text()
        QApplication.clipboard().setText(text)

    def show_rendered(self, on: bool) -> None:
        self.render_button.setChecked(on)

    def _toggle_rendered(self, on: bool) -> None:
        if on:
            self.rendered.setMarkdown("".join(self.markdown_parts))
        self.pages.setCurrentIndex(1 if on else 0)

    def rendered_tables(self) -> int:
        """How many tables the rendered view holds."""
        from PySide6.QtGui import QTextTable

        return sum(isinstance(f, QTextTable) for f in self.rendered.document().rootFrame().childFrames())

    # --- rounds ---------------------------------------------------------------------------
    def span_at(self, position: int) -> Span | None:
        i = bisect.bisect_right(self._starts, position) - 1
        if i >= 0 and self.spans[i].start <= position < self.spans[i].end:
            return self.spans[i]
        return None

    def span_of(self, round_index: int) -> Span | None:
        for span in self.spans:  # indices are contiguous in practice; search stays correct if not
            if span.round_index == round_index:
                return span
        return None

    def select_round(self, round_index: int) -> None:
        """Highlights the burst of a round and scrolls it into view."""
        span = self.span_of(round_index)
        if span is None:
            return
        self.selected = round_index
        selection = QTextEdit.ExtraSelection()
        selection.format.setBackground(SELECTED_BG)
        selection.format.setProperty(QTextFormat.Property.FullWidthSelection, False)
        cursor = self.edit.textCursor()
        cursor.setPosition(span.start)
        cursor.setPosition(max(span.end, span.start), QTextCursor.MoveMode.KeepAnchor)
        selection.cursor = cursor
        self.edit.setExtraSelections([selection])
        view = QTextCursor(cursor)
        view.clearSelection()
        self.edit.setTextCursor(view)
        self.edit.ensureCursorVisible()

    def selected_text(self) -> str:
        selections = self.edit.extraSelections()
        return selections[0].cursor.selectedText() if selections else ""

    # --- messages -------------------------------------------------------------------------
    def show_message(self, text: str, kind: str = "error") -> None:
        self.message.setText(text)
        self.message_box.setProperty("kind", kind)
        self.message_box.style().unpolish(self.message_box)
        self.message_box.style().polish(self.message_box)
        self.message_box.show()

    def hide_message(self) -> None:
        self.message_box.hide()

    @property
    def message_text(self) -> str:
        return self.message.text() if self.message_box.isVisibleTo(self) else ""
