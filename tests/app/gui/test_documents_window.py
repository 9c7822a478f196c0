"""Issue 14, documents in the window, on the real GLM-OCR engine with a tiny checkpoint:
a PDF and an image read page by page with a page list, per-page figures and a summary; Stop
keeps the pages read and Read goes on from the next; a multi-frame TIFF; an image pasted from
the clipboard; a region read with the task preset; exports as Markdown / text / JSON; tables
rendered; a run stopped by repetition is marked."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QRect
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication

from app.gui.main_window import MainWindow
from app.settings import AppSettings
from app.gui.views.transcript import TranscriptView
from tests.pdfs import pdf_of_images

MAX_TOKENS = 4  # a tiny random model on a 2-core machine shared by many: keep every page short


@pytest.fixture
def ocr_window(qtbot, tiny_ocr):
    model, _images = tiny_ocr
    window = MainWindow(AppSettings(engine="ocr", ocr_model=str(model), ocr_method="mtp", steps=2, preset=None,
                                    max_tokens=MAX_TOKENS, task="text"), persist=False)
    qtbot.addWidget(window)
    window.show()
    window.ensure_telemetry()
    yield window
    window.shutdown()


@pytest.fixture
def two_page_pdf(tiny_ocr, tmp_path):
    from tests.engines.glm_ocr.checkpoints import test_images

    return pdf_of_images(tmp_path / "two-page.pdf", test_images(2))


def read(qtbot, window, timeout=240_000):
    with qtbot.waitSignal(window.run_ended, timeout=timeout) as ended:
        assert window.run()
    return ended.args[0]


def test_a_pdf_and_an_image_are_read_page_by_page_with_a_summary(qtbot, ocr_window, tiny_ocr, two_page_pdf, tmp_path):
    window, (_model, images) = ocr_window, tiny_ocr
    assert window.open_documents([two_page_pdf, images[0]]) == 3
    labels = [window.document.page_list.item(i).text() for i in range(3)]
    assert labels == ["two-page.pdf \u00b7 p. 1", "two-page.pdf \u00b7 p. 2", images[0].name]
    read_pages = []
    window.page_read.connect(lambda result: read_pages.append(result.page.label))
    assert read(qtbot, window) == "finished"
    assert read_pages == labels  # in order, each once
    assert all(state in ("read", "length") for state in window.document.page_list.states)
    assert window.transcript.message_text.startswith("Read 3 pages")  # the session summary
    text = window.transcript.edit.toPlainText()
    assert all(label in text for label in labels)  # each page under its name

    # per-page figures: choosing a page shows its own rounds in the plots
    first = window.ocr.results[0].session
    window.document.show_page(0)
    assert window.telemetry.series.n == len(first.rounds)
    assert "two-page.pdf \u00b7 p. 1" in window.status.text()

    # exports: one entry per page, Markdown with a heading per page, plain text per page
    window.session_files.save_text("json", tmp_path / "doc.json")
    pages = json.loads((tmp_path / "doc.json").read_text())["pages"]
    assert [(p["page"], p["task"]) for p in pages] == [(1, "text"), (2, "text"), (1, "text")]
    assert pages[0]["text"] == first.text and pages[0]["rounds"]["tokens"] == len(first.tokens)
    window.session_files.save_text("md", tmp_path / "doc.md")
    assert (tmp_path / "doc.md").read_text().startswith("## two-page.pdf \u00b7 p. 1\n\n")
    window.session_files.save_text("txt", tmp_path / "doc.txt")
    assert (tmp_path / "doc.txt").read_text().count("\f") == 2
    window.session_files.copy_markdown()
    assert QApplication.clipboard().text() == (tmp_path / "doc.md").read_text()


def test_stop_keeps_the_pages_read_and_read_goes_on_from_the_next(qtbot, ocr_window, two_page_pdf):
    window = ocr_window
    # pages long enough that Stop, asked for at page 2's first round, lands while it is being
    # read (a 4-token page can be finished by the worker before the window has seen its first
    # round); loops are let run so they do not end the page first
    window.controls.max_tokens_spin.setValue(200)
    window.controls.max_repeat_spin.setValue(window.controls.max_repeat_spin.minimum())
    window.open_documents([two_page_pdf])

    def stop_on_page_two(burst):
        if window.ocr.reading is not None and window.ocr.reading.current[0] == 1:
            window.stop()

    window.round_shown.connect(stop_on_page_two)
    assert read(qtbot, window) == "cancelled"
    window.round_shown.disconnect(stop_on_page_two)
    assert [r.page.number for r in window.ocr.results] == [1]  # page 1 is kept
    assert window.document.page_list.states[1] == "cancelled"
    assert "1 page read are kept" in window.status.text()
    started = []
    window.run_started.connect(lambda run: started.append(run.request.image))
    assert read(qtbot, window) == "finished"
    assert started == [window.document.pages[1].image]  # only the page not read yet
    assert [r.page.number for r in window.ocr.results] == [1, 2]


def test_a_multi_frame_tiff_and_a_pasted_image_become_pages(qtbot, ocr_window, tiny_ocr, tmp_path):
    from PIL import Image

    window, (_model, images) = ocr_window, tiny_ocr
    tiff = tmp_path / "scan.tiff"
    frames = [Image.open(p).convert("RGB") for p in images]
    frames[0].save(tiff, save_all=True, append_images=frames[1:])
    assert window.open_documents([tiff]) == 2
    window.controls.set_engine("chat")
    QApplication.clipboard().setImage(QImage(str(images[0])))
    window.paste()
    assert window.controls.engine == "ocr"  # pasting an image switches to OCR
    assert len(window.document.pages) == 3
    pasted = QImage(window.document.pages[2].image)
    assert pasted.size() == QImage(str(images[0])).size()


def test_a_region_is_read_alone_with_the_chosen_task(qtbot, ocr_window, tiny_ocr):
    window, (_model, images) = ocr_window, tiny_ocr
    window.open_documents([images[0]])
    window.controls.task_combo.setCurrentIndex(window.controls.task_combo.findData("table"))
    window.document.set_region(QRect(10, 5, 60, 40))
    assert window.document.region() == QRect(10, 5, 60, 40)
    started = []
    window.run_started.connect(lambda run: started.append(run.request))
    assert read(qtbot, window) == "finished"
    [request] = started
    assert request.task == "table" and QImage(request.image).size().toTuple() == (60, 40)
    assert window.ocr.results[0].page.image == request.image
    assert window.transcript.edit.toPlainText().startswith("Region of ")
    window.document.set_region(None)  # Region off: whole pages again
    assert window.document.region() is None and window.document.region_image() is None


def test_tables_are_rendered_whichever_way_the_model_writes_them(qtbot):
    view = TranscriptView()
    qtbot.addWidget(view)
    view.add_turn("assistant", "| a | b |\n|---|---|\n| 1 | 2 |\n\n<table><tr><td>x</td></tr></table>")
    assert view.render_button.text() == "Render Markdown"
    view.show_rendered(True)
    assert view.rendered_tables() == 2 and view.pages.currentIndex() == 1
    view.show_rendered(False)
    assert "| a | b |" in view.edit.toPlainText()  # the source view is the text as emitted


@pytest.mark.parametrize("max_repeat", [4, 0])
def test_a_page_that_loops_is_stopped_and_marked_unless_loops_are_let_run(qtbot, tiny_ocr, max_repeat):
    """The tiny random GLM-OCR model falls into a one-token loop on the first page within ~30
    tokens. With "Stop loops at" on (the default, 4 copies) that page stops with
    finish="repetition", is marked in the page list, named in the message and in the summary;
    with it Off the same page runs to max tokens, so the control is what decides."""
    model, images = tiny_ocr
    window = MainWindow(AppSettings(engine="ocr", ocr_model=str(model), ocr_method="mtp", steps=2, preset=None,
                                    max_tokens=120, task="text", max_repeat=max_repeat), persist=False)
    qtbot.addWidget(window)
    window.show()
    assert window.controls.max_repeat == max_repeat
    assert window.controls.max_repeat_spin.text() == ("Off" if max_repeat == 0 else f"{max_repeat} copies")
    window.open_documents(images)
    started = []
    window.run_started.connect(lambda run: started.append(run.request.max_repeat))
    assert read(qtbot, window) == "finished"
    assert started == [max_repeat, max_repeat]  # the control's value reaches every page's request
    first = window.ocr.results[0].session
    page_list = window.document.page_list
    if max_repeat:
        assert first.finish == "repetition" and len(first.tokens) < 120
        assert page_list.states[0] == "repetition" and page_list.item(0).text().startswith("\u27f3")
        assert "repeated itself" in page_list.item(0).toolTip()
        # the summary names the page; choosing the page brings back its own warning
        assert f"stopped repeating: {images[0].name}" in window.status.text()
        window.document.show_page(0)
        message = window.transcript.message_text
        assert f"repeats a block of 1 token on {images[0].name}" in message and "Stop loops at" in message
    else:
        assert first.finish == "length" and len(first.tokens) == 120
        assert page_list.states[0] == "length" and "repeat" not in window.status.text()
    window.shutdown()


def test_the_loop_control_is_remembered_and_off_means_zero(qtbot, tiny_ocr):
    model, _images = tiny_ocr
    window = MainWindow(AppSettings(engine="ocr", ocr_model=str(model), max_repeat=6), persist=False)
    qtbot.addWidget(window)
    spin = window.controls.max_repeat_spin
    assert spin.value() == 6 and window.controls.max_repeat == 6
    spin.setValue(spin.minimum())  # the lowest step is "Off": one copy is not a loop
    assert spin.text() == "Off" and window.controls.max_repeat == 0
    settings = AppSettings()
    window.controls.store_settings(settings)
    assert settings.max_repeat == 0
    spin.setValue(3)
    window.controls.store_settings(settings)
    assert settings.max_repeat == 3
    window.shutdown()
