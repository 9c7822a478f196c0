"""Makes the README's window screenshots with the product's own `specscope --screenshot`:
a 2-page PDF OCR session on a tiny GLM-OCR checkpoint (random weights, its MTP layer trained
on the target's own outputs so drafts are accepted as they would be on the real model) and a
long chat run on the embedded SmolLM2, each at 1280x800 and 1920x1080, offscreen.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/make.py [WORK_DIR [WxH ...]]

The tiny checkpoint is random: its "text" is byte soup. What the screenshots show is the
window: the page list, the per-page bursts (green = accepted drafts), the plots."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "screenshots"
SIZES = ["1280x800", "1920x1080"]
CHAT_PROMPT = (
    "Rewrite the following list exactly, one item per line, numbering each line:\n"
    + "\n".join(f"Item {i}: check the {w} before the release and note the result in the log."
                for i, w in enumerate(["tests", "docs", "licence", "icons", "bundle", "signature", "changelog",
                                       "screenshots", "installer", "benchmarks", "translations", "settings"], 1))
)


def tiny_ocr_document(work: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(ROOT))
    from PIL import Image

    from app.records.documents import pages_of
    from tests.engines.glm_ocr.checkpoints import make_tiny_glm_ocr, test_images, train_mtp_on_target
    from tests.pdfs import pdf_of_images

    model = work / "glm-ocr-tiny"
    pdf = pdf_of_images(work / "two-page.pdf", test_images(2))
    if not (model / "trained").exists():
        make_tiny_glm_ocr(model)
        # trained on the pages as the window renders them, so its drafts are accepted there
        pages = [Image.open(p.image).convert("RGB") for p in pages_of([str(pdf)], work / "pages")]
        train_mtp_on_target(model, pages, steps=150)
        (model / "trained").touch()
    return model, pdf


def shoot(name: str, size: str, args: list[str], home: Path) -> None:
    path = OUT / f"{name}-{size}.png"
    env = dict(os.environ, SPECSCOPE_HOME=str(home), HF_HUB_OFFLINE="1")
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    cmd = [sys.executable, "-m", "app", "--screenshot", str(path), "--window-size", size, *args]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    print(out.stdout + out.stderr, end="")
    if out.returncode != 0:
        raise SystemExit(f"{name} {size}: exit {out.returncode}")


def main() -> None:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="specscope-shots-"))
    work.mkdir(parents=True, exist_ok=True)
    model, pdf = tiny_ocr_document(work)
    for size in sys.argv[2:] or SIZES:
        shoot("ocr-two-page-pdf", size, ["--ocr", str(pdf), "--model", str(model), "--runtime", "torch",
                                         "--spec", "mtp", "--steps", "3", "--max-tokens", "40"], work / f"home-ocr-{size}")
        shoot("chat-long-run", size, ["--chat", CHAT_PROMPT, "--spec", "ngram", "--max-tokens", "700"],
              work / f"home-chat-{size}")


if __name__ == "__main__":
    main()
