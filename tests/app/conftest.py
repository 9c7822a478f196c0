"""Fixtures for the window tests: a real tiny chat model (random Llama in the HF on-disk
format, built with transformers and loaded through the product's own loader) and a draft
model that the target accepts often but not always (a perturbed copy of it)."""

from __future__ import annotations

import os
import time

import pytest

from tests.engines.mlx_chat.checkpoints import make_tiny_llama, perturbed_copy

# The window's engine process (app/gui/engine_process.py) is a fresh interpreter: it inherits
# the environment, not tests/conftest.py's torch.set_num_threads(1) (torch's threads make the
# tiny models' ops many times slower on 2 cores: a tiny GLM-OCR page 4-25x). OMP_NUM_THREADS
# sets torch's threads there; OpenBLAS would read it too, so its own count is given as its default.
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count() or 1))
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_chat(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-chat")
    target = make_tiny_llama(root / "target")
    draft = perturbed_copy(target, root / "draft", noise=0.1)
    return target, draft


@pytest.fixture(scope="session")
def tiny_ocr(tmp_path_factory):
    """A tiny random GLM-OCR checkpoint in the real HF format, and two page images."""
    pytest.importorskip("torch")
    from tests.engines.glm_ocr.checkpoints import make_tiny_glm_ocr, test_images

    root = tmp_path_factory.mktemp("tiny-ocr")
    model = make_tiny_glm_ocr(root / "glm-ocr")
    images = []
    for i, image in enumerate(test_images(2)):
        images.append(root / f"page-{i}.png")
        image.save(images[-1])
    return model, images


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
    from app.gui.main_window import MainWindow

    windows = []

    def make(engine_loader=None, **overrides):
        w = MainWindow(chat_settings(tiny_chat, **overrides), engine_loader=engine_loader, persist=False)
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
    loop was kept from running. `worst` is wall time; `worst_cpu` is the GUI thread's own CPU
    time between ticks (what our code spent), which other processes on an oversubscribed
    machine cannot inflate. Tests only print these figures (a timed assertion is flaky on a
    shared machine); the 50 ms target is measured by bench/app_heartbeat.py."""

    def __init__(self, interval_ms: int = 5):
        from PySide6.QtCore import QTimer

        self.timer = QTimer()
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)
        self.last = None
        self.last_cpu = 0.0
        self.worst = 0.0
        self.worst_cpu = 0.0
        self.ticks = 0
        self.active = False

    def start(self) -> None:
        self.last = time.perf_counter()
        self.last_cpu = time.thread_time()
        self.active = True
        self.timer.start()

    def pause(self) -> None:
        self.active = False

    def resume(self) -> None:
        self.last = time.perf_counter()
        self.last_cpu = time.thread_time()
        self.active = True

    def stop(self) -> None:
        self.timer.stop()

    def _tick(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        if self.active:
            self.worst = max(self.worst, now - self.last)
            self.worst_cpu = max(self.worst_cpu, cpu - self.last_cpu)
            self.ticks += 1
        self.last, self.last_cpu = now, cpu

    def summary(self) -> str:
        import os

        return (f"worst gap {self.worst * 1000:.1f} ms wall, {self.worst_cpu * 1000:.1f} ms GUI-thread CPU, "
                f"{self.ticks} ticks, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


@pytest.fixture(scope="session")
def recorded_rounds(tiny_chat):
    """Rounds of a real run (the tiny target, its perturbed copy drafting 3 per round), for
    tests that replay many rounds into the views faster than any engine would produce them."""
    from engines.factory import load_engine
    from engines.types import Request, SpecConfig

    target, draft = tiny_chat
    engine = load_engine("chat", str(target), draft_model=str(draft))
    request = Request(kind="chat", prompt="the cat", max_tokens=400,
                      spec=SpecConfig(method="draft", steps=3, draft_model=str(draft)))
    return list(engine.generate(request))


def replayed(rounds, count: int):
    """`count` rounds made of copies of `rounds`, re-indexed and laid end to end in time."""
    from dataclasses import replace

    out, t0 = [], 0.0
    while len(out) < count:
        for r in rounds:
            if len(out) == count:
                break
            if r.prefill and out:
                continue  # one prefill per run
            out.append(replace(r, index=len(out), t_s=t0 + r.t_s))
        t0 = out[-1].t_s
    return out
