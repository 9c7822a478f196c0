"""The batch a page's regions are read in, over time: the aggregate decode speed of every row
together (tokens of a step over the time since the step before, a moving average) and how many
rows each step read, beside the page's boxes. The header says how far the page is and what the
boxes' colours mean."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.gui.views.elided_label import ElidedLabel
from app.gui.views.layout_boxes import STATE_COLOURS
from app.gui.views.telemetry import BLUE, GREY, legend_headroom, make_plot

SMOOTH_STEPS = 8  # steps in the moving average of the aggregate speed
HEIGHT = 140


def state_legend() -> QWidget:
    """A swatch a state, in the boxes' colours."""
    legend = QWidget()
    row = QHBoxLayout(legend)
    row.setContentsMargins(0, 0, 0, 0)
    row.setSpacing(6)
    for state in ("waiting", "reading", "done", "skipped"):
        row.addWidget(QLabel(f"<span style='color:{STATE_COLOURS[state]}'>\u25a0</span> {state}", objectName="muted"))
    return legend


class BatchView(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("batchView")
        self.at: list[float] = []
        self.tokens: list[int] = []
        self.rows: list[int] = []
        self.title = QLabel("Batch", objectName="paneTitle")
        self.figures = ElidedLabel(objectName="muted")
        self.plot = make_plot("", "time since the page's regions began (s)", "tokens / s")
        self.plot.setTitle(None)
        self.plot.setMinimumSize(160, 70)  # (the speculation strip's plots are taller)
        for side in ("bottom", "left"):  # the legend names the lines; the tooltip says the units
            self.plot.getAxis(side).showLabel(False)
        self.rows_box, self.rows_curve = self._rows_axis()
        self.speed = self.plot.plot(pen=pg.mkPen(BLUE, width=2), name="aggregate tok/s")
        self.plot.setToolTip("aggregate tok/s (left axis): every row's tokens of a step over the step's time (moving "
                             f"average of {SMOOTH_STEPS} steps); rows (right axis): how many regions each step read; "
                             "x: seconds since the page's regions began to be read")
        header = QHBoxLayout()
        header.setContentsMargins(12, 6, 8, 0)
        header.addWidget(self.title)
        header.addSpacing(6)
        header.addWidget(self.figures, 1)
        header.addWidget(state_legend())
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 8, 6)
        col.setSpacing(2)
        col.addLayout(header)
        col.addWidget(self.plot, 1)
        self.setFixedHeight(HEIGHT)

    def _rows_axis(self):
        """Rows on a right-hand axis of their own (a second view box sharing the time axis)."""
        item = self.plot.getPlotItem()
        box = pg.ViewBox()
        item.showAxis("right")
        item.scene().addItem(box)
        axis = item.getAxis("right")
        axis.linkToView(box)
        axis.setTickFont(item.getAxis("left").style["tickFont"])
        axis.setTextPen(pg.mkPen("#6e6e73"))
        axis.setPen(pg.mkPen("#d2d2d7"))
        box.setXLink(item)
        item.vb.sigResized.connect(lambda: box.setGeometry(item.vb.sceneBoundingRect()))
        curve = pg.PlotDataItem(pen=pg.mkPen(GREY, width=2), stepMode="right")
        box.addItem(curve)
        item.legend.addItem(curve, "rows")
        return box, curve

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(200, HEIGHT)

    def clear(self) -> None:
        self.at, self.tokens, self.rows = [], [], []
        self.figures.setText("")
        self._redraw()

    def add_step(self, at: float, rows: int, tokens: int) -> None:
        self.at.append(at)
        self.rows.append(rows)
        self.tokens.append(tokens)
        self._redraw()

    def set_progress(self, text: str) -> None:
        self.figures.setText(text)

    def aggregate_tok_s(self) -> np.ndarray:
        """Per step: the tokens of the last SMOOTH_STEPS steps over the time they took."""
        at, tokens = np.asarray(self.at), np.cumsum(self.tokens)
        if len(at) < 2:
            return np.zeros(len(at))
        lag = np.maximum(np.arange(len(at)) - SMOOTH_STEPS, 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = (tokens - tokens[lag]) / (at - at[lag])
        rate[0] = np.nan
        return rate

    def _redraw(self) -> None:
        if not self.at:
            self.speed.setData([], [])
            self.rows_curve.setData([], [])
            return
        at, rate = np.asarray(self.at), self.aggregate_tok_s()
        keep = np.isfinite(rate)
        self.speed.setData(at[keep], rate[keep])
        rows = np.asarray(self.rows, float)
        self.rows_curve.setData(at, rows)
        headroom = legend_headroom(self.plot)
        self.rows_box.setYRange(0, max(2.0, float(rows.max())) * headroom, padding=0)
        top = max(float(np.nanmax(rate)) if keep.any() else 1.0, 1.0)
        self.plot.setYRange(0, top * headroom, padding=0)
        self.plot.setXRange(0, max(0.5, float(at[-1])), padding=0.02)

    def last_tok_s(self) -> float | None:
        rate = self.aggregate_tok_s()
        finite = rate[np.isfinite(rate)]
        return float(finite[-1]) if len(finite) else None
