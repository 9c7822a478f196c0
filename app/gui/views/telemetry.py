"""The telemetry pane (pyqtgraph), live: drafts proposed and accepted per round, tok/s over
time, acceptance by draft position, and the running figures (tau, acceptance %, decode tok/s,
time to first token, rounds).

Every plot has a legend and axes with units. Appending a round is O(1) (app.records.round_series:
growable NumPy arrays and running sums); the plots redraw on a timer at most REDRAW_HZ times a second, clipped to the
view and peak-downsampled, so 10,000 rounds stay responsive. Past RAW_ROUNDS rounds the
per-round lines give way to their rolling means alone, over a window that grows with the run
(one point in a hundred), so a 2,000-round run reads as a trend, not spaghetti. The x axes
never shrink below MIN_ROUNDS_SHOWN rounds / MIN_SECONDS_SHOWN seconds and carry no SI
prefix, so a run stopped in its first round draws sane axes. One plot is redrawn per tick, in turn, because painting all three at
once can keep the event loop busy for tens of milliseconds on a slow CPU. Hovering names a round; clicking selects it (the transcript then
highlights its burst).

Auto (--steps auto) and composed drafting add, only while a run shows them (so each legend
names only what is drawn): the k chosen each round and the drafts Auto expected to be accepted
at it (Round.expected_tokens - 1, beside the accepted ones) on the drafts plot; the tok/s it
expected (Round.expected_tok_s at that k) beside the measured on the speed plot; the per-position
bars split by who drafted (Round.draft_source), n-gram hatched; and, from this machine's tuning
profile, the break-even acceptance (engines.speculative.tuning.break_even) as a line on the
position plot. Expected lines are dashed, so they read without colour."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import QBoxLayout, QFrame, QGridLayout, QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from app.gui.views.elided_label import ElidedLabel
from app.records.round_series import ROLLING, RoundSeries, finite_rolling_mean, rolling_window
from engines.profiles import Profile
from engines.speculative.rounds import Round
from engines.speculative.tuning import best_k, break_even

REDRAW_HZ = 20  # timer ticks per second; each tick redraws one plot (see refresh)
RAW_ROUNDS = 300  # beyond this many rounds only the moving averages are drawn
MIN_ROUNDS_SHOWN = 10
MIN_SECONDS_SHOWN = 1.0

GREEN, GREY, BLUE, AMBER, BASELINE = "#1f9d55", "#a1a1a6", "#0a84ff", "#ff9f0a", "#c7c7cc"
INDIGO, DARK_GREEN, DARK_BLUE, INK = "#5e5ce6", "#0b6b3a", "#0040dd", "#3a3a3c"
# Who drafted (Round.draft_source): the model drafter keeps the accepted-draft green, the n-gram
# lookup is blue and hatched (the transcript underlines it): told apart without colour too
NGRAM = "ngram"
SOURCE_BRUSH = {NGRAM: QBrush(QColor(BLUE), Qt.BrushStyle.BDiagPattern)}
SOURCE_NAMES = {NGRAM: "n-gram", "mtp": "MTP drafter", "draft": "draft model"}


def source_name(source: str) -> str:
    return SOURCE_NAMES.get(source, source)


VALUE_SAMPLE = "8888.8 s"  # about the widest figure a card shows: its width is the card's minimum


def figure_card(title: str) -> tuple[QWidget, QLabel]:
    card = QWidget(objectName="figure")
    value = QLabel("\u2013", objectName="figureValue")
    name = QLabel(title, objectName="figureName")
    col = QVBoxLayout(card)
    col.setContentsMargins(10, 6, 10, 6)
    col.setSpacing(0)
    col.addWidget(value)
    col.addWidget(name)
    return card, value


PLOT_MIN = QSize(170, 150)  # a plot's minimum (what it was before the strip reflowed)
SPACING = 6


def plot_title(title: str) -> str:
    return f"<span style='color:#1d1d1f;font-size:9.5pt;font-weight:600'>{title}</span>"


LEGEND_TOP = 2  # px between a plot's top and its legend


def make_plot(title: str, x_label: str, y_label: str) -> pg.PlotWidget:
    plot = pg.PlotWidget()
    plot.setTitle(plot_title(title))
    plot.setLabel("bottom", x_label)
    plot.setLabel("left", y_label)
    plot.showGrid(x=False, y=True, alpha=0.15)
    plot.setMenuEnabled(False)
    plot.setMinimumSize(PLOT_MIN)
    font = QFont()
    font.setPointSizeF(8.5)
    for axis in ("bottom", "left"):
        plot.getAxis(axis).enableAutoSIPrefix(False)  # no "x0.001" when a run is one round long
        plot.getAxis(axis).setTickFont(font)
        plot.getAxis(axis).setTextPen(pg.mkPen("#6e6e73"))
        plot.getAxis(axis).setPen(pg.mkPen("#d2d2d7"))
    item = plot.getPlotItem()
    item.setClipToView(True)
    item.setDownsampling(auto=True, mode="peak")
    item.hideButtons()
    legend = plot.addLegend(offset=(-4, LEGEND_TOP), colCount=2, labelTextSize="7.5pt",
                            labelTextColor="#3a3a3c", brush=pg.mkBrush(255, 255, 255, 200), verSpacing=-6)
    legend.setZValue(20)
    return plot


def legend_headroom(plot: pg.PlotWidget) -> float:
    """How far above its highest value a plot's y range must reach so that its legend (at the
    top right) covers no data: the highest line, or a bar at 100%, ends just below the legend.
    From the legend's height and the view's, so it holds at any window size."""
    view_h = plot.getViewBox().sceneBoundingRect().height()
    legend = plot.getPlotItem().legend
    if legend is None or view_h <= 0:
        return 1.1
    share = min(0.6, (legend.sceneBoundingRect().height() + LEGEND_TOP + 4) / view_h)
    return 1.0 / (1.0 - share)


class TelemetryView(QWidget):
    round_selected = Signal(int)  # a round index
    round_hovered = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("telemetry")
        pg.setConfigOptions(antialias=False, background="w", foreground="#6e6e73")
        self.series = RoundSeries()
        self.baseline: RoundSeries | None = None
        self.dirty = False
        self.stale: set[int] = set()  # plots (0 drafts, 1 speed, 2 positions) not yet redrawn
        self.turn = 0
        self.redraws = 0
        self.selected: int | None = None
        self.profile: Profile | None = None  # this machine's tuning profile for the shown run's model
        self.auto = False  # the shown run chose its draft length with Auto
        self.break_even: tuple[int, float | None] | None = None  # (k, acceptance) as drawn
        self.window_rounds = ROLLING  # the moving averages' window, as titled

        self._build_cards()
        self._build_drafts_plot()
        self._build_speed_plot()
        self._build_position_plot()
        self._build_round_lines()
        self._build_layout()
        self.arrange(2)

        self.timer = QTimer(self)
        self.timer.setInterval(1000 // REDRAW_HZ)
        self.timer.timeout.connect(self.refresh)
        self.timer.start()
        self.refresh(force=True)

    # --- building -------------------------------------------------------------------------
    def _build_cards(self) -> None:
        """The running figures, one card each, in a grid arrange() fills."""
        self.cards: dict[str, QLabel] = {}
        self.card_widgets: list[QWidget] = []
        self.figure_grid = QGridLayout()
        self.figure_grid.setContentsMargins(0, 0, 0, 0)
        self.figure_grid.setSpacing(SPACING)
        names = [("tau", "\u03c4 tokens/round"), ("acceptance", "acceptance"),
                 ("tok_s", "decode tok/s"), ("ttft", "first token"),
                 ("rounds", "rounds"), ("speedup", "A/B speedup")]
        for key, title in names:
            card, value = figure_card(title)
            self.cards[key] = value
            self.card_widgets.append(card)
        self.figure_box = QWidget(objectName="figures")
        self.figure_box.setLayout(self.figure_grid)

    def _build_drafts_plot(self) -> None:
        self.drafts_plot = make_plot("Drafts per round", "round", "drafts (tokens)")
        # raw per-round values as thin lines (one point per round), and their moving averages
        # on top so a trend stays readable; no fills (they are slow to paint). Only the
        # averages are in the legend: the thin lines are the same quantities, unsmoothed.
        self.proposed_curve = self.drafts_plot.plot(pen=pg.mkPen(QColor(142, 142, 147, 110), width=1))
        self.accepted_curve = self.drafts_plot.plot(pen=pg.mkPen(QColor(31, 157, 85, 110), width=1))
        self.proposed_mean = self.drafts_plot.plot(pen=pg.mkPen(GREY, width=2), name="asked")
        self.accepted_mean = self.drafts_plot.plot(pen=pg.mkPen(GREEN, width=2), name="accepted")
        self.drafts_plot.setYRange(0, 4)
        # Auto's rounds only (NaN elsewhere, so a line breaks where Auto did not choose)
        self.steps_curve = self.drafts_plot.plot(pen=pg.mkPen(INDIGO, width=1.5), connect="finite")
        self.expected_accepted = self.drafts_plot.plot(
            pen=pg.mkPen(DARK_GREEN, width=2, style=Qt.PenStyle.DashLine), connect="finite")
        self.drafts_plot.setToolTip(
            "asked: drafts proposed per round; accepted: those the target kept (moving averages, thin: per round).\n"
            "With Auto: k, the draft length it chose each round, and expected (dashed), the drafts it "
            "expected to be accepted at that k (tokens per round minus the target's own).")

    def _build_speed_plot(self) -> None:
        self.speed_plot = make_plot("Decode speed", "time since start (s)", "tokens / s")
        self.baseline_curve = self.speed_plot.plot(pen=pg.mkPen(BASELINE, width=2, style=pg.QtCore.Qt.PenStyle.DashLine))
        self.speed_dots = self.speed_plot.plot(pen=pg.mkPen(QColor(10, 132, 255, 70), width=1))  # per round
        self.speed_curve = self.speed_plot.plot(pen=pg.mkPen(BLUE, width=2), connect="finite", name="tok/s")
        self.expected_speed = self.speed_plot.plot(pen=pg.mkPen(DARK_BLUE, width=2, style=Qt.PenStyle.DashLine),
                                                   connect="finite")
        self.speed_plot.setToolTip("tok/s: the decode speed measured (moving average; faint: per round). With Auto, "
                                   "expected (dashed): the tok/s it expected of the k it chose.")

    def _build_position_plot(self) -> None:
        self.position_plot = make_plot("By draft position", "draft position", "accepted (%)")
        self.position_plot.getPlotItem().setDownsampling(False)
        self.position_plot.getAxis("left").setTicks([[(v, str(v)) for v in range(0, 101, 20)]])
        self.position_plot.setXRange(0.4, 3.6)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=pg.mkBrush(GREEN), pen=pg.mkPen(None),
                                    name="accepted")
        self.position_plot.addItem(self.bars)
        self.source_bars: dict[str, pg.BarGraphItem] = {}  # composed runs: one set per Round.draft_source
        self.break_even_curve = self.position_plot.plot(pen=pg.mkPen(INK, width=2, style=Qt.PenStyle.DashDotLine))
        self.position_plot.setToolTip(
            "Acceptance by draft position; in a composed run split by who drafted: n-gram blue and hatched, the "
            "model drafter green.\nDash-dot line: the break-even acceptance from this machine's tuning profile at "
            "the k shown; below it, drafting that many per round is slower here than plain decoding.")
        self.legend_shown: dict[int, str | None] = {id(self.bars): "accepted"}  # id(item) -> its legend name

    def _build_round_lines(self) -> None:
        """The vertical lines on the drafts and speed plots at the round hovered and the round
        selected, and the mouse handlers that move them."""
        self.hover_lines = []
        self.select_lines = []
        for plot in (self.drafts_plot, self.speed_plot):
            hover = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#86868b", width=1, style=pg.QtCore.Qt.PenStyle.DotLine))
            select = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(AMBER, width=2))
            for line in (hover, select):
                line.setVisible(False)
                line.setZValue(10)
                plot.addItem(line, ignoreBounds=True)
            self.hover_lines.append(hover)
            self.select_lines.append(select)
            plot.scene().sigMouseMoved.connect(lambda pos, p=plot: self._on_mouse_moved(p, pos))
            plot.scene().sigMouseClicked.connect(lambda ev, p=plot: self._on_mouse_clicked(p, ev))
        self.hover_label = QLabel(objectName="muted")
        self.hover_label.setMinimumWidth(10)

    def _build_layout(self) -> None:
        """The title row over the strip. The strip reflows (arrange): the cards beside the plots
        (2 columns) or above them (6 or 3 columns) when it is tall enough for that; the plots
        share the rest. Whatever the arrangement, nothing shrinks below its minimum: the strip
        scrolls sideways instead."""
        plots = QWidget(objectName="plots")
        plot_row = QHBoxLayout(plots)
        plot_row.setContentsMargins(0, 0, 0, 0)
        plot_row.setSpacing(SPACING)
        for plot in (self.drafts_plot, self.speed_plot, self.position_plot):
            plot_row.addWidget(plot, 1)
        self.plots = plots
        self.strip = QWidget(objectName="strip")
        self.body = QBoxLayout(QBoxLayout.Direction.LeftToRight, self.strip)
        self.body.setContentsMargins(8, 0, 0, 0)  # the cards' distance from the sidebar
        self.body.setSpacing(SPACING)
        self.body.addWidget(self.figure_box)
        self.body.addWidget(self.plots, 1)
        self.scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self.scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setWidget(self.strip)
        self.scrollbar_h = self.scroll.horizontalScrollBar().sizeHint().height()
        self.columns = 0  # the cards' columns as arranged: 2 beside the plots, 6 or 3 above them
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 6, 0)
        row.addWidget(self.scroll, 1)
        title_row = QHBoxLayout()
        title_row.setContentsMargins(12, 8, 12, 0)
        title_row.addWidget(QLabel("Speculation", objectName="paneTitle"))
        self.tuning_label = ElidedLabel(objectName="muted")  # "Auto · tuned …": which costs Auto chose from
        title_row.addSpacing(8)
        title_row.addWidget(self.tuning_label, 1)
        title_row.addStretch(1)
        title_row.addWidget(self.hover_label)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 8, 8)
        col.setSpacing(4)
        col.addLayout(title_row)
        col.addLayout(row, 1)
        self.margins = 8 + 6 + 8  # the view's right margin, the row's, the strip's left one

    # --- data -----------------------------------------------------------------------------
    def clear(self) -> None:
        self.series = RoundSeries()
        self.selected = None
        for line in self.select_lines + self.hover_lines:
            line.setVisible(False)
        self.hover_label.setText("")
        self.refresh(force=True)

    def append(self, rnd: Round) -> None:
        self.series.append(rnd)
        self.dirty = True

    def set_baseline(self, series: RoundSeries | None) -> None:
        """The speculation-off run of an A/B compare, drawn dashed behind the speed plot (and
        named in its legend only while it is there)."""
        legend = self.speed_plot.getPlotItem().legend
        legend.removeItem(self.baseline_curve)
        if series is not None:
            legend.addItem(self.baseline_curve, "speculation off (A/B)")
        self.baseline = series
        self.dirty = True

    def set_speedup(self, text: str) -> None:
        self.cards["speedup"].setText(text)

    def set_tuning(self, profile: Profile | None, auto: bool) -> None:
        """This machine's tuning profile for the shown run (its break-even line) and whether
        the run chose its draft length with Auto (said in the title row)."""
        import time

        self.profile, self.auto = profile, auto
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(profile.created)) if profile else ""
        if auto:
            self.tuning_label.setText(f"Auto \u00b7 tuning profile of {when}" if profile else
                                      "Auto \u00b7 no tuning profile: costs measured in the run")
        else:
            self.tuning_label.setText(f"tuning profile of {when}" if profile else "")
        self.tuning_label.setToolTip(f"measured on {profile.machine}" if profile else "")
        self.dirty = True

    # --- drawing --------------------------------------------------------------------------
    # --- reflow ---------------------------------------------------------------------------
    def card_width(self) -> int:
        value = self.cards["tau"]
        value.ensurePolished()
        sample = value.fontMetrics().horizontalAdvance(VALUE_SAMPLE) + 2 * 10 + 2
        return max(sample, *(card.minimumSizeHint().width() for card in self.card_widgets))

    def cards_width(self, columns: int) -> int:
        return columns * self.card_width() + (columns - 1) * SPACING

    def card_height(self) -> int:
        return max(card.minimumSizeHint().height() for card in self.card_widgets)

    def plots_width(self) -> int:
        return 3 * PLOT_MIN.width() + 2 * SPACING

    def strip_height(self, columns: int) -> int:
        """What the cards and plots need in height when the cards have `columns` columns."""
        rows = -(-len(self.card_widgets) // columns)
        cards = rows * self.card_height() + (rows - 1) * SPACING
        if columns == 2:
            return max(cards, PLOT_MIN.height())
        return cards + SPACING + PLOT_MIN.height()

    def chrome_height(self) -> int:
        """The title row, spacing, a sideways scroll bar and the bottom margin."""
        column = self.layout()
        return (column.itemAt(0).minimumSize().height() + column.spacing() + self.scrollbar_h
                + column.contentsMargins().bottom())

    def columns_for(self, width: int, height: int) -> int:
        """2 columns beside the plots when both fit side by side (or when the strip is too low for
        cards above plots); else 6, or 3, above them."""
        inner = width - self.margins
        if inner >= self.cards_width(2) + SPACING + self.plots_width():
            return 2
        columns = 6 if inner >= self.cards_width(6) else 3
        return columns if height >= self.strip_height(columns) + self.chrome_height() else 2

    def arrange(self, columns: int) -> None:
        if columns == self.columns:
            return
        self.columns = columns
        for card in self.card_widgets:
            self.figure_grid.removeWidget(card)
        for i, card in enumerate(self.card_widgets):
            self.figure_grid.addWidget(card, i // columns, i % columns)
        for c in range(6):
            self.figure_grid.setColumnStretch(c, 1 if c < columns else 0)
        beside = columns == 2
        self.body.setDirection(QBoxLayout.Direction.LeftToRight if beside else QBoxLayout.Direction.TopToBottom)
        if beside:
            self.figure_box.setFixedWidth(self.cards_width(2))
        else:
            self.figure_box.setMinimumWidth(self.cards_width(columns))
            self.figure_box.setMaximumWidth(16777215)
        width = self.cards_width(2) + SPACING + self.plots_width() if beside else max(self.cards_width(columns),
                                                                                     self.plots_width())
        self.strip.setMinimumSize(8 + width,
                                  self.strip_height(columns))
        self.scroll.setMinimumHeight(self.strip_height(columns) + self.scrollbar_h)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        """The lowest arrangement (cards beside the plots) at the width of one plot: the strip
        reflows and scrolls sideways, so the window may be that small."""
        return QSize(PLOT_MIN.width() + self.margins, self.strip_height(2) + self.chrome_height())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self.arrange(self.columns_for(event.size().width(), event.size().height()))
        if self.series.n:  # the legends' share of each plot's height has changed: redrawn in turn
            self.stale = {0, 1, 2}

    def refresh(self, force: bool = False) -> None:
        """force redraws everything now (exports, the end of a run); otherwise redraw the
        next plot in turn if anything changed since it was last drawn."""
        if force:
            self.stale = {0, 1, 2}
            for part in (0, 1, 2):
                self._redraw(part)
            self._update_figures()
            return
        if self.dirty:
            self.dirty = False
            self.stale = {0, 1, 2}
            self._update_figures()
        if self.stale:
            part = min(self.stale, key=lambda p: (p - self.turn) % 3)
            self.turn = (part + 1) % 3
            self._redraw(part)

    def _redraw(self, part: int) -> None:
        self.stale.discard(part)
        self.redraws += 1
        s = self.series
        raw = s.n <= RAW_ROUNDS
        window = rolling_window(s.n)
        if window != self.window_rounds:
            self.window_rounds = window
            title = "Drafts per round" + (f" (mean of {window})" if window > ROLLING else "")
            self.drafts_plot.setTitle(plot_title(title))
        if part == 0:
            x = s.column("index")
            self.proposed_curve.setData(x if raw else [], s.column("proposed") if raw else [])
            self.accepted_curve.setData(x if raw else [], s.column("accepted") if raw else [])
            self.proposed_mean.setData(x, s.rolling_mean("proposed", window))
            self.accepted_mean.setData(x, s.rolling_mean("accepted", window))
            auto = s.auto_rounds > 0
            self._in_legend(self.drafts_plot, self.steps_curve, "k" if auto else None)
            self._in_legend(self.drafts_plot, self.expected_accepted, "expected" if auto else None)
            chosen = np.where(np.isfinite(s.column("expected_tokens")), s.column("steps"), np.nan)
            self.steps_curve.setData(x if auto else [], (chosen if raw else finite_rolling_mean(chosen, window)) if auto else [])
            self.expected_accepted.setData(x if auto else [], s.rolling_finite_mean("expected_tokens", window) - 1
                                           if auto else [])
            top = max(3.0, float(s.column("proposed").max()) if s.n else 3.0, float(np.nanmax(chosen)) if auto else 0.0)
            self.drafts_plot.setYRange(0, top * legend_headroom(self.drafts_plot), padding=0)
            last = float(x[-1]) if s.n else 0.0
            self.drafts_plot.setXRange(0, max(MIN_ROUNDS_SHOWN, last), padding=0.02)
        elif part == 1:
            t = s.column("t")
            self.speed_dots.setData(t if raw else [], np.nan_to_num(s.tok_s(), nan=0.0) if s.n and raw else [])
            self._set_finite(self.speed_curve, t, s.rolling_tok_s(window))
            end = float(t[-1]) if s.n else 0.0
            if self.baseline is not None and self.baseline.n:
                self._set_finite(self.baseline_curve, self.baseline.column("t"), self.baseline.rolling_tok_s(window))
                end = max(end, float(self.baseline.column("t")[-1]))
            else:
                self.baseline_curve.setData([], [])
            self.speed_plot.setXRange(0, max(MIN_SECONDS_SHOWN, end), padding=0.02)
            auto = s.auto_rounds > 0
            self._in_legend(self.speed_plot, self.expected_speed, "expected" if auto else None)
            self.speed_plot.getPlotItem().legend.setColumnCount(1 if auto else 2)  # fits a plot at its narrowest
            if auto:
                self._set_finite(self.expected_speed, t, s.rolling_finite_mean("expected_tok_s", window))
            else:
                self.expected_speed.setData([], [])
            rates = [c.yData for c in (self.speed_curve, self.baseline_curve, self.expected_speed)
                     if c.yData is not None and len(c.yData)]
            if raw and self.speed_dots.yData is not None and len(self.speed_dots.yData):
                rates.append(self.speed_dots.yData)
            top = max((float(np.max(r)) for r in rates), default=0.0)
            self.speed_plot.setYRange(0, max(1.0, top) * legend_headroom(self.speed_plot), padding=0)
        else:
            rates = s.per_position() * 100
            positions = np.arange(1, len(rates) + 1)
            self._draw_position_bars(positions, rates)
            ticks = [(i, str(i)) for i in range(1, max(3, len(rates)) + 1)]
            self.position_plot.getAxis("bottom").setTicks([ticks])
            self.position_plot.setXRange(0.4, max(3, len(rates)) + 0.6, padding=0)
            self._draw_break_even(max(3, len(rates)))
            # one name a row once there is more than "accepted": they fit a plot at its narrowest
            self.position_plot.getPlotItem().legend.setColumnCount(1 if s.by_source or self.profile else 2)
            self.position_plot.setYRange(0, 100 * legend_headroom(self.position_plot), padding=0)

    def _draw_position_bars(self, positions: np.ndarray, rates: np.ndarray) -> None:
        """One set of bars, or (composed runs) one per source side by side."""
        s = self.series
        split = bool(s.by_source)
        self.bars.setOpts(x=positions, height=rates if not split else np.zeros(0), width=0.7)
        self._in_legend(self.position_plot, self.bars, None if split else "accepted")
        sources = sorted(s.by_source, key=lambda src: src != NGRAM)  # n-gram first, left
        width = 0.7 / max(len(sources), 1)
        for i, source in enumerate(sources):
            bars = self.source_bars.get(source)
            if bars is None:
                brush = SOURCE_BRUSH.get(source, pg.mkBrush(GREEN))
                pen = pg.mkPen(BLUE, width=1) if source == NGRAM else pg.mkPen(None)
                bars = self.source_bars[source] = pg.BarGraphItem(x=[], height=[], width=width, brush=brush, pen=pen)
                self.position_plot.addItem(bars)
            own = s.per_position(source) * 100
            x = np.arange(1, len(own) + 1) - 0.35 + width * (i + 0.5)
            drafted = s.by_source[source][0] > 0  # a position this source never drafted has no bar, not 0%
            bars.setOpts(x=x[drafted], height=own[drafted], width=width)
            self._in_legend(self.position_plot, bars, source_name(source))
        for source, bars in self.source_bars.items():
            if source not in s.by_source:
                bars.setOpts(x=[], height=[])
                self._in_legend(self.position_plot, bars, None)

    def _draw_break_even(self, positions: int) -> None:
        """The profile's break-even acceptance at the k of the run's last Auto round (else the
        profile's best k): a drafter accepted less than this at each position loses here."""
        if self.profile is None:
            self.break_even = None
            self.break_even_curve.setData([], [])
            self._in_legend(self.position_plot, self.break_even_curve, None)
            return
        s = self.series
        chosen = s.column("steps")[np.isfinite(s.column("expected_tokens")) & (s.column("steps") > 0)]
        latency = self.profile.latency().at
        k = int(chosen[-1]) if len(chosen) else max(1, best_k(latency, self.profile.draft_s, self.profile.acceptance,
                                                               len(self.profile.acceptance)))
        value = break_even(latency, self.profile.draft_s, k)
        self.break_even = (k, value)
        level = 100.0 * (value if value is not None else 1.0)
        self.break_even_curve.setData([0.4, positions + 0.6], [level, level])
        name = f"break-even k={k}" if value is not None else f"k={k} never pays"
        self._in_legend(self.position_plot, self.break_even_curve, name)

    def _in_legend(self, plot, item, name: str | None) -> None:
        """Names `item` in its plot's legend (None: not in it); a no-op when already so."""
        if self.legend_shown.get(id(item)) == name:
            return
        legend = plot.getPlotItem().legend
        legend.removeItem(item)
        if name is not None:
            legend.addItem(item, name)
        self.legend_shown[id(item)] = name

    @staticmethod
    def _set_finite(curve, x: np.ndarray, y: np.ndarray) -> None:
        keep = np.isfinite(y)
        curve.setData(x[keep], y[keep])

    def _update_figures(self) -> None:
        s = self.series
        c = self.cards
        if s.n == 0:
            for key in ("tau", "acceptance", "tok_s", "ttft", "rounds"):
                c[key].setText("\u2013")
            return
        decoded = s.totals.decode_rounds > 0  # a run stopped in its first round has no decode figures
        c["tau"].setText(f"{s.tau:.2f}" if decoded else "\u2013")
        c["acceptance"].setText(f"{s.acceptance_rate * 100:.1f}%" if s.totals.proposed else "\u2013")
        c["tok_s"].setText(f"{s.decode_tok_s:.1f}" if decoded else "\u2013")
        ttft = s.totals.prefill_wall
        c["ttft"].setText("\u2013" if not ttft else f"{ttft * 1000:.0f} ms" if ttft < 1 else f"{ttft:.1f} s")
        c["rounds"].setText(f"{s.n:,}")

    def figures(self) -> dict[str, str]:
        return {k: v.text() for k, v in self.cards.items()}

    # --- hover & select -------------------------------------------------------------------
    def _round_at(self, plot, scene_pos) -> int | None:
        if not plot.sceneBoundingRect().contains(scene_pos):
            return None
        x = plot.getPlotItem().vb.mapSceneToView(scene_pos).x()
        return self.series.nearest_round(x, by_time=plot is self.speed_plot)

    def _on_mouse_moved(self, plot, scene_pos) -> None:
        row = self._round_at(plot, scene_pos)
        if row is None:
            return
        self.show_hover(row)

    def show_hover(self, row: int) -> None:
        s = self.series
        index = int(s.column("index")[row])
        self.hover_lines[0].setPos(index)
        self.hover_lines[1].setPos(s.column("t")[row])
        for line in self.hover_lines:
            line.setVisible(True)
        rate = s.tok_s()[row]
        speed = "prefill" if math.isnan(rate) else f"{rate:.1f} tok/s"
        expected = s.column("expected_tok_s")[row]
        auto = "" if math.isnan(expected) else (f"Auto k {int(s.column('steps')[row])}, expected {expected:.1f} tok/s, "
                                                f"{s.column('expected_tokens')[row]:.2f} tokens \u00b7 ")
        self.hover_label.setText(
            f"round {index} \u00b7 {auto}{int(s.column('proposed')[row])} drafted \u00b7 "
            f"{int(s.column('accepted')[row])} accepted \u00b7 {speed} \u00b7 {s.column('t')[row]:.2f} s")
        self.round_hovered.emit(index)

    def _on_mouse_clicked(self, plot, event) -> None:
        row = self._round_at(plot, event.scenePos())
        if row is not None:
            index = int(self.series.column("index")[row])
            self.select_round(index)
            self.round_selected.emit(index)

    def select_round(self, index: int) -> None:
        rows = np.nonzero(self.series.column("index") == index)[0]
        if not len(rows):
            return
        self.selected = index
        self.select_lines[0].setPos(index)
        self.select_lines[1].setPos(self.series.column("t")[rows[0]])
        for line in self.select_lines:
            line.setVisible(True)

    # --- export ---------------------------------------------------------------------------
    def legend_names(self) -> dict[str, list[str]]:
        """What each plot's legend says (for tests and exports)."""
        def names(plot):
            legend = plot.getPlotItem().legend
            return [label.text for _sample, label in legend.items] if legend is not None else []
        return {"drafts": names(self.drafts_plot), "speed": names(self.speed_plot),
                "position": names(self.position_plot)}

    def mean_counts(self) -> dict[str, int]:
        """How many points the moving averages hold (one per round, at every run length)."""
        count = lambda c: len(c.xData) if c.xData is not None else 0  # noqa: E731
        return {"drafted": count(self.proposed_mean), "accepted": count(self.accepted_mean),
                "speed": count(self.speed_curve)}

    def point_counts(self) -> dict[str, int]:
        """How many points each per-round line holds (as drawn, before view downsampling);
        0 past RAW_ROUNDS rounds, where only the moving averages are drawn."""
        return {
            "drafted": len(self.proposed_curve.xData if self.proposed_curve.xData is not None else []),
            "accepted": len(self.accepted_curve.xData if self.accepted_curve.xData is not None else []),
            "speed": len(self.speed_dots.xData if self.speed_dots.xData is not None else []),
        }
