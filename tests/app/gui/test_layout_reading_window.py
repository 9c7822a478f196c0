"""A page read by region in the window (issue 48, "the window"), on the real engines in the
window's engine process: a tiny trained GLM-OCR checkpoint and a tiny random PP-DocLayoutV3
checkpoint, both in the real formats, installed through the model manager from the loopback hub
as a user gets them (`models get`), and a page on which the layout finds a title and a formula.

Shown: the boxes appear with their states (waiting / reading / done) while the regions are read
together; clicking a box shows that region's rounds in the transcript and the speculation strip;
the batch's rows and aggregate speed; the Markdown view is engines.glm_ocr.document.markdown_pages'
output for the run (and the engine process's own); each region's rounds are autosaved; Read
together reaches the page job; Copy as Markdown, Save Text As and the summaries hold the pages read
by region (beside one read whole) as the CLI gives them; Stop ends the page mid-read and the next
Read reads it again from its start, while a page whose regions had all ended when Stop came stays
read; without the layout model pages are read whole, the window says so in one line and offers the
download, after which the same Read goes by region; Layout off reads whole pages. On macOS the
layout model is converted to Core ML after its download, by the same job as GLM-OCR, and a
converted layout model that runs on PyTorch instead is said once (Linux's fallback stands in)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.gui.main_window import MainWindow
from app.settings import AppSettings
from tests.app.engine_loaders import load_refusing_qt
from tests.hub.fixtures import hub, hub_env  # noqa: F401  (pytest fixtures)

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tests.engines.glm_ocr.checkpoints import trained_glm_ocr
    from tests.engines.glm_ocr.layout_checkpoints import layout_page, make_tiny_layout

    root = tmp_path_factory.mktemp("layout-window")
    model, _images = trained_glm_ocr()
    return {"glm-ocr": model, "layout": make_tiny_layout(root / "layout"), "page": layout_page(root / "page.png")
            and root / "page.png"}


def install(hub, checkpoints, *ids):
    """`models get` through the model manager, from the loopback hub at the catalog's repo ids."""
    from app.models import catalog, download

    for model_id in ids:
        hub.serve_repo(catalog.find(model_id).repo_id, checkpoints["layout" if model_id != "glm-ocr" else model_id])
        download.download(model_id)


def window_for(qtbot, max_tokens=24, loader=load_refusing_qt, **overrides):
    settings = dict(engine="ocr", ocr_model="", ocr_method="mtp", steps=2, preset=None, max_tokens=max_tokens,
                    task="text")
    window = MainWindow(AppSettings(**(settings | overrides)), engine_loader=loader, persist=False)
    qtbot.addWidget(window)
    window.show()
    window.ensure_telemetry()
    return window


def read(qtbot, window, timeout=240_000):
    with qtbot.waitSignal(window.run_ended, timeout=timeout) as ended:
        assert window.run()
    return ended.args[0]


def autosaved(home):
    files = sorted((home / "data" / "sessions").glob("*-ocr*.ndjson"))
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in files]


