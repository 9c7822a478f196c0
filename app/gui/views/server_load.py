"""The server's batch, beside the request (shown while the model is a server's): how many
requests it is running and how many wait, the mean latency and size of its steps, and the
tokens per second it generates for everyone -- a line of figures and a small plot of tokens per
second and running requests over the last minutes. Fed by ServerWatch (app/gui/server_watch.py)."""

from __future__ import annotations

from collections import deque

import pyqtgraph as pg
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QWidget

from app.gui.views.elided_label import ElidedLabel
from engines.remote.counters import ServerLoad

HISTORY = 180  # points kept (one a second: three minutes)
BLUE, GREEN = "#0a84ff", "#1f9d55"


def describe(load: ServerLoad) -> str:
    """One line, with '?' where the server does not say."""
    def shown(value, fmt: str) -> str:
        return "?" if value is None else fmt.format(value)

    line = (f"Server batch: {shown(load.running, '{:.0f}')} running \u00b7 {shown(load.waiting, '{:.0f}')} waiting "
            f"\u00b7 step {shown(None if load.step_latency_s is None else 1000 * load.step_latency_s, '{:.0f} ms')} "
            f"\u00b7 {shown(load.mean_batch, '{:.1f}')} per step \u00b7 {shown(load.tokens_per_s, '{:.1f} tok/s')} in all")
    if load.rank_busy:  # tensor parallel: how busy each rank was, and what rank 0's messages cost
        busy = " / ".join(f"{100 * b:.0f}%" for b in load.rank_busy)
        line += (f" \u00b7 {len(load.rank_busy)} ranks busy {busy}"
                 f" \u00b7 broadcast {shown(None if load.broadcast_s is None else 1000 * load.broadcast_s, '{:.1f} ms')}")
    return line


class ServerLoadView(QFrame):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, objectName="serverLoad")
        self.label = ElidedLabel("Server batch: waiting for its first figures")
        self.error = QLabel(objectName="muted")
        self.plot = pg.PlotWidget(background=None)
        self.plot.setFixedSize(220, 56)
        self.plot.hideAxis("bottom")
        self.plot.getAxis("left").setWidth(28)
        self.plot.setMouseEnabled(False, False)
        self.plot.setMenuEnabled(False)
        self.plot.setToolTip("tokens per second for all requests (blue) and requests running (green), "
                             "one point a second")
        self.tok_line = self.plot.plot(pen=pg.mkPen(BLUE, width=1.5))
        self.running_line = self.plot.plot(pen=pg.mkPen(GREEN, width=1.5))
        self.history: deque[tuple[float, float]] = deque(maxlen=HISTORY)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 4, 10, 4)
        row.addWidget(self.label, 1)
        row.addWidget(self.error)
        row.addWidget(self.plot)
        self.hide()

    def show_load(self, load: ServerLoad) -> None:
        self.error.clear()
        self.label.setText(describe(load))
        self.history.append((load.tokens_per_s or 0.0, load.running or 0.0))
        xs = list(range(len(self.history)))
        self.tok_line.setData(xs, [h[0] for h in self.history])
        self.running_line.setData(xs, [h[1] for h in self.history])

    def show_error(self, message: str) -> None:
        self.error.setText(message)

    def reset(self) -> None:
        self.history.clear()
        self.tok_line.setData([], [])
        self.running_line.setData([], [])
        self.label.setText("Server batch: waiting for its first figures")
