"""Fixtures for the window tests: a real tiny chat model (random Llama in the HF on-disk
format, built with transformers and loaded through the product's own loader) and a draft
model that the target accepts often but not always (a perturbed copy of it)."""

from __future__ import annotations

import time

import pytest

from tests.engines.mlx_chat.checkpoints import make_tiny_llama, perturbed_copy


@pytest.fixture(scope="session")
def tiny_chat(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-chat")
    target = make_tiny_llama(root / "target")
    draft = perturbed_copy(target, root / "draft", noise=0.1)
    return target, draft


@pytest.fixture(autouse=True)
def specscope_home(tmp_path, monkeypatch):
    """Settings, autosaves and pasted images go to a temporary home, never the user's."""
    home = tmp_path / "home"
    monkeypatch.setenv("SPECSCOPE_HOME", str(home))
    return home


def chat_settings(tiny_chat, **overrides):
    from app.settings import AppSettings

    target, draft = tiny_chat
    values = dict(engine="chat", chat_model=str(target), chat_method="draft", draft_model=str(draft),
                  steps=3, preset=None, max_tokens=48, system_prompt="be brief")
    values.update(overrides)
    return AppSettings(**values)


@pytest.fixture
def make_window(qtbot, tiny_chat):
    from app.main_window import MainWindow

    windows = []

    def make(**overrides):
        w = MainWindow(chat_settings(tiny_chat, **overrides), persist=False)
        qtbot.addWidget(w)
        w.show()
        w.ensure_telemetry()
        windows.append(w)
        return w

    yield make
    for w in windows:
        w.shutdown()


class Recorder:
    """Collects what the window showed, in the order it showed it."""

    def __init__(self, window):
        self.bursts = []
        self.outcomes = []
        window.round_shown.connect(self.bursts.append)
        window.run_ended.connect(self.outcomes.append)

    @property
    def rounds(self):
        return [b.round for b in self.bursts]


class Heartbeat:
    """A QTimer on the GUI thread; the longest gap between its ticks is how long the event
    loop was kept from running."""

    def __init__(self, interval_ms: int = 5):
        from PySide6.QtCore import QTimer

        self.timer = QTimer()
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)
        self.last = None
        self.worst = 0.0
        self.ticks = 0
        self.active = False

    def start(self) -> None:
        self.last = time.perf_counter()
        self.active = True
        self.timer.start()

    def pause(self) -> None:
        self.active = False

    def resume(self) -> None:
        self.last = time.perf_counter()
        self.active = True

    def stop(self) -> None:
        self.timer.stop()

    def _tick(self) -> None:
        now = time.perf_counter()
        if self.active:
            self.worst = max(self.worst, now - self.last)
            self.ticks += 1
        self.last = now
