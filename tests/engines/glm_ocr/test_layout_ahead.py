"""A document's next page's layout found while this page's regions are read (engines/glm_ocr/
document.LayoutAhead, `specscope ocr --layout-ahead`), on tiny PP-DocLayoutV3 and GLM-OCR
checkpoints in the real formats: the same document as the layouts found in turn; a page whose
layout fails raises at that page, after the pages before it were read, and nothing after it is
found; a stop or an exception leaves no worker thread behind."""

from __future__ import annotations

import json
import threading

import pytest

from app.cli.main import main
from engines.types import EngineError, Request
from tests.engines.glm_ocr.layout_checkpoints import layout_page

torch = pytest.importorskip("torch")

from engines.glm_ocr.batch import OcrBatch  # noqa: E402  (torch)
from engines.glm_ocr.document import LAYOUT_THREAD, LayoutAhead, read_regions_together  # noqa: E402
from engines.glm_ocr.engine import OcrEngine  # noqa: E402
from engines.glm_ocr.layout import LayoutModel  # noqa: E402

# Pages the "regions" layout finds 2, 3 and 1 regions on.
SIZES = [(600, 800), (800, 600), (500, 700)]


@pytest.fixture(scope="module")
def engine(tiny_glm_ocr):
    torch.set_num_threads(1)
    return OcrEngine.load(tiny_glm_ocr, runtime="torch", cache_length=320)


@pytest.fixture(scope="module")
def layout(layouts):
    return LayoutModel.load(layouts["regions"])


@pytest.fixture
def pages(tmp_path):
    paths = [tmp_path / f"page-{i + 1}.png" for i in range(len(SIZES))]
    for path, size in zip(paths, SIZES):
        layout_page(path, size)
    return [str(p) for p in paths]


def layout_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(LAYOUT_THREAD)]


def read_page(engine, found, number: int, crops, should_stop=None):
    request = Request(kind="ocr", image="", max_tokens=4)
    return read_regions_together(found.image, number, found.regions, request, crops, OcrBatch(engine), should_stop)


def test_the_document_is_the_same_with_the_layout_found_ahead(tiny_glm_ocr, layouts, tmp_path, capsys, monkeypatch):
    """Three pages of 2, 3 and 1 regions, read with the next page's layout found ahead and in
    turn: the same JSON but for the clocks, and each page's layout line said at its page."""
    from tests.pdfs import pdf_of_images

    monkeypatch.setenv("SPECSCOPE_HOME", str(tmp_path / "home"))
    pdf = pdf_of_images(tmp_path / "three.pdf", [layout_page(size=size) for size in SIZES])
    runs = {}
    for ahead in ("on", "off"):
        rc = main(["ocr", str(pdf), "--model", str(tiny_glm_ocr), "--layout", "on", "--layout-model",
                   str(layouts["regions"]), "--runtime", "torch", "--max-tokens", "4", "--spec", "mtp", "--format",
                   "json", "--layout-ahead", ahead])
        out, err = capsys.readouterr()
        assert rc == 0, err
        runs[ahead] = json.loads(out)["pages"], err
    for entry in (page for pages, _ in runs.values() for page in pages):
        for region in entry["regions"]:
            for clock in ("decode_tok_s", "wall_s"):
                region["rounds"].pop(clock)
    assert runs["on"][0] == runs["off"][0]
    assert [len(p["regions"]) for p in runs["on"][0]] == [2, 3, 1]
    assert all(r["rounds"]["tokens"] == 4 for p in runs["on"][0] for r in p["regions"])
    for _, err in runs.values():  # the layout line of page n after page n - 1's regions, before its own
        lines = [line for line in err.splitlines() if line.startswith("[three.pdf")]
        said = [line.split(" \u00b7 ")[2].split(":")[0].split(" ")[0] for line in lines]
        assert said == ["layout", "region", "region", "layout", "region", "region", "region", "layout", "region"]
        assert "[document: 3 pages \u00b7 6 regions \u00b7 24 tokens in " in err  # the window's summary (summarize_pages)
    assert not layout_threads()


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "in turn"])
def test_a_pages_layout_error_is_raised_at_that_page(engine, layout, pages, tmp_path, ahead):
    """Page 2 cannot be read (its file is not an image): page 1 is read in full, taking page 2
    raises its error (found ahead: while page 1 was read, held until page 2's turn), and page 3
    is never given."""
    with open(pages[1], "wb") as broken:
        broken.write(b"not an image")
    with LayoutAhead(layout, pages, ahead) as layouts:
        taken = iter(layouts)
        first = read_page(engine, next(taken), 1, tmp_path / "crops")
        with pytest.raises(EngineError, match="page-2.png is not an image"):
            next(taken)
        with pytest.raises(StopIteration):
            next(taken)
    assert [len(rr.session.tokens) for rr in first] == [4, 4]
    assert all(rr.session.finish == "length" for rr in first)
    assert not layout_threads()


def test_a_stop_or_an_exception_leaves_no_layout_thread(engine, layout, pages, tmp_path):
    """Stopped mid-page (should_stop after the batch's first step), the reading ends at that page
    and leaving LayoutAhead ends its worker, the next page's layout in flight or done; an
    exception (a second Ctrl-C: KeyboardInterrupt) does the same."""
    with LayoutAhead(layout, pages, ahead=True) as layouts:
        read = []
        for number, found in enumerate(layouts, 1):
            steps = []
            regions = read_regions_together(found.image, number, found.regions,
                                            Request(kind="ocr", image="", max_tokens=4), tmp_path / "crops",
                                            OcrBatch(engine), lambda: len(steps) >= 1, on_step=steps.append)
            read.append(regions)
            if any(rr.session.finish == "cancelled" for rr in regions):
                break
        assert layout_threads()  # the worker, found page 2's layout or finding it
    assert len(read) == 1 and all(rr.session.finish == "cancelled" for rr in read[0])
    assert not layout_threads()

    with pytest.raises(KeyboardInterrupt):
        with LayoutAhead(layout, pages, ahead=True) as layouts:
            next(iter(layouts))
            assert layout_threads()
            raise KeyboardInterrupt
    assert not layout_threads()
