"""A 4-page PDF read the way GLM-OCR's SDK reads documents -- per page the layout stage, then the
page's regions read together in one batch -- against the same pages read one region at a time
and against whole-page OCR: pages per minute, the layout stage's share, and each way's peak RSS.

    python bench/ocr_document.py [--pages 4] [--tokens 64] [--regions 8] [--max-batch 8]

Checkpoints: GLM-OCR at the published shapes (tests/engines/glm_ocr/published_shape.py, random
weights, built once) and PP-DocLayoutV3 at its published size (bench/layout_stage.py's, random
weights). Random layout weights find random boxes, so each page's forward is timed through the
product's LayoutModel and its regions are then a fixed set (bench/ocr_batch.py's crops: text
bands and blocks of the 448 x 448 page, `--regions` of them), read with the text task; random
OCR weights emit no end of sequence, so every region decodes exactly --tokens tokens, and a
whole page --regions x --tokens. The PDF's pages render through the product's own PDF path
(app/records/documents.py). Each way runs in a process of its own (its peak RSS is its own),
one after another; run it on a quiet machine (the load average is printed)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

WAYS = {"regions together": "together", "regions one at a time": "one", "whole pages": "whole"}


def make_pdf(folder: Path, pages: int) -> Path:
    """`pages` pages of text lines, 448 x 448 pixels each once rendered at the product's 200 dpi."""
    from PIL import Image

    from tests.engines.glm_ocr.published_shape import fixture_page

    images = [Image.open(fixture_page(folder / f"page-{i}.png")).convert("RGB") for i in range(pages)]
    pdf = folder / "document.pdf"
    images[0].save(pdf, save_all=True, append_images=images[1:], resolution=200.0)
    return pdf


def run_way(way: str, args: argparse.Namespace) -> dict:
    """One way of reading the document, in this process."""
    import torch

    from app.records.documents import pages_of
    from engines.glm_ocr.batch import OcrBatch
    from engines.glm_ocr.document import read_regions_together
    from engines.glm_ocr.engine import OcrEngine
    from engines.glm_ocr.layout import LayoutModel, Region
    from engines.types import Request, SpecConfig
    from ocr_batch import CROPS
    from PIL import Image

    torch.set_num_threads(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="ocr-document-"))
    pages = pages_of([str(args.pdf)], scratch / "rendered")
    engine = OcrEngine.load(args.ocr, runtime="torch", dtype="float32", cache_length=args.cache_length)
    engine.config.eos_token_ids = []  # random weights: every request decodes exactly its max_tokens
    engine.repetition = None
    layout = LayoutModel.load(args.layout) if way != "whole" else None
    spec = SpecConfig(method="off", steps=0)
    regions = [Region(i, "text", "text", box, tuple(v * 1000 // 448 for v in box), 1.0)
               for i, box in enumerate(CROPS[: args.regions])]  # (the crops are of a 448 x 448 page)
    layout_s, tokens, t0 = 0.0, 0, time.perf_counter()
    for page in pages:
        image = Image.open(page.image).convert("RGB")
        if way == "whole":
            request = Request(kind="ocr", image=page.image, max_tokens=args.regions * args.tokens, spec=spec)
            tokens += sum(len(r.tokens) for r in engine.generate(request))
            continue
        t1 = time.perf_counter()
        layout.regions(image)  # timed; its random boxes are not read (see the module docstring)
        layout_s += time.perf_counter() - t1
        batch = OcrBatch(engine, max_batch=args.max_batch if way == "together" else 1)
        request = Request(kind="ocr", image=page.image, max_tokens=args.tokens, spec=spec)
        read = read_regions_together(image, page.number, regions, request, scratch / "crops", batch)
        tokens += sum(len(rr.session.tokens) for rr in read if rr.session is not None)
    wall = time.perf_counter() - t0
    return {"pages": len(pages), "wall_s": round(wall, 1), "pages_per_min": round(60 * len(pages) / wall, 2),
            "layout_share": round(layout_s / wall, 3), "tokens": tokens,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per region (a whole page: --regions x this)")
    ap.add_argument("--regions", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-length", type=int, default=2048)
    ap.add_argument("--way", default=None, help=argparse.SUPPRESS)  # a child process: one way
    ap.add_argument("--ocr", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--layout", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--pdf", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.way:
        print(json.dumps(run_way(args.way, args)), flush=True)
        return

    from layout_stage import build
    from tests.engines.glm_ocr.checkpoints import cache_root
    from tests.engines.glm_ocr.published_shape import make_published_shape_glm_ocr

    ocr = cache_root() / "glm-ocr-published-shape"
    make_published_shape_glm_ocr(ocr)  # returns at once when it is complete
    layout = build(cache_root() / "pp-doclayout-v3-published-shape")
    pdf = make_pdf(Path(tempfile.mkdtemp(prefix="ocr-document-")), args.pages)
    print(f"{args.pages}-page PDF, {args.regions} regions x {args.tokens} tokens a page, max batch {args.max_batch}, "
          f"{args.threads} threads, load {os.getloadavg()[0]:.2f}", flush=True)
    results = {}
    for name, way in WAYS.items():
        child = [sys.executable, __file__, "--way", way, "--ocr", str(ocr), "--layout", str(layout), "--pdf", str(pdf),
                 "--tokens", str(args.tokens), "--regions", str(args.regions), "--max-batch", str(args.max_batch),
                 "--threads", str(args.threads), "--cache-length", str(args.cache_length)]
        out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
        print(f"  {name:<22} {json.dumps(results[name])}  (load {os.getloadavg()[0]:.2f})", flush=True)
    together, one, whole = (results[name] for name in WAYS)
    print(f"regions together / one at a time: {together['pages_per_min'] / one['pages_per_min']:.2f}x pages/min; "
          f"layout share {together['layout_share']:.1%}; peak RSS together / whole pages "
          f"{together['peak_rss_mb'] / whole['peak_rss_mb']:.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()
