"""Connect to Server…: the dialog, and the window running on a real `specscope serve`
(uvicorn on 127.0.0.1) with the same rounds as the local engine."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QDialog

from app.serve.protocol import ServedModel
from app.serve.server import ServeConfig, Served, build_app, start_in_thread
from app.gui.views.server_dialog import ServerDialog
from engines.types import Request, SpecConfig
from tests.app.conftest import Recorder
from tests.app.gui.test_chat_window import RUN_TIMEOUT_MS, run_and_wait
from tests.engines.chat import load_chat


def test_the_dialog_names_a_server_model_and_refuses_a_bad_url(qtbot):
    dialog = ServerDialog()
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.url_edit.setText("ftp://example")
    dialog.accept()
    assert dialog.isVisible() and dialog.problem.isVisible() and "http://" in dialog.problem.text()
    dialog.url_edit.setText("http://127.0.0.1:9/v1/")
    dialog.model_edit.setText("tiny")
    dialog.key_edit.setText("sesame")
    dialog.accept()
    assert dialog.result() == QDialog.DialogCode.Accepted
    assert dialog.model_ref() == "http://127.0.0.1:9#tiny" and dialog.api_key() == "sesame"


@pytest.fixture
def server(tiny_chat):

    engine = load_chat(str(tiny_chat[0]))
    running = start_in_thread(build_app(ServeConfig(), [Served(ServedModel("tiny", "chat"), engine)]))
    yield running, engine
    running.stop()


def test_the_window_runs_on_a_server_with_the_local_engines_rounds(qtbot, make_window, server):
    running, engine = server
    window = make_window(max_tokens=32, chat_method="ngram")
    window.controls.use_server(f"{running.url}#tiny", None)
    rec = Recorder(window)
    window.chat.prompt.setPlainText("the cat the cat the cat")
    run_and_wait(qtbot, window)
    assert rec.outcomes == ["finished"]
    local = list(engine.generate(Request(kind="chat", prompt="the cat the cat the cat", system="be brief",
                                         max_tokens=32, spec=SpecConfig(method="ngram", steps=3))))
    assert [(r.tokens, r.proposed, r.accepted) for r in rec.rounds] == [(r.tokens, r.proposed, r.accepted) for r in local]
    assert window.transcript.response_text() == "".join(r.text for r in local)
    assert sum(b.draft_chars for b in rec.bursts) > 0  # accepted drafts are shown as such


def test_an_unreachable_server_is_a_message_not_a_dead_end(qtbot, make_window):
    window = make_window(max_tokens=8, chat_method="ngram")
    window.controls.use_server("http://127.0.0.1:9#tiny", None)  # port 9: nothing listens
    window.chat.prompt.setPlainText("the cat")
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as ended:
        assert window.run()
    assert ended.args == ["errored"]
    assert "cannot reach" in window.transcript.message_text
    assert window.controls.run_button.isEnabled() and not window.running


def test_the_window_shows_the_servers_batch_while_connected(qtbot, make_window, server):
    """Connected to a server, the window shows its batch beside the request: requests running,
    step latency, tokens per second -- read from the server's /metrics once a second by a
    background thread; back on a local model the strip goes away."""
    import openai

    running, _ = server
    window = make_window(max_tokens=8, chat_method="ngram")
    assert window.server_load.isHidden()
    window.server_watch.timer.setInterval(200)
    window.controls.use_server(f"{running.url}#tiny", None)
    assert not window.server_load.isHidden()
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
    streams = [client.chat.completions.create(model="tiny", stream=True, max_tokens=3000,
                                              messages=[{"role": "user", "content": f"the cat {i}"}]) for i in range(2)]
    for s in streams:
        next(iter(s))
    try:
        def two_running(load):
            return load.running == 2 and (load.tokens_per_s or 0) > 0

        # the view's slot was connected first, so the label shows these figures when this returns
        with qtbot.waitSignal(window.server_watch.load_measured, timeout=30_000, check_params_cb=two_running):
            pass
        text = window.server_load.label.text()
        assert "2 running" in text and "tok/s" in text and "step" in text
        assert len(window.server_load.history) >= 1
    finally:
        for s in streams:
            s.close()
    window.controls.set_model_path("")
    assert window.server_load.isHidden() and not window.server_watch.timer.isActive()
