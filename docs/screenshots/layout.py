"""Makes the window-at-any-size screenshots (docs/screenshots/layout-{before,after}-*.png) with
the product's own `specscope --screenshot`, offscreen: a 200-token n-gram chat run on the embedded
SmolLM2 at 735x800, 1024x700, 1280x800 and 1920x1080, and a two-page PDF read by a tiny random
GLM-OCR checkpoint at 735x800 and 1024x700.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/layout.py after [CODE_ROOT]

`before` shots come from another checkout of the code (CODE_ROOT: e.g. a `git archive` of the
commit before the reflow, 5387473), `after` from this one."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "screenshots"
CHAT_SIZES = ["735x800", "1024x700", "1280x800", "1920x1080"]
OCR_SIZES = ["735x800", "1024x700"]


def shoot(code: Path, path: Path, size: str, args: list[str], home: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(code), SPECSCOPE_HOME=str(home), HF_HUB_OFFLINE="1")
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    cmd = [sys.executable, "-m", "app", "--screenshot", str(path), "--window-size", size, *args]
    out = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    print(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "", flush=True)
    if out.returncode != 0:
        raise SystemExit(f"{path.name}: exit {out.returncode}")


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "after"
    code = Path(sys.argv[2]).resolve() if len(sys.argv) > 2 else ROOT
    sys.path.insert(0, str(ROOT))
    from docs.screenshots.make import CHAT_PROMPT
    from tests.engines.glm_ocr.checkpoints import make_tiny_glm_ocr, test_images
    from tests.pdfs import pdf_of_images

    work = Path(tempfile.mkdtemp(prefix="specscope-layout-"))
    model = make_tiny_glm_ocr(work / "glm-ocr-tiny")
    pdf = pdf_of_images(work / "two-page.pdf", test_images(2))
    for size in CHAT_SIZES:
        shoot(code, OUT / f"layout-{label}-chat-{size}.png", size,
              ["--chat", CHAT_PROMPT, "--spec", "ngram", "--max-tokens", "200"], work / f"home-chat-{size}")
    for size in OCR_SIZES:
        shoot(code, OUT / f"layout-{label}-ocr-{size}.png", size,
              ["--ocr", str(pdf), "--model", str(model), "--runtime", "torch", "--spec", "mtp", "--steps", "3",
               "--max-tokens", "40"], work / f"home-ocr-{size}")


if __name__ == "__main__":
    main()