def test_a_page_is_read_by_region_with_its_boxes_rounds_batch_and_markdown(qtbot, hub, hub_env, checkpoints,
                                                                            specscope_home, tmp_path):
    """One engine process for what a document read by region shows (its start is most of this
    test's time): the page's boxes, rounds, batch, Markdown and autosaves; a second page read
    one region at a time (Read together at 1); a third read whole; the exports and the summary
    of the three; then Layout off."""
    from engines.glm_ocr.document import markdown_pages

    install(hub, checkpoints, "glm-ocr", "pp-doclayout-v3")
    window = window_for(qtbot)
    run = window.document_run
    assert window.model_offer.isHidden()  # nothing is missing
    window.open_documents([checkpoints["page"]])
    events = []
    run.regions_found.connect(lambda found: events.append(("found", [r.label for r in found.regions])))
    run.region_changed.connect(lambda index, state: events.append((index, state)))
    boxes_when_reading = []
    run.region_changed.connect(lambda index, state: state == "reading" and boxes_when_reading.append(
        {i: box.isVisible() for i, box in run.overlay.boxes.items()}))
    assert read(qtbot, window) == "finished"

    # the boxes came first, then each region was read: waiting -> reading -> done, live
    assert events[0] == ("found", ["doc_title", "display_formula"])
    for index in (0, 1):
        assert [state for i, state in events[1:] if i == index] == ["reading", "done"]
    assert boxes_when_reading and all(shown == {0: True, 1: True} for shown in boxes_when_reading)
    assert [run.overlay.state_colour(i) for i in (0, 1)] == ["#1f9d55", "#1f9d55"]
    [page] = window.ocr.layout_pages
    assert [rr.region.label for rr in page.regions] == ["doc_title", "display_formula"]
    assert window.document.page_list.states == [] or window.document.page_list.states[0] in ("read", "length")
    # read together: the batch's steps had both regions as rows; its speed is drawn
    assert max(run.batch.rows) == 2 and run.batch.last_tok_s() > 0
    assert sum(s.stats().proposed for s in page.sessions) > 0  # the MTP layer drafted

    # the Markdown view: markdown_pages' output for this run, and the engine process's own
    expected = markdown_pages([page.regions])[0]
    assert expected == run.page_markdown[0] and run.markdown.markdown == expected.rstrip() + "\n"
    assert expected.startswith("# ") and "$$" in expected
    assert run.markdown.isVisible() and run.markdown.browser.toPlainText().strip()

    # clicking the formula's box shows its rounds in the transcript and the speculation strip
    formula = page.regions[1].session
    title, box = run.overlay.boxes[0].rect(), run.overlay.boxes[1].rect()
    where = QPointF(box.center().x(), (box.top() + title.top()) / 2)  # the formula's box holds most of the title's
    assert box.contains(where) and not title.contains(where)
    view = window.document.view
    with qtbot.waitSignal(run.region_selected, timeout=5000) as selected:
        QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.mapFromScene(where))
    assert selected.args == [1]
    assert window.transcript.response_text() == formula.text
    assert window.telemetry.series.n == len(formula.rounds)
    assert list(window.telemetry.series.column("accepted")) == [r.accepted for r in formula.rounds]
    assert run.overlay.states.selected == 1

    # every region's rounds are autosaved, one file a region
    saved = autosaved(specscope_home)
    assert sorted(len([e for e in f if e.get("event") == "round"]) for f in saved) == sorted(
        len(s.rounds) for s in page.sessions)
    assert all(f[-1]["event"] == "end" and f[-1]["outcome"] == "finished" for f in saved)

    a_page_one_region_at_a_time_then_one_read_whole_are_exported_and_summed_up(qtbot, window, checkpoints, tmp_path)

    # Layout off: every page is read whole again
    assert window.settings.ocr_layout == "off"
    assert read(qtbot, window) == "finished"
    assert len(window.ocr.results) == 3 and window.ocr.layout_pages == []
    window.shutdown()


def test_the_markdown_pane_shows_the_document_as_copy_as_markdown_gives_it(qtbot, hub, hub_env, checkpoints,
                                                                            tmp_path):
    """The Markdown pane and Copy as Markdown (`specscope ocr --format md`) are one formatter: a
    document of two pages read by region shows each page under its heading, once read and while
    the second page is read."""
    from app.records.documents import LayoutPage, export_document

    install(hub, checkpoints, "glm-ocr", "pp-doclayout-v3")
    window = window_for(qtbot, max_tokens=8)
    run = window.document_run
    second = tmp_path / "second.png"
    shutil.copy(checkpoints["page"], second)
    window.open_documents([checkpoints["page"], second])
    shown = []  # (the page being read, or None between pages; the pane's source), at each change
    run.markdown_changed.connect(lambda md: shown.append((run.index if run.worker else None, md)))
    assert read(qtbot, window) == "finished"

    pages = window.ocr.pages_read()
    assert [type(p) for p in pages] == [LayoutPage, LayoutPage]
    markdown = export_document(pages, "md")
    assert run.markdown.markdown == markdown
    assert markdown.startswith("## page.png\n\n# ") and "\n\n## second.png\n\n# " in markdown
    first = markdown.split("\n\n## second.png")[0]
    during = [md for index, md in shown if index == 1]
    assert during and all(md.startswith(first + "\n\n## second.png\n\n") for md in during)
    window.session_files.copy_markdown()
    assert QApplication.clipboard().text() == run.markdown.markdown
    window.shutdown()


