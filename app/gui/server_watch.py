"""Watching a server's load while the window is connected to it: once a second a background
thread scrapes its /metrics (the GUI thread never waits on the network) and the change since
the last scrape becomes a ServerLoad (engines.remote.counters). Signals are past-tense events."""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QObject, QTimer, Signal

from engines.remote.counters import parse_load_counters, server_load
from engines.remote.engine import fetch_metrics

INTERVAL_MS = 1000


class ServerWatch(QObject):
    load_measured = Signal(object)  # ServerLoad
    load_failed = Signal(str)

    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS):
        super().__init__(parent)
        self.base: str | None = None
        self.api_key: str | None = None
        self.last = None  # (LoadCounters, time) of the previous scrape
        self.busy = threading.Event()  # a scrape is in flight: the next tick skips
        self.timer = QTimer(self)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)

    def watch(self, base: str, api_key: str | None) -> None:
        if base != self.base:
            self.last = None
        self.base, self.api_key = base, api_key
        self.timer.start()
        self._tick()

    def stop(self) -> None:
        self.timer.stop()
        self.base = self.last = None

    def _tick(self) -> None:
        if self.base is None or self.busy.is_set():
            return
        self.busy.set()
        threading.Thread(target=self._scrape, args=(self.base, self.api_key), daemon=True,
                         name="specscope-server-watch").start()

    def _scrape(self, base: str, api_key: str | None) -> None:
        try:
            text = fetch_metrics(base, api_key)
            if base != self.base:  # the window moved on while this one was out
                return
            if text is None:
                self.load_failed.emit("the server exports no /metrics")
                return
            now = parse_load_counters(text), time.monotonic()
            if self.last is not None:
                self.load_measured.emit(server_load(self.last[0], now[0], now[1] - self.last[1]))
            self.last = now
        finally:
            self.busy.clear()
