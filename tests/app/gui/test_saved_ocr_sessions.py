"""A saved OCR session of a region read by the layout stage, reopened in a real window: the
autosave file is the product's own (app.records.sessions.Autosave, the page record a region's
run writes, page_worker's way) holding the rounds of a real run of a tiny GLM-OCR checkpoint on
the region's crop in the regions folder.

Reopened while the window shows chat, it shows in OCR mode (the OCR transcript, the document on
its page), never in the chat transcript; File › Sessions… and the session's heading name the
document page and region it was read from, not the crop's temporary file."""

from __future__ import annotations

import shutil

import pytest

from app.gui.main_window import MainWindow
from app.gui.views.sessions_dialog import SessionsDialog
from tests.app.conftest import chat_settings

pytest.importorskip("torch")


def autosaved_region(tiny_ocr, page: dict):
    """(path, saved session) of a region's run as the window autosaves it."""
    from app.records.bursts import burst_of
    from app.records.sessions import Autosave, load_session, new_autosave_path
    from app.settings import data_dir
    from engines.factory import load_engine
    from engines.speculative.session import Session
    from engines.types import Request, SpecConfig

    model, images = tiny_ocr
    crop = data_dir() / "regions" / "0123456789abcdef" / "page-0001-region-001.png"
    crop.parent.mkdir(parents=True)
    shutil.copy(images[1], crop)
    request = Request(kind="ocr", image=str(crop), max_tokens=12, spec=SpecConfig(method="mtp", steps=2))
    session = Session(request=request.to_dict(), model={"name": "tiny GLM-OCR", "path": str(model)})
    path = new_autosave_path("ocr")
    autosave = Autosave(path, session, page=page)
    for rnd in load_engine("ocr", str(model)).generate(request):
        session.add(rnd)
        autosave.write_burst(burst_of(rnd))
    autosave.write_end("finished")
    autosave.close()
    return path, load_session(path)


@pytest.fixture
def chat_window(qtbot, tiny_chat):
    window = MainWindow(chat_settings(tiny_chat), persist=False)
    qtbot.addWidget(window)
    window.show()
    yield window
    window.shutdown()


def test_an_ocr_session_reopened_in_chat_mode_shows_in_ocr_mode(chat_window, tiny_ocr):
    _model, images = tiny_ocr
    page = {"source": str(images[0]), "number": 1, "count": 1, "region": {"index": 1, "label": "doc_title"}}
    path, saved = autosaved_region(tiny_ocr, page)
    assert saved.session.text and chat_window.mode == "chat"

    chat_window.session_files.open_session(path)
    assert chat_window.mode == "ocr" and chat_window.controls.engine == "ocr"
    assert chat_window.transcript is chat_window.ocr.transcript
    assert chat_window.ocr.transcript.response_text() == saved.session.text
    assert chat_window.chat.transcript.edit.toPlainText() == ""  # nothing of it in the conversation
    assert [p.source for p in chat_window.document.pages] == [str(images[0])]  # its page, not its crop
    assert chat_window.document.isVisible()
    heading = chat_window.ocr.transcript.edit.toPlainText()
    assert f"{images[0].name} \u00b7 region 2 doc_title" in heading and "region-001" not in heading


def test_the_sessions_list_names_a_region_s_document_page_not_its_crop(chat_window, tiny_ocr, tmp_path):
    page = {"source": str(tmp_path / "scan.pdf"), "number": 2, "count": 3, "region": {"index": 0, "label": "table"}}
    autosaved_region(tiny_ocr, page)
    dialog = SessionsDialog(chat_window)
    [item] = [dialog.tree.topLevelItem(i) for i in range(dialog.tree.topLevelItemCount())]
    assert item.text(1) == "ocr"
    assert item.text(5) == "scan.pdf \u00b7 p. 2 \u00b7 region 1 table"
    dialog.close()
