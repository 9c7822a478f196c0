"""GLM-OCR regions read one at a time against the same regions read together in one batch
(engines/glm_ocr/batch.py, OcrBatch), on the fast torch runtime: aggregate tok/s and its ratio.

    python bench/ocr_batch.py [--model DIR] [--regions 8] [--tokens 64] [--modes plain,replay:2,mtp:2]

The checkpoint: the published shapes with random weights (tests/engines/glm_ocr/published_shape.py,
about 2.6 GB, built once into --checkpoint; the test suite's copy is used when it is there), or
--model DIR (a real GLM-OCR, or the tests' tiny checkpoint to try the script). The regions: crops
of the 448 x 448 page of text lines (published_shape.fixture_page), bands and blocks of different
sizes, so the rows' prompts differ in length. Random weights emit no meaningful text:
end-of-sequence is switched off and every region decodes exactly --tokens tokens.

A mode is how every region drafts:
  plain      no drafts
  replay:K   K drafts a round from a replay drafter -- the region's own plain tokens, each draft
             wrong with probability --error-rate (0.25: about 1.75 tokens per target forward at
             one draft, the middle of what vLLM / SGLang report for GLM-OCR's MTP)
  mtp:K      the checkpoint's own MTP layer, K chained drafts (random: nothing accepted -- what
             drafting costs; its chains run row after row, the target's forward is batched)

Per mode, `--repeats` times in turn: the regions one after another (OcrEngine.generate:
a batch of one), then all of them submitted at once to an OcrBatch (--max-batch rows).
Figures: aggregate tok/s over the whole job (every region's tokens / wall time, image encoding
and prefill included on both sides), decode tok/s (tokens after each region's first / the time
after it: for the batch, after the last region's first token), the ratio batch / one at a time
(medians over repeats), and whether every region emitted the same tokens both ways. Run it on
a quiet machine (the load average is printed before each mode).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# (left, top, right, bottom) on the 448 x 448 page: text bands and blocks, as a layout stage finds them
CROPS = [(0, 0, 448, 112), (0, 112, 448, 168), (0, 168, 224, 336), (224, 168, 448, 336),
         (0, 336, 448, 448), (0, 0, 224, 224), (112, 56, 448, 168), (0, 224, 336, 448),
         (224, 0, 448, 112), (0, 280, 448, 336), (56, 56, 280, 280), (168, 336, 448, 448)]


def regions(scratch: Path, count: int) -> list[Path]:
    from PIL import Image

    from tests.engines.glm_ocr.published_shape import fixture_page

    page = Image.open(fixture_page(scratch / "page-448.png"))
    paths = []
    for i in range(count):
        path = scratch / f"region-{i}.png"
        page.crop(CROPS[i % len(CROPS)]).save(path)
        paths.append(path)
    return paths


def request(path: Path, tokens: int, method: str, steps: int):
    from engines.types import Request, SpecConfig

    return Request(kind="ocr", image=str(path), max_tokens=tokens, spec=SpecConfig(method=method, steps=steps))


def drafters(mode: str, references: list[list[int]], engine, error_rate: float, count: int) -> list:
    """Each region's drafter for `mode` (None: the request's own -- plain or the MTP layer)."""
    if not mode.startswith("replay"):
        return [None] * count
    from tests.engines.glm_ocr.replay import ReplayDrafter

    return [ReplayDrafter(ref, error_rate, engine.config.text.vocab_size, seed=i) for i, ref in enumerate(references)]


def spec_of(mode: str) -> tuple[str, int]:
    name, _, k = mode.partition(":")
    return ("off", 0) if name == "plain" else ("mtp", int(k))


def one_at_a_time(engine, paths, tokens, mode, references, error_rate) -> dict:
    method, steps = spec_of(mode)
    out, decode_tokens, decode_s = [], 0, 0.0
    t0 = time.perf_counter()
    for path, drafter in zip(paths, drafters(mode, references, engine, error_rate, len(paths))):
        first = None
        rounds = []
        for rnd in engine.generate(request(path, tokens, method, steps), drafter=drafter):
            rounds.append(rnd)
            if first is None:
                first = time.perf_counter()
        decode_s += time.perf_counter() - first
        emitted = [t for r in rounds for t in r.tokens]
        decode_tokens += len(emitted) - len(rounds[0].tokens)
        out.append(emitted)
    wall = time.perf_counter() - t0
    total = sum(len(e) for e in out)
    return {"wall_s": wall, "tok_s": total / wall, "decode_tok_s": decode_tokens / decode_s, "tokens": out}


def together(engine, paths, tokens, mode, references, error_rate, max_batch) -> dict:
    from engines.glm_ocr.batch import OcrBatch

    method, steps = spec_of(mode)
    batch = OcrBatch(engine, max_batch=max_batch)
    t0 = time.perf_counter()
    seqs = [batch.submit(request(path, tokens, method, steps), drafter=d)
            for path, d in zip(paths, drafters(mode, references, engine, error_rate, len(paths)))]
    emitted = {s.id: [] for s in seqs}
    first_all, decode_tokens, steps_run, widths = None, 0, 0, []
    while batch.busy:
        results = batch.step()
        steps_run += 1
        widths.append(batch.size)
        for seq, rnd in results:
            emitted[seq.id] += rnd.tokens
            if first_all is not None:
                decode_tokens += len(rnd.tokens)
        if first_all is None and not batch.joining:
            first_all = time.perf_counter()
    end = time.perf_counter()
    out = [emitted[s.id] for s in seqs]
    return {"wall_s": end - t0, "tok_s": sum(len(e) for e in out) / (end - t0),
            "decode_tok_s": decode_tokens / (end - first_all), "steps": steps_run, "max_rows": max(widths),
            "tokens": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="where the published-shape checkpoint is (built there if missing)")
    parser.add_argument("--model", type=Path, default=None, help="an existing checkpoint instead")
    parser.add_argument("--regions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--modes", default="plain,replay:2,mtp:2")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--error-rate", type=float, default=0.25)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache-length", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch

    from engines.glm_ocr.engine import OcrEngine

    if args.model is not None:
        checkpoint = args.model
    else:
        from tests.engines.glm_ocr.checkpoints import cache_root
        from tests.engines.glm_ocr.published_shape import make_published_shape_glm_ocr

        checkpoint = args.checkpoint or cache_root() / "glm-ocr-published-shape"
        t0 = time.perf_counter()
        make_published_shape_glm_ocr(checkpoint)  # returns at once when it is complete
        print(f"checkpoint {checkpoint} ({time.perf_counter() - t0:.0f} s)", flush=True)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    engine = OcrEngine.load(checkpoint, runtime="torch", dtype=args.dtype, cache_length=args.cache_length)
    print(f"loaded in {time.perf_counter() - t0:.1f} s ({args.dtype}, {args.threads} threads)", flush=True)
    engine.config.eos_token_ids = []  # random weights: every region decodes exactly --tokens
    engine.repetition = None
    paths = regions(Path(tempfile.mkdtemp(prefix="ocr-batch-")), args.regions)

    references = one_at_a_time(engine, paths, args.tokens, "plain", [], 0.0)["tokens"]  # warm-up, replay's tokens
    report = {"checkpoint": str(checkpoint), "regions": args.regions, "tokens": args.tokens, "dtype": args.dtype,
              "threads": args.threads, "max_batch": args.max_batch, "modes": {}}
    for mode in [m for m in args.modes.split(",") if m]:
        load = os.getloadavg()[0]
        runs = []
        for _ in range(args.repeats):
            lone = one_at_a_time(engine, paths, args.tokens, mode, references, args.error_rate)
            batch = together(engine, paths, args.tokens, mode, references, args.error_rate, args.max_batch)
            runs.append((lone, batch))
        same = all(lone["tokens"] == batch["tokens"] for lone, batch in runs)
        figures = {
            "load_before": load, "load_after": os.getloadavg()[0], "same_tokens": same,
            "one_at_a_time_tok_s": [round(lone["tok_s"], 2) for lone, _ in runs],
            "batch_tok_s": [round(b["tok_s"], 2) for _, b in runs],
            "ratio": round(statistics.median(b["tok_s"] / lone["tok_s"] for lone, b in runs), 2),
            "one_at_a_time_decode_tok_s": [round(lone["decode_tok_s"], 2) for lone, _ in runs],
            "batch_decode_tok_s": [round(b["decode_tok_s"], 2) for _, b in runs],
            "decode_ratio": round(statistics.median(b["decode_tok_s"] / lone["decode_tok_s"] for lone, b in runs), 2),
            "batch_steps": runs[0][1]["steps"], "max_rows": runs[0][1]["max_rows"],
        }
        report["modes"][mode] = figures
        print(mode, json.dumps(figures), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
