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
one after another; run it on a quiet machine (the load average is printed).

    python bench/ocr_document.py --ahead [--pairs 3] [--layout-threads N]

reads the regions together with each next page's layout found on a worker thread while this
page's regions decode (engines/glm_ocr/document.LayoutAhead) against the same without, in
alternating processes (`--pairs` of each, the order flipped every pair): pages per minute of
each run, the medians and their ratio, the load average beside every run. `--layout-threads`:
torch's threads on the layout worker (default: the process's, --threads)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

WAYS = {"regions together": "together", "regions one at a time": "one", "whole pages": "whole"}
AHEAD = {"layout in turn": "together", "layout ahead": "ahead"}  # --ahead: the regions read together either way


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
    from engines.glm_ocr.document import LayoutAhead, read_regions_together
    from engines.glm_ocr.engine import OcrEngine
    from engines.glm_ocr.layout import LayoutModel, Region
    from engines.types import Request, SpecConfig
    from ocr_batch import CROPS

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
    layout_s, waited_s, tokens, t0 = 0.0, 0.0, 0, time.perf_counter()
    if way == "whole":
        for page in pages:
            request = Request(kind="ocr", image=page.image, max_tokens=args.regions * args.tokens, spec=spec)
            tokens += sum(len(r.tokens) for r in engine.generate(request))
    else:
        with LayoutAhead(layout, [page.image for page in pages], ahead=way == "ahead",
                         threads=args.layout_threads) as layouts:
            taken = iter(layouts)
            for page in pages:
                t1 = time.perf_counter()
                found = next(taken)  # its random boxes are not read (see the module docstring)
                waited_s += time.perf_counter() - t1  # the layout on the reading's path (all of it, in turn)
                layout_s += found.seconds
                batch = OcrBatch(engine, max_batch=1 if way == "one" else args.max_batch)
                request = Request(kind="ocr", image=page.image, max_tokens=args.tokens, spec=spec)
                read = read_regions_together(found.image, page.number, regions, request, scratch / "crops", batch)
                tokens += sum(len(rr.session.tokens) for rr in read if rr.session is not None)
    wall = time.perf_counter() - t0
    return {"pages": len(pages), "wall_s": round(wall, 1), "pages_per_min": round(60 * len(pages) / wall, 2),
            "layout_share": round(layout_s / wall, 3), "layout_waited_s": round(waited_s, 2), "tokens": tokens,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per region (a whole page: --regions x this)")
    ap.add_argument("--regions", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-length", type=int, default=2048)
    ap.add_argument("--ahead", action="store_true", help="layout ahead against layout in turn (see the docstring)")
    ap.add_argument("--pairs", type=int, default=3, help="with --ahead: runs of each, alternating")
    ap.add_argument("--layout-threads", type=int, default=None, help="torch threads on the layout worker")
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
          f"{args.threads} threads, layout worker {args.layout_threads or args.threads}, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    paths = {"ocr": ocr, "layout": layout, "pdf": pdf}
    if args.ahead:
        compare_ahead(args, paths)
        return
    results = {}
    for name, way in WAYS.items():
        results[name] = run_child(way, args, paths)
        print(f"  {name:<22} {json.dumps(results[name])}  (load {os.getloadavg()[0]:.2f})", flush=True)
    together, one, whole = (results[name] for name in WAYS)
    print(f"regions together / one at a time: {together['pages_per_min'] / one['pages_per_min']:.2f}x pages/min; "
          f"layout share {together['layout_share']:.1%}; peak RSS together / whole pages "
          f"{together['peak_rss_mb'] / whole['peak_rss_mb']:.2f}x (goal <= 1.2x)")


def run_child(way: str, args: argparse.Namespace, paths: dict) -> dict:
    """One way in a process of its own; its figures."""
    child = [sys.executable, __file__, "--way", way, "--ocr", str(paths["ocr"]), "--layout", str(paths["layout"]),
             "--pdf", str(paths["pdf"]), "--tokens", str(args.tokens), "--regions", str(args.regions),
             "--max-batch", str(args.max_batch), "--threads", str(args.threads),
             "--cache-length", str(args.cache_length)]
    if args.layout_threads:
        child += ["--layout-threads", str(args.layout_threads)]
    out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare_ahead(args: argparse.Namespace, paths: dict) -> None:
    """Layout ahead against layout in turn, alternating (the order flipped every pair so that a
    drift in the machine's load falls on both)."""
    speeds: dict[str, list[float]] = {name: [] for name in AHEAD}
    for pair in range(args.pairs):
        for name in (list(AHEAD) if pair % 2 == 0 else list(AHEAD)[::-1]):
            result = run_child(AHEAD[name], args, paths)
            speeds[name].append(result["pages_per_min"])
            print(f"  {name:<15} {json.dumps(result)}  (load {os.getloadavg()[0]:.2f})", flush=True)
    in_turn, ahead = (statistics.median(speeds[name]) for name in AHEAD)
    pairs = ", ".join(f"{a / b:.3f}" for a, b in zip(speeds["layout ahead"], speeds["layout in turn"]))
    print(f"median pages/min: layout in turn {in_turn:.2f}, layout ahead {ahead:.2f}; ahead / in turn "
          f"{ahead / in_turn:.3f}x (pair by pair {pairs}); load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