def test_a_region_session_reopens_on_the_page_it_read_not_on_its_crop(qtbot, hub, hub_env, checkpoints,
                                                                      specscope_home, tmp_path):
    """A region's autosave names the document page it was read from: reopened in the window that
    read it, the document keeps its pages and shows that page; reopened in a new window, the
    document is opened again (a PDF's pages, not the region's crop as a page of its own)."""
    from PIL import Image

    from app.records.sessions import load_session

    install(hub, checkpoints, "glm-ocr", "pp-doclayout-v3")
    pdf = tmp_path / "two pages.pdf"
    page = Image.open(checkpoints["page"]).convert("RGB")
    page.save(pdf, save_all=True, append_images=[page], resolution=200)  # rendered back at its own size
    window = window_for(qtbot, max_tokens=8)
    window.open_documents([pdf])
    assert read(qtbot, window) == "finished"
    pages = [(p.source, p.number, p.count) for p in window.document.pages]
    assert pages == [(str(pdf), 1, 2), (str(pdf), 2, 2)]
    [last] = [p for p in window.ocr.layout_pages if p.page.number == 2]
    region = last.regions[-1]
    [path] = [f for f in (specscope_home / "data" / "sessions").glob("*-ocr*.ndjson")
              if load_session(f).session.request["image"] == region.crop]

    window.document.show_page(0)
    window.session_files.open_session(path)
    assert [(p.source, p.number, p.count) for p in window.document.pages] == pages
    assert window.document.index == 1 and window.transcript.response_text() == region.session.text
    window.shutdown()

    fresh = window_for(qtbot)
    fresh.session_files.open_session(path)
    assert [(p.source, p.number, p.count) for p in fresh.document.pages] == pages
    assert fresh.document.index == 1 and fresh.transcript.response_text() == region.session.text
    fresh.shutdown()
    assert load_session(path).page == {"source": str(pdf), "number": 2, "count": 2,
                                       "region": {"index": region.region.index, "label": region.region.label}}


