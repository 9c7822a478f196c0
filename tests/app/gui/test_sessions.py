"""Autosave survives a crash: a real `specscope --chat ...` process is killed (SIGKILL)
mid-run; every round it finished is in the autosave file and reopens in the window."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from app.gui.main_window import MainWindow
from app.records.sessions import list_sessions, load_session, sessions_dir
from app.settings import AppSettings
from engines.factory import load_engine
from engines.types import Request, SpecConfig

ROOT = Path(__file__).resolve().parents[3]


def round_lines(path: Path) -> int:
    try:
        return path.read_text(encoding="utf-8").count('"event": "round"')
    except OSError:
        return 0


def test_a_torn_last_line_is_skipped(tmp_path):
    """The process died while writing a round: the rounds before it load."""
    from engines.speculative.trace import TraceWriter
    from tests.engines.speculative.test_rounds import rnd

    path = tmp_path / "t.ndjson"
    rounds = [rnd(0, 0, 0, 1, 0.5, prefill=True), rnd(1, 2, 1, 2, 0.1)]
    with TraceWriter(path, header={"model": {"path": "m"}}) as tw:
        for r in rounds:
            tw.write(r)
    with open(path, "a") as f:
        f.write('{"event": "round", "index": 2, "propo')
    assert load_session(path).session.rounds == rounds


def test_killed_mid_run_the_finished_rounds_are_recoverable(qtbot, tiny_chat, specscope_home):
    target, _draft = tiny_chat
    env = dict(os.environ, SPECSCOPE_HOME=str(specscope_home), QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "--chat", "the cat", "--model", str(target), "--steps", "0",
         "--max-tokens", "4000", "--max-repeat", "0", "--system", "be brief", "--screenshot", str(specscope_home / "never.png")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        folder = sessions_dir()
        qtbot.waitUntil(lambda: any(round_lines(p) >= 40 for p in folder.glob("*.ndjson")), timeout=90_000)
        proc.send_signal(signal.SIGKILL)  # a crash: no chance to write anything more
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (specscope_home / "never.png").exists()  # the run never got to finish

    [path] = list(folder.glob("*.ndjson"))
    saved = load_session(path)
    rounds = saved.session.rounds
    assert len(rounds) >= 40 and saved.outcome is None  # no end line: it was interrupted
    assert [r.index for r in rounds] == list(range(len(rounds)))
    assert saved.session.request["prompt"] == "the cat" and saved.session.model["hash"]

    # the recovered tokens are exactly what the engine produces for that request
    engine = load_engine("chat", str(target))
    request = Request(kind="chat", prompt="the cat", system="be brief", max_tokens=len(saved.session.tokens),
                      spec=SpecConfig(method="off", steps=0))
    expected = [t for r in engine.generate(request) for t in r.tokens]
    assert saved.session.tokens == expected

    # and the session reopens from the list, in the window
    [entry] = list_sessions()
    assert entry.path == path and entry.rounds == len(rounds) and entry.outcome is None
    window = MainWindow(AppSettings(), persist=False)
    qtbot.addWidget(window)
    window.show()
    window.session_files.open_session(entry.path)
    assert window.transcript.response_text() == saved.session.text
    window.telemetry.refresh(force=True)
    assert window.telemetry.point_counts()["drafted"] == len(rounds)
    assert "interrupted" in window.status.text()


def test_autosave_of_a_finished_run_in_the_window(qtbot, make_window):
    window = make_window(max_tokens=20)
    window.chat.prompt.setPlainText("the dog")
    with qtbot.waitSignal(window.run_ended, timeout=60_000):
        window.run()
    [path] = list(sessions_dir().glob("*.ndjson"))
    saved = load_session(path)
    assert saved.outcome == "finished"
    assert [r.to_dict() for r in saved.session.rounds] == [r.to_dict() for r in window.session.rounds]
    assert [b.draft_chars for b in saved.bursts] == [s.burst.draft_chars for s in window.transcript.spans]
    assert saved.settings["chat_method"] == "draft"
