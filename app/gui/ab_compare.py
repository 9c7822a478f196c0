"""A/B compare in the window: the same input read with speculation off, then on, as two runs of
the run controller; the pair's speedup and whether their tokens are identical
(app.records.compare), the off run's series drawn under the on run's as its baseline."""

from __future__ import annotations

from PySide6.QtCore import QObject

from app.records.compare import compare_sessions
from app.records.round_series import RoundSeries
from engines.speculative.session import Session
from engines.types import SpecConfig

A_B_OFF = "A/B \u00b7 speculation off"
A_B_ON = "A/B \u00b7 speculation on"


def series_of(session: Session) -> RoundSeries:
    series = RoundSeries()
    for rnd in session.rounds:
        series.append(rnd)
    return series


class AbCompare(QObject):
    """The pair under way: `state` is None, or {"phase": "off" | "on", "on_spec": SpecConfig,
    "image": the OCR input or None, "off": the off run's Session once it has ended}."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.state: dict | None = None

    @property
    def active(self) -> bool:
        return self.state is not None

    def cancel(self) -> None:
        self.state = None

    def start(self) -> bool:
        """Runs the same input with speculation off, then on; reports speedup and identity."""
        w = self.window
        if w.running:
            return False
        on = w.controls.spec_config()
        if not on.enabled:
            w.transcript.show_message("A/B compare needs speculation on: set Drafts to 1 or more", "info")
            return False
        image = (w.document.region_image() or w.document.current_image()) if w.mode == "ocr" else None
        self.state = {"phase": "off", "on_spec": on, "image": image}
        if not w.runs.start(A_B_OFF, SpecConfig(method="off", steps=0), image):
            self.state = None
            return False
        return True

    def run_finished(self, session: Session) -> None:
        """One run of the pair has finished: after the off run the on run starts; after the on run
        the result is shown (and emitted: the window's compare_finished)."""
        w = self.window
        if self.state["phase"] == "off":
            self.state.update(phase="on", off=session)
            off_series = series_of(session)
            if not w.runs.start(A_B_ON, self.state["on_spec"], self.state.get("image")):
                self.state = None
                return
            if w.telemetry is not None:
                w.telemetry.set_baseline(off_series)
            return
        result = compare_sessions(self.state["off"], session)
        self.state = None
        w.last_compare = result
        if session.request.get("kind") == "chat":
            w.chat.remember_turn(session)
        w.transcript.show_message(result.summary(), "info" if result.identical else "warning")
        if w.telemetry is not None:
            w.telemetry.set_speedup(f"{result.decode_speedup:.2f}\u00d7")
        w.compare_finished.emit(result)
