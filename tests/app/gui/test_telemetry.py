"""The telemetry pane at scale: 10,000 recorded real rounds replayed into it, far faster than
an engine would deliver them, while a heartbeat timer watches the event loop (its worst gap is
printed; the 50 ms target is measured by bench/app_heartbeat.py, not asserted here)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import QTimer

from app.gui.views.telemetry import REDRAW_HZ, TelemetryView
from app.records.round_series import RoundSeries
from engines.speculative.rounds import session_stats
from tests.app.conftest import Heartbeat, replayed


def test_running_figures_equal_session_stats(recorded_rounds):
    series = RoundSeries(capacity=4)  # grows several times
    for r in recorded_rounds:
        series.append(r)
    stats = session_stats(recorded_rounds)
    assert series.n == len(recorded_rounds)
    assert series.tau == pytest.approx(stats.tau)
    assert series.acceptance_rate == pytest.approx(stats.acceptance_rate)
    assert series.decode_tok_s == pytest.approx(stats.decode_tok_s)
    assert series.totals.prefill_wall == pytest.approx(stats.ttft_s)
    assert series.totals.stats() == stats  # one sum for the window and the session
    assert list(series.per_position()) == pytest.approx(stats.per_position_acceptance)
    assert 0 < stats.accepted < stats.proposed  # a drafter accepted often but not always
    rate = series.tok_s()
    assert np.isnan(rate[0]) and recorded_rounds[0].prefill
    assert rate[1] == pytest.approx(len(recorded_rounds[1].tokens) / recorded_rounds[1].wall_s)
    assert series.nearest_round(7.2) == 7
    assert series.nearest_round(recorded_rounds[12].t_s, by_time=True) == 12


def test_plots_stay_responsive_at_10000_rounds(qtbot, recorded_rounds, capsys):
    view = TelemetryView()
    qtbot.addWidget(view)
    view.resize(1300, 300)
    view.show()
    rounds = replayed(recorded_rounds, 10_000)
    beat = Heartbeat()
    feed = iter(range(0, len(rounds), 100))

    def feed_some():  # 100 rounds every 10 ms: 10,000 rounds/s, far faster than any engine
        start = next(feed, None)
        if start is None:
            feeder.stop()
            return
        for r in rounds[start:start + 100]:
            view.append(r)

    feeder = QTimer()
    feeder.setInterval(10)
    feeder.timeout.connect(feed_some)
    redraws_before = view.redraws  # the constructor's own first drawing of the three plots
    t0 = time.perf_counter()
    beat.start()
    feeder.start()
    qtbot.waitUntil(lambda: view.series.n == 10_000 and not view.stale and not view.dirty, timeout=30_000)
    elapsed = time.perf_counter() - t0
    beat.stop()
    with capsys.disabled():
        print(f"\n[heartbeat] 10,000 rounds replayed into the plots in {elapsed:.2f} s, "
              f"{view.redraws} plot redraws: {beat.summary()}")
    # the redraw rate is bounded by the timer, not by the number of rounds
    assert view.redraws - redraws_before <= elapsed * REDRAW_HZ + 4
    assert beat.ticks > 10  # the event loop ran while the rounds were fed
    view.refresh(force=True)
    # past RAW_ROUNDS only the moving averages are drawn, one point per round (prefill has no speed)
    assert view.point_counts() == {"drafted": 0, "accepted": 0, "speed": 0}
    assert view.mean_counts() == {"drafted": 10_000, "accepted": 10_000, "speed": 10_000 - 1}
    assert view.figures()["rounds"] == "10,000"
    # hover and select still find their round among 10,000
    view.show_hover(9_876)
    assert view.hover_label.text().startswith("round 9876 ")
    view.select_round(9_999)
    assert view.selected == 9_999 and view.select_lines[0].value() == 9_999
