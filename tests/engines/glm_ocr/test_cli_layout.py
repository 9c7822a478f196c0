"""`specscope ocr --layout`: a page's regions found by a tiny PP-DocLayoutV3 checkpoint and read by
a tiny GLM-OCR checkpoint (both in the real formats, loaded by the product's own loaders), the
document as Markdown and JSON, and each kind of bad input as one line."""

from __future__ import annotations

import json

import pytest

from app.cli.main import main
from tests.engines.glm_ocr.layout_checkpoints import layout_page
from tests.hub.fixtures import hub, hub_env  # noqa: F401  (pytest fixtures)

pytest.importorskip("torch")


@pytest.fixture
def page(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_HOME", str(tmp_path / "home"))
    return layout_page(tmp_path / "page.png") and tmp_path / "page.png"


def ocr(capsys, *argv):
    rc = main(["ocr", *map(str, argv), "--runtime", "torch", "--max-tokens", "6"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_layout_on_reads_the_regions_as_markdown_and_json(tiny_glm_ocr, layouts, page, capsys):
    common = (page, "--model", tiny_glm_ocr, "--layout", "on", "--layout-model", layouts["regions"])
    rc, out, err = ocr(capsys, *common, "--format", "md")
    assert rc == 0, err
    assert out.startswith("# ") and "\n$$\n" in out  # the doc_title as a heading, the formula as $$ ... $$
    assert "region 1/2 doc_title] [" in err and "region 2/2 display_formula] [" in err  # a stats line each
    assert "[page.png \u00b7 layout: 2 regions in " in err

    rc, out, err = ocr(capsys, *common, "--format", "json")
    assert rc == 0, err
    (entry,) = json.loads(out)["pages"]
    assert entry["layout"] == "regions" and entry["page"] == 1
    assert [(r["label"], r["task"]) for r in entry["regions"]] == [("doc_title", "text"), ("display_formula", "formula")]
    for r in entry["regions"]:
        assert len(r["bbox"]) == 4 and 1 <= r["rounds"]["tokens"] <= 6 and isinstance(r["text"], str)
    assert entry["text"].startswith("# ")


def test_a_pages_regions_read_together_equal_them_read_one_after_another(tiny_glm_ocr, layouts, page, capsys):
    """The default reads a page's regions as the rows of one batch; --max-batch 1 one after
    another: the same document, region for region, token for token (and drafts accepted)."""
    common = (page, "--model", tiny_glm_ocr, "--layout", "on", "--layout-model", layouts["regions"], "--format",
              "json", "--spec", "mtp", "--steps", "2")
    together = ocr(capsys, *common)
    alone = ocr(capsys, *common, "--max-batch", "1")
    assert together[0] == alone[0] == 0, together[2] + alone[2]
    regions = [json.loads(run[1])["pages"][0]["regions"] for run in (together, alone)]
    assert [r["text"] for r in regions[0]] == [r["text"] for r in regions[1]]
    counts = [[{k: r["rounds"][k] for k in ("rounds", "tokens", "proposed", "accepted")} for r in run] for run in regions]
    assert counts[0] == counts[1] and sum(r["proposed"] for r in counts[0]) > 0


def test_what_layout_cannot_do_is_one_line_each(tiny_glm_ocr, layouts, page, capsys):
    # finds nothing: the whole page, said
    rc, out, err = ocr(capsys, page, "--model", tiny_glm_ocr, "--layout", "on", "--layout-model", layouts["nothing"],
                       "--format", "json")
    assert rc == 0, err
    (entry,) = json.loads(out)["pages"]
    assert "layout found no regions: the whole page is read as text" in err and entry["note"]
    assert [r["label"] for r in entry["regions"]] == ["page"]
    # regions thinner than the vision encoder's 28 px: padded, or not read when empty at the page's pixels; said
    rc, out, err = ocr(capsys, page, "--model", tiny_glm_ocr, "--layout", "on", "--layout-model", layouts["slivers"],
                       "--format", "json")
    assert rc == 0, err
    regions = json.loads(out)["pages"][0]["regions"]
    padded = [r for r in regions if "padded from" in r.get("note", "")]
    unread = [r for r in regions if r.get("note", "").startswith("not read: the region is empty")]
    assert padded and len(padded) + len(unread) == len(regions)
    assert all(r["rounds"]["tokens"] >= 1 for r in padded) and all("rounds" not in r for r in unread)
    assert err.count("padded from") == len(padded) and err.count("not read:") == len(unread)
    # a checkpoint of another architecture
    rc, out, err = ocr(capsys, page, "--model", tiny_glm_ocr, "--layout", "on", "--layout-model", tiny_glm_ocr)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "is a glm_ocr checkpoint, not a PP-DocLayoutV3 layout model" in err
    # not installed: whole pages meanwhile, and how to get it
    rc, out, err = ocr(capsys, page, "--model", tiny_glm_ocr, "--layout", "on", "--format", "json")
    assert rc == 0, err
    assert "pp-doclayout-v3 is not installed: reading whole pages meanwhile; `specscope models get pp-doclayout-v3`" in err
    assert "regions" not in json.loads(out)["pages"][0]
    # what --layout on does not go with
    rc, out, err = ocr(capsys, page, "--model", tiny_glm_ocr, "--layout", "on", "--task", "table")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "does not go with --task" in err


def test_a_huge_page_is_refused_before_anything_loads(layouts, tmp_path, capsys, monkeypatch):
    from PIL import Image

    from engines.glm_ocr.image import MAX_SOURCE_PIXELS

    monkeypatch.setenv("SPECSCOPE_HOME", str(tmp_path / "home"))
    side = int(MAX_SOURCE_PIXELS ** 0.5) + 100
    Image.new("1", (side, side), 1).save(tmp_path / "huge.png")  # one bit a pixel: a small file
    rc, out, err = ocr(capsys, tmp_path / "huge.png", "--model", tmp_path, "--layout", "on",
                       "--layout-model", layouts["regions"])
    assert rc == 2 and out == "" and err.count("\n") == 1 and "MP limit" in err


@pytest.mark.slow  # a few seconds; the quick suite is full
def test_a_pdf_by_region(tiny_glm_ocr, layouts, tmp_path, capsys, monkeypatch):
    from tests.pdfs import pdf_of_images

    monkeypatch.setenv("SPECSCOPE_HOME", str(tmp_path / "home"))
    pdf = pdf_of_images(tmp_path / "two.pdf", [layout_page(), layout_page()])
    rc, out, err = ocr(capsys, pdf, "--model", tiny_glm_ocr, "--layout", "on", "--layout-model", layouts["regions"])
    assert rc == 0, err
    assert out.count(f"## two.pdf \u00b7 p. ") == 2 and "[document: 2 pages" in err


@pytest.mark.slow  # a few seconds; the quick suite is full
def test_auto_offers_the_layout_model_then_uses_it_once_downloaded(hub, hub_env, tiny_glm_ocr, layouts, page,
                                                                     capsys):
    """The catalog's GLM-OCR (a tiny checkpoint served by the loopback hub at the catalog's pin):
    without its layout model, --layout auto reads whole pages and says how to get it; after
    `models get pp-doclayout-v3` the same command reads by region."""
    from app.models import catalog

    glm = catalog.find("glm-ocr")
    hub.serve_repo(glm.repo_id, tiny_glm_ocr)
    hub.serve_repo(catalog.find("pp-doclayout-v3").repo_id, layouts["regions"])
    assert main(["models", "get", "glm-ocr"]) == 0
    assert "its layout model pp-doclayout-v3 is not downloaded" in capsys.readouterr().err

    rc, out, err = ocr(capsys, page, "--format", "json")
    assert rc == 0, err
    assert "`specscope models get pp-doclayout-v3` gets it" in err and "regions" not in json.loads(out)["pages"][0]

    assert main(["models", "get", "pp-doclayout-v3"]) == 0
    capsys.readouterr()
    rc, out, err = ocr(capsys, page, "--format", "json")
    assert rc == 0, err
    assert "models get" not in err
    assert [r["label"] for r in json.loads(out)["pages"][0]["regions"]] == ["doc_title", "display_formula"]
