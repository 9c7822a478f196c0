"""Issue 16 in the window: bad parameters and inputs past the model's context get a message and
leave the window usable; nothing is lost."""

from __future__ import annotations

from tests.app.conftest import Recorder

RUN_TIMEOUT_MS = 60_000


def test_max_tokens_past_the_context_is_a_message_and_the_window_stays_usable(qtbot, make_window):
    window = make_window(max_tokens=5000)  # the tiny target's context is 4096 tokens
    rec = Recorder(window)
    window.prompt.setPlainText("the cat")
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as ended:
        assert window.run()
    assert ended.args == ["errored"]
    assert "max_tokens" in window.transcript.message_text and "4096" in window.transcript.message_text
    window.controls.max_tokens_spin.setValue(8)
    window.prompt.setPlainText("the cat")
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS):
        assert window.run()
    assert rec.outcomes == ["errored", "finished"]
