"""A one-line label that elides its text (at the right) when it is narrower than the text, with
the whole text in its tooltip: the status bar's lines are long, the window may be narrow."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QStyle, QStyleOption


class ElidedLabel(QLabel):
    """text() is always the whole text; only what is painted is elided."""

    def __init__(self, text: str = "", **kwargs):
        super().__init__(text, **kwargs)
        self.own_tooltip = ""  # a tooltip set by the owner wins over the whole text

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        super().setText(text)
        self._update_tooltip()

    def setToolTip(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self.own_tooltip = text
        super().setToolTip(text)

    def is_elided(self) -> bool:
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def _update_tooltip(self) -> None:
        if not self.own_tooltip:
            QLabel.setToolTip(self, self.text() if self.is_elided() else "")

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        margins = self.contentsMargins()
        width = self.fontMetrics().horizontalAdvance("\u2026" * 3) + margins.left() + margins.right()
        return QSize(width, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._update_tooltip()

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        option = QStyleOption()
        option.initFrom(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_Widget, option, painter, self)  # the style sheet's background
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, rect.width())
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(rect, int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), text)
