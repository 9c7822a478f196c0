"""The window's engine runs in a child process (app/gui/engine_process.py): a child killed
mid-run (SIGKILL, as the OOM killer does; SIGSEGV, as a crash in native code) is one message
naming the model and the signal, every round received stays on screen and in the autosave, and
the next run starts a new child in the same window. One child serves a window's runs (loaded
once), loads no Qt, and none is left once the window has closed. On real tiny models."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from app.records.sessions import load_session
from tests.app.conftest import Recorder
from tests.app.engine_loaders import load_refusing_qt

RUN_TIMEOUT_MS = 60_000


def send(qtbot, window, prompt: str) -> str:
    window.chat.prompt.setPlainText(prompt)
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as ended:
        assert window.run()
    return ended.args[0]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
def test_a_child_killed_mid_run_is_a_message_and_the_next_run_works(qtbot, make_window, tiny_chat, sig):
    window = make_window(max_tokens=4000, steps=0, max_repeat=0)  # a long run: killed long before its end
    rec = Recorder(window)
    runs = []
    window.run_started.connect(runs.append)
    killed = []

    def kill_after_five(_burst):
        if len(rec.bursts) == 5 and not killed:
            killed.append(window.engines.pid)
            os.kill(window.engines.pid, sig)

    window.round_shown.connect(kill_after_five)
    assert send(qtbot, window, "the cat") == "errored"
    window.round_shown.disconnect(kill_after_five)

    message = window.transcript.message_text
    assert f"was killed by {sig.name}" in message and tiny_chat[0].name in message, message
    assert "next run starts a new engine process" in message
    assert window.status.text() == "Error" and not window.running
    # every round the window received is shown, and saved, with the end the crash gave the run
    assert len(rec.rounds) >= 5 and rec.rounds[-1].finish is None
    assert window.transcript.response_text() == "".join(r.text for r in rec.rounds)
    assert [r.index for r in window.session.rounds] == [r.index for r in rec.rounds]
    saved = load_session(runs[0].autosave)
    assert [r.to_dict() for r in saved.session.rounds] == [r.to_dict() for r in rec.rounds]
    assert saved.outcome == "errored" and saved.message == message
    assert gone(killed[0]) and window.engines.pid is None

    # the same window: the conversation goes on (the failed prompt is sent again), on a new child
    window.controls.max_tokens_spin.setValue(8)
    assert send(qtbot, window, "") == "finished"
    assert rec.outcomes == ["errored", "finished"]
    assert window.engines.pid not in (None, killed[0]) and window.engines.loads == 2
    assert window.chat.history[0] == {"role": "user", "content": "the cat"}


def test_one_child_per_window_loaded_once_without_qt_and_none_left_after_close(qtbot, make_window):
    window = make_window(engine_loader=load_refusing_qt, max_tokens=8)  # the loader runs in the child
    assert send(qtbot, window, "the cat") == "finished"
    child = window.engines.child.process
    assert send(qtbot, window, "the dog") == "finished"
    assert window.engines.child.process is child and window.engines.loads == 1  # the second run reused it
    assert any(f"MLX \u00b7 {device}" in window.model_label.text() for device in ("CPU", "Metal GPU"))  # said by the child

    # a child that died between runs (nothing was running) is replaced without a word
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    assert send(qtbot, window, "the bird") == "finished"
    assert window.transcript.message_text == "" and window.engines.loads == 2
    child = window.engines.child.process

    window.close()  # as the user closes it: the child quits cleanly, and is reaped
    assert child.exitcode == 0 and gone(child.pid)
    assert multiprocessing.active_children() == []


def test_a_child_killed_while_reading_a_document_keeps_the_pages_read(qtbot, tiny_ocr):
    from app.gui.main_window import MainWindow
    from app.settings import AppSettings

    model, images = tiny_ocr
    window = MainWindow(AppSettings(engine="ocr", ocr_model=str(model), ocr_method="mtp", steps=2, preset=None,
                                    max_tokens=16, max_repeat=0), persist=False)
    qtbot.addWidget(window)
    window.show()
    window.ensure_telemetry()
    rec = Recorder(window)
    assert window.open_documents(images[:1]) == 1
    assert read(qtbot, window) == "finished"  # page 1 is read

    # page 2, long (the tiny model loops; loops are let run): its engine process is killed mid-page
    assert window.open_documents(images[1:]) == 1
    window.controls.max_tokens_spin.setValue(3000)
    killed = []

    def kill_on_the_first_round(_burst):
        if not killed:
            killed.append(window.engines.pid)
            os.kill(window.engines.pid, signal.SIGKILL)

    window.round_shown.connect(kill_on_the_first_round)
    assert read(qtbot, window) == "errored"
    window.round_shown.disconnect(kill_on_the_first_round)
    assert "was killed by SIGKILL" in window.transcript.message_text and model.name in window.transcript.message_text
    assert [r.page.image for r in window.ocr.results] == [str(images[0])]  # the page read is kept
    assert window.document.page_list.states[1] == "errored"

    window.controls.max_tokens_spin.setValue(16)
    assert read(qtbot, window) == "finished"  # Read goes on from the page that failed, on a new child
    assert [r.page.image for r in window.ocr.results] == [str(p) for p in images]
    assert rec.outcomes == ["finished", "errored", "finished"]
    window.shutdown()


def read(qtbot, window) -> str:
    with qtbot.waitSignal(window.run_ended, timeout=240_000) as ended:
        assert window.run()
    return ended.args[0]


def maps_torch(pid: int) -> bool:
    """Whether the process has torch's library mapped (/proc/PID/maps: what it really loaded)."""
    with open(f"/proc/{pid}/maps") as maps:
        return any("libtorch" in line for line in maps)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the child's mapped libraries from /proc (Linux)")
def test_a_chat_child_goes_without_torch_and_the_first_document_starts_one_with_it(tiny_chat, tiny_ocr):
    from app.gui.engine_process import EngineProcess, StopFlag
    from engines.types import Request

    target, _draft = tiny_chat
    model, images = tiny_ocr
    engines = EngineProcess()

    def run(request: Request, path) -> list:
        bursts = []
        assert engines.run(request, str(path), {}, StopFlag(), on_loaded=lambda _m: None,
                           on_prefill=lambda _p: None, on_burst=bursts.append) == "finished"
        return [t for b in bursts for t in b.round.tokens]

    try:
        chat = Request(prompt="the cat", max_tokens=6)
        said = run(chat, target)
        chat_child = engines.pid
        assert len(said) == 6 and not maps_torch(chat_child)

        page = run(Request(kind="ocr", image=str(images[0]), max_tokens=8), model)
        assert page and engines.pid != chat_child and gone(chat_child)  # replaced, and reaped
        assert maps_torch(engines.pid)

        ocr_child = engines.pid
        assert run(chat, target) == said and engines.pid == ocr_child  # kept for chat too
        assert engines.loads == 3
    finally:
        engines.close()
    assert multiprocessing.active_children() == []
