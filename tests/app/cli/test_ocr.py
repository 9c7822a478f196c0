"""`specscope ocr` and `specscope bench ocr` on a tiny real-format GLM-OCR checkpoint."""

import json
import os
import subprocess
import sys

import pytest

from tests.engines.glm_ocr.checkpoints import make_tiny_glm_ocr
from tests.engines.glm_ocr.checkpoints import test_images as sample_images

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_and_image(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_ocr")
    image = root / "page.png"
    sample_images(1)[0].save(image)
    return make_tiny_glm_ocr(root / "tiny"), image


def test_ocr_json_equals_plain_and_streams(model_and_image, tmp_path, capsys):
    from app.cli.main import main

    model, image = model_and_image
    argv = ["ocr", str(image), "--model", str(model), "--runtime", "torch", "--max-tokens", "16"]
    common = [sys.executable, "-m", "app", *argv]
    mtp = subprocess.run([*common, "--spec", "mtp", "--steps", "3", "--json"], capture_output=True, text=True, timeout=300)
    composed = subprocess.run([*common, "--spec", "mtp", "--with-ngram", "--json"], capture_output=True, text=True,
                              timeout=300)
    assert mtp.returncode == 0, mtp.stderr
    assert composed.returncode == 0, composed.stderr
    # the plain reference in this process (the same command, torch on the same BLAS and one
    # thread); the speculative runs above are each a fresh process, as a user runs them
    rc = main([*argv, "--spec", "off", "--json"])
    plain_out, plain_err = capsys.readouterr()
    assert rc == 0, plain_err
    m, p, c = json.loads(mtp.stdout), json.loads(plain_out), json.loads(composed.stdout)
    assert {"text", "tokens", "rounds", "stats"} <= m.keys()
    assert m["tokens"] == p["tokens"] == c["tokens"] and m["text"] == p["text"]
    assert {r["draft_source"] for r in c["rounds"] if r["proposed"]} <= {"ngram", "mtp", "mtp+ngram"}
    assert all(r["draft_source"] is None for r in m["rounds"])
    assert m["stats"]["proposed"] > 0 and p["stats"]["proposed"] == 0
    assert 0 < len(m["tokens"]) <= 16


def test_bench_ocr_writes_json_and_csv(model_and_image, tmp_path, capsys):
    from app.cli.main import main

    model, image = model_and_image
    rc = main(["bench", "ocr", str(image), "--model", str(model), "--runtime", "torch",
               "--steps", "2", "--max-tokens", "8", "--runs", "1", "--warmup", "0", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(next(tmp_path.glob("bench-*.json")).read_text())
    assert doc["summary"]["all_identical"] is True
    assert doc["model"] and doc["machine"]["cpu_count"]
    case = doc["cases"][0]
    assert case["plain_tok_s"] > 0 and case["spec_tok_s"] > 0 and case["tau"] >= 1
    assert next(tmp_path.glob("bench-*.csv")).read_text().startswith("name,plain_tok_s")


def test_dtype_and_threads_reach_the_torch_runtime(model_and_image, tmp_path, capsys):
    from app.cli.main import main

    model, image = model_and_image
    rc = main(["bench", "ocr", str(image), "--model", str(model), "--runtime", "torch", "--dtype", "bfloat16",
               "--threads", "1", "--max-tokens", "4", "--runs", "1", "--warmup", "0", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(next(tmp_path.glob("bench-*.json")).read_text())
    assert (doc["model"]["dtype"], doc["model"]["threads"]) == ("bfloat16", 1)


def test_serve_spells_them_for_its_ocr_engine():
    from app.cli.common import Parser, ocr_load_options
    from app.cli.serve import serve_parser

    args = serve_parser(Parser).parse_args(["--ocr-runtime", "torch", "--ocr-dtype", "bfloat16", "--ocr-threads", "2"])
    assert ocr_load_options(args, prefix="ocr-") == {"runtime": "torch", "dtype": "bfloat16", "threads": 2}
    assert ocr_load_options(serve_parser(Parser).parse_args([]), prefix="ocr-") == \
        {"runtime": None, "dtype": None, "threads": None}  # the engine's defaults


def test_two_page_pdf_gives_two_page_entries(model_and_image, tmp_path, capsys, monkeypatch):
    from app.cli.main import main
    from tests.pdfs import pdf_of_images

    monkeypatch.setenv("SPECSCOPE_HOME", str(tmp_path / "home"))
    model, _image = model_and_image
    pdf = pdf_of_images(tmp_path / "two-page.pdf", sample_images(2))
    rc = main(["ocr", str(pdf), "--model", str(model), "--runtime", "torch", "--max-tokens", "4", "--format", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    pages = json.loads(out)["pages"]
    assert [(p["source"], p["page"]) for p in pages] == [(str(pdf), 1), (str(pdf), 2)]
    assert all(p["task"] == "text" and p["runtime"] == "torch" and 1 <= p["rounds"]["tokens"] <= 4 for p in pages)
    assert "[document: 2 pages" in err


@pytest.mark.parametrize("make, says", [("pdf_without_pages", "has no pages"), ("encrypted_pdf", "is encrypted"),
                                        ("corrupt_pdf", "corrupt or not a PDF")])
def test_unreadable_pdf_is_one_line_and_exit_2(tmp_path, make, says):
    import tests.pdfs

    pdf = getattr(tests.pdfs, make)(tmp_path / "bad.pdf")
    env = dict(os.environ, SPECSCOPE_HOME=str(tmp_path / "home"))
    out = subprocess.run([sys.executable, "-m", "app", "ocr", str(pdf), "--model", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and says in out.stderr and "Traceback" not in out.stderr
