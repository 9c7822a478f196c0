"""Documents become pages (PDF via pypdfium2, multi-frame TIFF, plain images) and a read
document exports as Markdown, plain text or JSON."""

from __future__ import annotations

import json

import pytest
from PIL import Image, ImageDraw

from app.records.documents import (
    DocumentError, Page, PageResult, export_text, pages_of, parse_page_ranges, summarize,
)
from engines.speculative.rounds import Round
from engines.speculative.session import Session
from tests.pdfs import corrupt_pdf, encrypted_pdf, pdf_of_images, pdf_without_pages


def numbered_page(n: int, size=(200, 260)) -> Image.Image:
    """A page whose content says which page it is (a bar n*10 px wide), so rendering order
    and page selection can be checked from the pixels."""
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).rectangle([10, 10, 10 + 10 * n, 40], fill="black")
    return image


def bar_width(path: str) -> int:
    """The black bar's width in tens of pixels of the 200 px page it was drawn on, whatever
    the resolution it was rendered at (so page n reads n)."""
    with Image.open(path) as im:
        g = im.convert("L")
        row = [g.getpixel((x, int(g.height * 25 / 260))) for x in range(g.width)]
    dark = [x for x, v in enumerate(row) if v < 128]
    return round((dark[-1] - dark[0] + 1) / g.width * 200 / 10)


def test_page_ranges():
    assert parse_page_ranges("1-3,7") == [1, 2, 3, 7]
    assert parse_page_ranges(" 2 , 2-3 ") == [2, 3]
    for bad in ("0", "3-1", "x", "1,,2", "-2"):
        with pytest.raises(DocumentError):
            parse_page_ranges(bad)


def test_pdf_pages_render_in_order_and_at_200_dpi(tmp_path):
    pdf = pdf_of_images(tmp_path / "doc.pdf", [numbered_page(n) for n in (1, 2, 3)])
    pages = pages_of([str(pdf)], tmp_path / "cache")
    assert [(p.number, p.count) for p in pages] == [(1, 3), (2, 3), (3, 3)]
    assert [bar_width(p.image) for p in pages] == [1, 2, 3]
    with Image.open(pages[0].image) as im:  # Pillow writes 72 dpi pages: 200 pt -> 200/72*200 px
        assert abs(im.width - round(200 * 200 / 72)) <= 1
    picked = pages_of([str(pdf)], tmp_path / "cache", parse_page_ranges("3,1"))
    assert [p.number for p in picked] == [3, 1] and [bar_width(p.image) for p in picked] == [3, 1]
    assert pages[1].label == "doc.pdf \u00b7 p. 2"


def test_multi_frame_tiff_and_plain_images(tmp_path):
    tiff = tmp_path / "scan.tiff"
    numbered_page(1).save(tiff, save_all=True, append_images=[numbered_page(2)])
    png = tmp_path / "one.png"
    numbered_page(5).save(png)
    pages = pages_of([str(png), str(tiff)], tmp_path / "cache")
    assert [(p.source, p.number) for p in pages] == [(str(png), 1), (str(tiff), 1), (str(tiff), 2)]
    assert pages[0].image == str(png) and pages[0].label == "one.png"
    assert [bar_width(p.image) for p in pages] == [5, 1, 2]


@pytest.mark.parametrize("make, says", [
    (pdf_without_pages, "has no pages"),
    (encrypted_pdf, "is encrypted"),
    (corrupt_pdf, "corrupt or not a PDF"),
])
def test_unreadable_pdfs_are_one_clear_line(tmp_path, make, says):
    pdf = make(tmp_path / "bad.pdf")
    with pytest.raises(DocumentError) as e:
        pages_of([str(pdf)], tmp_path / "cache")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_pages_past_the_end_and_missing_files(tmp_path):
    pdf = pdf_of_images(tmp_path / "two.pdf", [numbered_page(1), numbered_page(2)])
    with pytest.raises(DocumentError, match="has 2 pages; --pages asks for 5"):
        pages_of([str(pdf)], tmp_path / "cache", [1, 5])
    with pytest.raises(DocumentError, match="no such file"):
        pages_of([str(tmp_path / "nope.pdf")], tmp_path / "cache")


def _session(text: str, finish: str, task: str = "table") -> Session:
    tokens = list(range(len(text)))
    rounds = [
        Round(0, 0, 0, tokens[:1], [False], text[:1], [], 0.0, 0.5, 0.5, 0.5, prefill=True),
        Round(1, 3, 2, tokens[1:], [True, True, False][: len(tokens) - 1], text[1:], [True, True, False],
              0.1, 0.2, 0.3, 0.8, finish=finish),
    ]
    return Session(request={"kind": "ocr", "task": task}, model={"name": "glm-ocr", "runtime": "torch"},
                   rounds=rounds)


def test_exports_per_page(tmp_path):
    pages = [Page("/d/a.pdf", 1, 2, "/c/1.png"), Page("/d/a.pdf", 2, 2, "/c/2.png")]
    results = [PageResult(pages[0], _session("| a | b |", "stop")), PageResult(pages[1], _session("xyz", "repetition"))]
    doc = json.loads(export_text(results, "json"))
    assert [p["page"] for p in doc["pages"]] == [1, 2]
    first = doc["pages"][0]
    assert first["text"] == "| a | b |" and first["task"] == "table" and first["model"] == "glm-ocr"
    assert first["runtime"] == "torch" and first["finish"] == "stop"
    assert first["rounds"]["proposed"] == 3 and first["rounds"]["accepted"] == 2 and first["rounds"]["rounds"] == 2
    md = export_text(results, "md")
    assert md.startswith("## a.pdf \u00b7 p. 1\n\n| a | b |\n\n## a.pdf \u00b7 p. 2\n\nxyz")
    assert export_text(results, "txt") == "| a | b |\n\fxyz\n"
    assert export_text(results[:1], "md") == "| a | b |\n"
    summary = summarize(results)
    assert summary.pages == 2 and summary.proposed == 6 and summary.accepted == 4
    assert summary.repeated == ["a.pdf \u00b7 p. 2"] and "stopped repeating" in summary.line()