def a_page_one_region_at_a_time_then_one_read_whole_are_exported_and_summed_up(qtbot, window, checkpoints, tmp_path):
    """Read together at 1 (the CLI's --max-batch 1) reaches the page job: each batch step reads one
    region. Edit › Copy as Markdown and Save Text As hold the pages read by region, through the
    CLI's own formatter (what `specscope ocr --format` prints), a page read whole beside them; the
    page list, the status bar and the document's summary give each page's regions read, tokens,
    tok/s, acceptance and time."""
    from app.records.documents import export_document, summarize_pages
    from app.records.sessions import list_sessions, load_session

    run = window.document_run
    second, third = tmp_path / "second.png", tmp_path / "third.png"
    for copy in (second, third):
        shutil.copy(checkpoints["page"], copy)
    window.open_documents([second])
    window.controls.batch_spin.setValue(1)
    window.controls.max_tokens_spin.setValue(8)
    jobs = []
    window.run_started.connect(lambda spec: jobs.append(getattr(spec, "job", None)))
    assert read(qtbot, window) == "finished"  # the page not read yet
    assert [job.max_batch for job in jobs] == [1] and run.batch.rows and max(run.batch.rows) == 1
    pages = window.ocr.layout_pages
    assert [p.page.source for p in pages] == [str(checkpoints["page"]), str(second)]

    # the document's summary and each page's figures, from its regions' rounds and its batch's time
    summary = summarize_pages(pages)
    assert summary.regions == 4 and summary.tokens == sum(len(s.tokens) for p in pages for s in p.sessions) > 0
    assert 0 < pages[1].read_s < pages[1].layout_s + pages[1].read_s and summary.decode_tok_s > 0
    assert window.transcript.message_text == window.status.text() == f"Read {summary.line()}"
    assert summary.line().startswith("2 pages \u00b7 4 regions \u00b7 ")
    tip = window.document.page_list.item(1).toolTip()
    assert "2 regions read \u00b7 " in tip and " tok/s \u00b7 acceptance " in tip
    window.document.show_page(0)
    assert window.status.text().startswith("page.png by region: 2 regions read \u00b7 ")

    # a page added and read whole (Layout off) joins them, in the document's order
    window.open_documents([third])
    window.document.layout_button.click()
    assert read(qtbot, window) == "finished"
    assert jobs[1:] == [None]  # (a page read whole is a run, not a page job)
    assert load_session(list_sessions()[0].path).page == {"source": str(third), "number": 1, "count": 1}
    document = window.ocr.pages_read()
    assert [p.page.source for p in document] == [str(checkpoints["page"]), str(second), str(third)]
    assert window.transcript.message_text == f"Read {summarize_pages(document).line()}"
    assert window.transcript.message_text.startswith("Read 3 pages \u00b7 4 regions \u00b7 ")

    # the exports: what `specscope ocr --format md|txt|json` prints for these pages
    window.session_files.copy_markdown()
    markdown = QApplication.clipboard().text()
    assert markdown == export_document(document, "md") == run.markdown.markdown  # (the page read whole in the pane)
    assert markdown.startswith(f"## page.png\n\n{run.page_markdown[0].strip()}\n\n## second.png\n\n# ")
    assert markdown.endswith(f"## third.png\n\n{document[2].session.text.strip()}\n")
    window.session_files.save_text("txt", tmp_path / "doc.txt")
    text = (tmp_path / "doc.txt").read_text()
    assert text == export_document(document, "txt") and text.count("\f") == 2
    assert text.startswith(pages[0].regions[0].text.strip() + "\n\n" + pages[0].regions[1].text.strip())
    window.session_files.save_text("json", tmp_path / "doc.json")
    entries = json.loads((tmp_path / "doc.json").read_text())["pages"]
    assert [len(e.get("regions", [])) for e in entries] == [2, 2, 0] and entries[2]["rounds"]["tokens"] > 0


@pytest.mark.slow  # (the quick suite's time; a document's stop stays quick: tests/app/gui/test_documents_window.py)
def test_stop_ends_a_page_mid_read_and_keeps_what_was_read(qtbot, hub, hub_env, checkpoints, specscope_home):
    install(hub, checkpoints, "glm-ocr", "pp-doclayout-v3")
    window = window_for(qtbot, max_tokens=400, max_repeat=0)
    run = window.document_run
    window.open_documents([checkpoints["page"]])
    stopped = []

    def stop_at_the_first_round(index, state):
        if state == "reading" and not stopped:
            stopped.append(index)
            window.stop()

    run.region_changed.connect(stop_at_the_first_round)
    assert read(qtbot, window) == "cancelled"
    states = run.boxes[0].states
    assert "stopped" in states.values() and not {"reading", "waiting"} & set(states.values())
    assert window.document.page_list.states[0] == "cancelled" and window.ocr.layout_pages == []
    assert "read are kept" in window.status.text()
    # what was received is kept: the rounds shown, and autosaved with the page's end
    received = {i: len(b) for (p, i), b in run.bursts.items() if p == 0}
    assert sum(received.values()) > 0 and sum(received.values()) < 2 * 400
    saved = autosaved(specscope_home)
    assert sorted(len([e for e in f if e.get("event") == "round"]) for f in saved) == sorted(received.values())
    assert all(f[-1]["event"] == "end" and f[-1]["outcome"] == "cancelled" for f in saved
               if any(e.get("finish") == "cancelled" for e in f))

    # the next Read reads the page again from its start: its boxes and the text show this reading
    # alone, none of the stopped one's rounds before it
    run.region_changed.disconnect(stop_at_the_first_round)
    window.controls.max_tokens_spin.setValue(8)
    assert read(qtbot, window) == "finished"
    [page] = window.ocr.layout_pages
    assert window.document.page_list.states[0] in ("read", "length")
    assert {i: len(b) for (p, i), b in run.bursts.items() if p == 0} == {
        rr.region.index: len(rr.session.rounds) for rr in page.regions}
    run.select_region(0)
    assert window.transcript.response_text() == page.regions[0].session.text
    window.shutdown()


