"""Issue 16 in the window: bad parameters and inputs past the model's context get a message and
leave the window usable; nothing is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager, nullcontext

import pytest
from PySide6.QtCore import QObject, Qt, Slot

from tests.app.conftest import Recorder

RUN_TIMEOUT_MS = 60_000


def test_max_tokens_past_the_context_is_a_message_and_the_window_stays_usable(qtbot, make_window):
    window = make_window(max_tokens=5000)  # the tiny target's context is 4096 tokens
    rec = Recorder(window)
    window.chat.prompt.setPlainText("the cat")
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as ended:
        assert window.run()
    assert ended.args == ["errored"]
    assert "max_tokens" in window.transcript.message_text and "4096" in window.transcript.message_text
    window.controls.max_tokens_spin.setValue(8)
    window.chat.prompt.setPlainText("the cat")
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS):
        assert window.run()
    assert rec.outcomes == ["errored", "finished"]


# --- the data folder: read-only at the start, full mid-run ---------------------------------------

@contextmanager
def mounted_tmpfs(path, size: str, read_only: bool = False):
    """A small tmpfs (root only): a real full disk or read-only folder, no fakes."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs these as root); the RLIMIT_FSIZE test covers the rest")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def read_only_home(tmp_path):
    """A SPECSCOPE_HOME whose data folder cannot be written: chmod for a normal user; for root
    (who ignores permission bits) a read-only tmpfs."""
    home = tmp_path / "ro-home"
    if os.geteuid() != 0:
        (home / "data").mkdir(parents=True)
        (home / "data").chmod(0o500)
        return nullcontext(home)
    return mounted_tmpfs(home / "data", "1m", read_only=True)


def test_read_only_data_folder_runs_without_autosave_and_says_so(qtbot, make_window, tmp_path, monkeypatch):
    with read_only_home(tmp_path) as data:
        home = data.parent if data.name == "data" else data
        monkeypatch.setenv("SPECSCOPE_HOME", str(home))
        window = make_window(max_tokens=12)
        assert not window.autosaving.on and "not writable" in window.autosaving.message
        assert str(home / "data") in window.autosaving.message
        assert window.autosaving.label.text() == "Autosave off"
        assert "Autosave is off" in window.transcript.message_text
        rec = Recorder(window)
        window.chat.prompt.setPlainText("the cat")
        with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS):
            assert window.run()  # before: Send did nothing and said nothing
        assert rec.outcomes == ["finished"] and sum(len(r.tokens) for r in rec.rounds) == 12


def test_autosave_on_a_full_disk_stops_the_autosave_not_the_run(qtbot, make_window, tmp_path, monkeypatch):
    home = tmp_path / "full-home"
    with mounted_tmpfs(home / "data", "64k") as data:
        monkeypatch.setenv("SPECSCOPE_HOME", str(home))
        window = make_window(max_tokens=300)
        assert window.autosaving.on  # writable at the start
        filler = data / "filler"
        with open(filler, "wb") as f:  # leave room for the header and a few rounds only
            f.write(b"\0" * (os.statvfs(data).f_bavail * os.statvfs(data).f_frsize - 6000))
        rec = Recorder(window)
        window.chat.prompt.setPlainText("the cat")
        with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS):
            assert window.run()
        thread = window.threads[-1][0] if window.threads else None
        assert rec.outcomes == ["finished"], window.transcript.message_text  # before: the run errored
        assert sum(len(r.tokens) for r in rec.rounds) == 300  # nothing lost on screen
        assert window.autosaving.label.text() == "Autosave stopped"
        assert "No space left on device" in window.transcript.message_text
        if thread is not None:
            assert thread.wait(10_000)  # the worker said done; its thread ended (no leak)


# --- a run a crash cut short is offered at the next start ------------------------------------------

CRASHING_WRITER = """
import os, signal, sys
from app.records.sessions import Autosave, new_autosave_path
from engines.speculative.rounds import Round
from engines.speculative.session import Session
from app.records.bursts import Burst

session = Session(request={"kind": "chat", "prompt": "the cat"}, model={"name": "tiny"})
autosave = Autosave(new_autosave_path("chat"), session, {})
for i, text in enumerate(["the", " cat", " sat"]):
    autosave.write_burst(Burst(Round(i, 0, 0, [i + 5], [False], text, [], 0.0, 0.01, 0.01, prefill=i == 0), []))
os.kill(os.getpid(), signal.SIGKILL)  # kill -9 mid-run: no "end" line is written
"""


def test_a_run_killed_mid_way_is_offered_at_the_next_start(qtbot, make_window, specscope_home):
    env = dict(os.environ, SPECSCOPE_HOME=str(specscope_home), PYTHONPATH=os.pathsep.join(sys.path))
    killed = subprocess.run([sys.executable, "-c", CRASHING_WRITER], env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    window = make_window()
    assert window.autosaving.recovery.isVisibleTo(window)  # before: nothing was offered
    assert "did not finish" in window.autosaving.recovery.label.text() and "3 rounds" in window.autosaving.recovery.label.text()
    qtbot.mouseClick(window.autosaving.recovery.action_button, Qt.MouseButton.LeftButton)
    assert not window.autosaving.recovery.isVisibleTo(window)
    assert window.transcript.response_text() == "the cat sat"
    assert [r.index for r in window.session.rounds] == [0, 1, 2]

    again = make_window()  # offered once: the file now records how the run ended
    assert not again.autosaving.recovery.isVisibleTo(again)


def test_a_long_prompt_shows_prefill_progress_in_the_status_bar(qtbot, make_window):
    window = make_window(max_tokens=8)
    recorder = StatusRecorder(window)
    window.run_started.connect(lambda _run: window.worker.prefill_progressed.connect(recorder.record))
    window.chat.prompt.setPlainText("the cat is big and the dog is small . " * 90)  # ~900 tokens, 4 chunks
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as ended:
        assert window.run()
    assert ended.args == ["finished"]
    statuses = recorder.texts
    assert len(statuses) >= 2, statuses
    assert statuses[0].startswith("Reading the prompt: 256/") and "tok/s" in statuses[0], statuses


class StatusRecorder(QObject):
    """Reads the status bar on the GUI thread each time prefill progress arrives (queued after
    the window's own slot, which was connected first)."""

    def __init__(self, window):
        super().__init__()
        self.window, self.texts = window, []

    @Slot(object)
    def record(self, _progress) -> None:
        self.texts.append(self.window.status.text())


def test_screenshot_run_with_an_unreachable_data_folder_says_so_and_exits(tmp_path, tiny_chat):
    """Before: a traceback, and the process never exited."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # the data folder would have to be inside a file
    shot = tmp_path / "shot.png"
    env = dict(os.environ, SPECSCOPE_HOME=str(blocker / "home"), QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "app", "--screenshot", str(shot), "--chat", "the cat",
                          "--model", str(tiny_chat[0]), "--steps", "0", "--max-tokens", "8"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert f"Autosave is off: {blocker / 'home' / 'data' / 'sessions'} is not writable" in out.stderr
    assert shot.exists()


def test_a_drafter_fallback_is_in_the_status_bar(qtbot, make_window):
    from tests.app.engine_loaders import load_with_an_ngram_drafter_that_breaks

    window = make_window(engine_loader=load_with_an_ngram_drafter_that_breaks, chat_method="ngram", max_tokens=40)
    window.chat.prompt.setPlainText("the cat is big and the dog is small . the cat is big and the dog is small .")
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as ended:
        assert window.run()
    assert ended.args == ["finished"]
    assert "speculation stopped" in window.status.text() and "drafter broke" in window.status.text()
    assert window.session.stats().fallbacks == 1