@pytest.mark.slow  # (the quick suite's time)
def test_a_stop_after_a_pages_regions_have_all_ended_keeps_the_page_read(qtbot, hub, hub_env, checkpoints, tmp_path):
    """As a whole page whose last round ended on its own is kept when Stop comes after it, a page
    whose regions have all ended is read, not stopped: the next Read goes on from the next page."""
    from tests.app.engine_loaders import load_with_a_stop_after_a_pages_last_step

    install(hub, checkpoints, "glm-ocr", "pp-doclayout-v3")
    window = window_for(qtbot, max_tokens=8, loader=load_with_a_stop_after_a_pages_last_step)
    run = window.document_run
    second = tmp_path / "second.png"
    shutil.copy(checkpoints["page"], second)
    window.open_documents([checkpoints["page"], second])

    def stop_once_every_region_has_ended(_index, _state):
        states = run.boxes[run.index].states.values()
        if run.index == 0 and not {"reading", "waiting"} & set(states):
            window.stop()

    run.region_changed.connect(stop_once_every_region_has_ended)
    assert read(qtbot, window) == "cancelled"  # (the engine process saw the Stop: the page job was cancelled)
    run.region_changed.disconnect(stop_once_every_region_has_ended)
    assert set(run.boxes[0].states.values()) == {"done"}
    assert window.document.page_list.states[0] in ("read", "length")
    assert [p.page.source for p in window.ocr.layout_pages] == [str(checkpoints["page"])]
    assert window.status.text().startswith("Stopped; 1 page read are kept")
    started = []
    window.run_started.connect(lambda spec: started.append(spec.page.source))
    assert read(qtbot, window) == "finished"
    assert started == [str(second)]
    window.shutdown()


def test_without_the_layout_model_pages_are_read_whole_said_and_it_is_offered(qtbot, hub, hub_env, checkpoints):
    install(hub, checkpoints, "glm-ocr")
    window = window_for(qtbot, max_tokens=8)
    offer = window.model_offer
    assert offer.isVisible() and offer.model_id == "pp-doclayout-v3"
    assert offer.button.text() == "Download PP-DocLayoutV3" and "read whole meanwhile" in offer.text.text()
    window.open_documents([checkpoints["page"]])
    assert read(qtbot, window) == "finished"
    assert len(window.ocr.results) == 1 and window.ocr.layout_pages == [] and not window.document_run.overlay.boxes
    message = window.transcript.message_text
    assert "The layout model pp-doclayout-v3 is not installed: pages are read whole meanwhile" in message
    assert message.count("\n") == 0

    # the offer's button gets it through the model manager; the next Read goes by region
    from app.models import catalog

    hub.serve_repo(catalog.find("pp-doclayout-v3").repo_id, checkpoints["layout"])
    with qtbot.waitSignal(window.model_jobs.finished, timeout=120_000):
        offer.button.click()
    qtbot.waitUntil(lambda: offer.isHidden(), timeout=5000)
    assert read(qtbot, window) == "finished"
    assert [rr.region.label for rr in window.ocr.layout_pages[0].regions] == ["doc_title", "display_formula"]
    assert not window.transcript.message_text
    window.shutdown()


def test_on_macos_the_layout_model_converts_after_its_download_and_pytorch_instead_is_said_once(
        qtbot, hub, hub_env, checkpoints, monkeypatch):
    """The Models dialog gets PP-DocLayoutV3 as on macOS: the download, then the Core ML conversion
    (app/models/convert_job.py, with its progress), into the models folder, which Layout then uses
    (store.resolve). Where Core ML does not load it the layout stage runs on PyTorch from the
    checkpoint it was converted from, and the window says so once, above the text, as `specscope
    ocr` does on stderr. Here the window's process is told it is macOS (sys.platform, as the models
    tests do) and the engine process -- a fresh interpreter, on Linux -- is where Core ML cannot
    load the package: that fallback is the one shown. GLM-OCR is chosen by its folder, so that its
    own conversion (minutes, tests/app/models/test_convert_job.py) is not asked for."""
    pytest.importorskip("coremltools")  # imported before sys.platform says darwin: it reads mac_ver() then
    from app.models import catalog, convert_job, store

    install(hub, checkpoints, "glm-ocr")
    window = window_for(qtbot, max_tokens=8, ocr_model=str(store.resolve("glm-ocr", "ocr")))
    monkeypatch.setattr(sys, "platform", "darwin")
    entry = catalog.find("pp-doclayout-v3")
    hub.serve_repo(entry.repo_id, checkpoints["layout"])
    dialog = window.open_models_dialog()
    dialog.select("pp-doclayout-v3")
    progress = []
    window.model_jobs.progressed.connect(lambda p: progress.append((p.phase, p.text)))
    with qtbot.waitSignal(window.model_jobs.finished, timeout=300_000) as got:
        assert dialog.download_selected()
    assert got.args == ["pp-doclayout-v3", str(store.coreml_dir(entry))]
    assert convert_job.is_converted(entry) and not convert_job.conversion_needed(entry)
    phases = [phase for phase, _text in progress]
    assert phases == sorted(phases, key=["download", "convert"].index) and "convert" in phases
    assert ("convert", "Core ML: tracing the model (0 of 1 packages)") in progress
    assert dialog.message.text() == f"pp-doclayout-v3 is ready: {store.coreml_dir(entry)}"
    dialog.close()

    run = window.document_run
    assert run.layout_for_next_page() == str(store.coreml_dir(entry))
    window.open_documents([checkpoints["page"], checkpoints["page"]])
    said = []
    run.regions_found.connect(lambda found: said.append((found.runtime_note, window.transcript.message_text)))
    assert read(qtbot, window) == "finished"
    [(note, first), (again, second)] = said
    assert note.startswith("the layout model runs on PyTorch: the Core ML runtime needs macOS 15") and again == note
    assert first == note[0].upper() + note[1:] + "."
    assert second == ""  # once: the second page, on the same fallback, does not say it again
    assert [[rr.region.label for rr in page.regions] for page in window.ocr.layout_pages] == [
        ["doc_title", "display_formula"]] * 2  # the checkpoint's regions, on PyTorch
    window.shutdown()


@pytest.mark.slow  # (the quick suite's time; a child killed mid-document stays quick: tests/app/gui/test_engine_process.py)
def test_an_engine_process_dying_mid_page_is_one_line_and_keeps_what_was_received(qtbot, hub, hub_env, checkpoints,
                                                                                    specscope_home):
    from tests.app.engine_loaders import load_dying_mid_page

    install(hub, checkpoints, "glm-ocr", "pp-doclayout-v3")
    window = window_for(qtbot, max_tokens=200, loader=load_dying_mid_page, max_repeat=0)
    window.open_documents([checkpoints["page"]])
    assert read(qtbot, window) == "errored"
    message = window.transcript.message_text
    assert "was killed by SIGKILL" in message and "What was received is kept" in message
    assert window.document.page_list.states[0] == "errored" and window.status.text() == "Error"
    run = window.document_run
    assert set(run.boxes[0].states.values()) <= {"stopped", "done"}
    received = sorted(len(b) for (p, _i), b in run.bursts.items() if p == 0)
    assert received and sum(received) >= 2  # the first steps' rounds arrived and stay on screen
    saved = autosaved(specscope_home)
    assert sorted(len([e for e in f if e.get("event") == "round"]) for f in saved) == received
    assert all(f[-1]["event"] == "end" and f[-1]["outcome"] == "errored" for f in saved)
    window.shutdown()
