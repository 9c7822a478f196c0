"""GLM-OCR at the published shapes on this machine: the fast PyTorch runtime against
transformers' own generate, same checkpoint, same page, each run in its own process.

    python bench/ocr_fast_runtime.py [--checkpoint DIR] [--tokens 64] [--runs ours:bfloat16:2,hf:float32:2,...]

The checkpoint (random bfloat16 weights, zai-org/GLM-OCR's config.json and
preprocessor_config.json as published; tests/engines/glm_ocr/published_shape.py) is built
once into --checkpoint (about 2.6 GB). The page is the tests' fixture page (the 160 x 90 image
of tests/engines/test_published_layouts.py, read at the published processor's minimum size:
24 image tokens), or with a run's "@448" suffix a 448 x 448 page of text lines (256 image
tokens). Random weights emit no meaningful text; end-of-sequence is switched off so that every
run decodes exactly --tokens tokens.

A run is KIND:DTYPE:THREADS[:STEPS][@448]:
  ours      the engine on runtime "torch" (runtime_fast.py); STEPS given: after the plain run,
            MTP rounds at those steps (e.g. 2+3+auto) with a replay drafter -- the plain run's own
            tokens, each draft replaced by a wrong token with probability --error-rate (0.25:
            about 1.75 tokens per target forward at one step, the middle of the 1.69-1.81 that
            vLLM / SGLang report for GLM-OCR's MTP) -- and with the checkpoint's own random MTP
            layer (nothing accepted: what drafting costs)
  hf        transformers' GlmOcrForConditionalGeneration.generate (greedy, sdpa)
  parts     (KIND parts:DTYPE) the runtime's stages alone at 1 and 2 intra-op threads: vision
            tower, prefill, one decode step, one 4-row verify forward
  pair      (KIND pair:DTYPE:THREADS) ours and transformers' generate in one process, taking
            turns --repeats times: per-pair ratios of decode tok/s and TTFT, medians (for a
            shared machine, where separate processes meet different loads)
  pdf       `specscope ocr` on a 2-page PDF of the page, plain, --max-tokens --pdf-tokens, as a
            user runs it (its own process, the model loaded once): KIND pdf:RUNTIME, where
            RUNTIME is torch (this runtime, its default dtype) or coreml-twin (before it)
Figures per run: load time, time to first token (from the page file to the first token,
image preprocessing and vision tower included, both sides), decode tok/s after the first
token, peak RSS of the process (ru_maxrss), the load average before the run.
"""

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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_RUNS = ("ours:bfloat16:2:2+3,hf:float32:2,ours:float32:2,hf:bfloat16:2,ours:bfloat16:2@448,hf:float32:2@448,"
                "parts:bfloat16@448,parts:float32@448,pdf:torch,pdf:coreml-twin,ours:bfloat16:1,parts:float16@448")


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux (= VmHWM)


def rss_gb(field: str = "VmRSS") -> float:
    """A field of /proc/self/status in GB (VmRSS: now; VmHWM: the peak so far); 0 off Linux."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


def run_ours(checkpoint: Path, page: Path, dtype: str, threads: int, tokens: int, steps: list[int],
             error_rate: float) -> dict:
    import torch
    import transformers  # noqa: F401 -- imported before the clock starts, as run_hf does

    from engines.types import Request, SpecConfig
    from engines.glm_ocr.engine import OcrEngine
    sys.path.insert(0, str(ROOT / "bench"))
    from tests.engines.glm_ocr.replay import ReplayDrafter

    from transformers import GlmOcrForConditionalGeneration  # noqa: F401 -- the same import cost as run_hf's

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    engine = OcrEngine.load(checkpoint, runtime="torch", dtype=dtype)
    load_s = time.perf_counter() - t0
    loaded = {"rss_after_load_gb": rss_gb(), "peak_after_load_gb": rss_gb("VmHWM")}
    engine.config.eos_token_ids = []  # random weights: decode exactly `tokens`
    engine.repetition = None

    def one(steps: int | str = 0, drafter=None) -> tuple[dict, list[int]]:
        auto = steps == "auto"  # --steps auto: k from the run's own verify costs (from 2)
        spec = SpecConfig(method="mtp" if steps else "off", steps=2 if auto else steps, auto=auto)
        request = Request(kind="ocr", image=str(page), max_tokens=tokens, spec=spec)
        start = time.perf_counter()
        first = None
        rounds = []
        for rnd in engine.generate(request, drafter=drafter):
            rounds.append(rnd)
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        out = [t for r in rounds for t in r.tokens]
        decode_rounds = [r for r in rounds if not r.prefill]
        return {"ttft_s": first - start, "decode_tok_s": (len(out) - 1) / (end - first), "tokens": len(out),
                "forwards": len(decode_rounds), "steps_chosen": [r.steps for r in decode_rounds],
                "tokens_per_forward": (len(out) - 1) / max(1, len(decode_rounds))}, out

    plain, reference = one()
    result = {"load_s": load_s, "plain": plain, **loaded}
    for k in steps:
        drafter = ReplayDrafter(reference, error_rate, engine.config.text.vocab_size, seed=0 if k == "auto" else k)
        # same_tokens: in half precision a batched verify forward may round differently from a
        # one-row forward, and random weights leave near-ties between logits (said, not hidden)
        result[f"replay_steps{k}"], emitted = one(k, drafter)
        result[f"replay_steps{k}"]["same_tokens"] = emitted == reference
        if engine.runtime.mtp_unavailable is None:
            result[f"mtp_layer_steps{k}"], emitted = one(k)
            result[f"mtp_layer_steps{k}"]["same_tokens"] = emitted == reference
    return result


def hf_plain(model, checkpoint: Path, page: Path, tokens: int) -> dict:
    """One greedy generate of exactly `tokens` new tokens with transformers: TTFT (page file
    to first token) and decode tok/s after it."""
    import torch
    from PIL import Image
    from transformers.generation.streamers import BaseStreamer

    from tests.engines.glm_ocr.checkpoints import reference_prompt

    class Clock(BaseStreamer):
        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    clock = Clock()
    start = time.perf_counter()
    inputs = reference_prompt(checkpoint, Image.open(page).convert("RGB"))
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             eos_token_id=None, streamer=clock)
    end = time.perf_counter()
    new = out.shape[1] - inputs["input_ids"].shape[1]
    first = clock.times[1]  # put() gets the prompt first, then each new token
    return {"ttft_s": first - start, "decode_tok_s": (new - 1) / (end - first), "tokens": int(new),
            "prompt_tokens": int(inputs["input_ids"].shape[1]), "ids": out[0, -new:].tolist()}


def load_hf(checkpoint: Path, dtype: str):
    import torch
    from transformers import GlmOcrForConditionalGeneration

    return GlmOcrForConditionalGeneration.from_pretrained(checkpoint, dtype=getattr(torch, dtype)).eval()


def run_hf(checkpoint: Path, page: Path, dtype: str, threads: int, tokens: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = load_hf(checkpoint, dtype)
    load_s = time.perf_counter() - t0
    loaded = {"rss_after_load_gb": rss_gb(), "peak_after_load_gb": rss_gb("VmHWM")}
    plain = hf_plain(model, checkpoint, page, tokens)
    del plain["ids"]
    return {"load_s": load_s, **loaded, "plain": plain}


def run_pair(checkpoint: Path, page: Path, dtype: str, threads: int, tokens: int, repeats: int) -> dict:
    """Ours and transformers' generate in one process, taking turns (ours, theirs, ours, ...):
    on a shared machine whose load comes and goes, each pair of runs meets about the same
    load, so the per-pair ratios say more than two separate processes minutes apart. Peak
    memory is not measured here (both models are held): the single runs measure it."""
    import statistics

    import torch

    from engines.types import Request, SpecConfig
    from engines.glm_ocr.engine import OcrEngine

    torch.set_num_threads(threads)
    engine = OcrEngine.load(checkpoint, runtime="torch", dtype=dtype)
    engine.config.eos_token_ids = []  # random weights: decode exactly `tokens`
    engine.repetition = None
    model = load_hf(checkpoint, dtype)

    def ours_plain() -> dict:
        request = Request(kind="ocr", image=str(page), max_tokens=tokens, spec=SpecConfig(method="off", steps=0))
        start, first, ids = time.perf_counter(), None, []
        for rnd in engine.generate(request):
            ids += rnd.tokens
            first = first or time.perf_counter()
        end = time.perf_counter()
        return {"ttft_s": first - start, "decode_tok_s": (len(ids) - 1) / (end - first), "ids": ids}

    pairs = []
    for i in range(repeats):
        load = os.getloadavg()[0]
        ours, theirs = ours_plain(), hf_plain(model, checkpoint, page, tokens)
        pairs.append({"loadavg": load, "same_tokens": ours.pop("ids") == theirs.pop("ids"), "ours": ours, "hf": theirs,
                      "decode_ratio": ours["decode_tok_s"] / theirs["decode_tok_s"],
                      "ttft_ratio": ours["ttft_s"] / theirs["ttft_s"]})
        print(f"  pair {i}: load {load:.2f}  decode ours {ours['decode_tok_s']:.2f} / hf {theirs['decode_tok_s']:.2f} tok/s "
              f"= {pairs[-1]['decode_ratio']:.2f}x  ttft ours {ours['ttft_s']:.2f} / hf {theirs['ttft_s']:.2f} s  "
              f"same tokens {pairs[-1]['same_tokens']}", file=sys.stderr, flush=True)

    def median(f):
        return statistics.median(f(p) for p in pairs)

    return {"pairs": pairs, "median_decode_ratio": median(lambda p: p["decode_ratio"]),
            "median_ttft_ratio": median(lambda p: p["ttft_ratio"]),
            "median_decode_tok_s": {"ours": median(lambda p: p["ours"]["decode_tok_s"]),
                                    "hf": median(lambda p: p["hf"]["decode_tok_s"])},
            "median_ttft_s": {"ours": median(lambda p: p["ours"]["ttft_s"]), "hf": median(lambda p: p["hf"]["ttft_s"])},
            "all_same_tokens": all(p["same_tokens"] for p in pairs)}


def run_pdf(args, page: Path, runtime: str) -> dict:
    from PIL import Image

    pdf = page.with_suffix(".2pages.pdf")
    image = Image.open(page).convert("RGB")
    # at the app's render resolution, so each page comes back at the page image's own size
    from app.records.documents import RENDER_DPI

    image.save(pdf, save_all=True, append_images=[image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)],
               resolution=RENDER_DPI)
    cmd = [sys.executable, "-m", "app", "ocr", str(pdf), "--model", str(args.checkpoint), "--runtime", runtime,
           "--spec", "off", "--max-tokens", str(args.pdf_tokens), "--max-repeat", "0", "--format", "json"]
    load = os.getloadavg()
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout * 3, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - start
    pages = json.loads(proc.stdout)["pages"] if proc.returncode == 0 else []
    result = {"run": f"pdf:{runtime}", "wall_s": wall, "pages": len(pages),
              "pages_per_minute": 60 * len(pages) / wall, "loadavg_before": load,
              "stats": proc.stderr.strip().splitlines()[-3:]}
    print(f"pdf:{runtime:20} {len(pages)} pages in {wall:.1f} s (model load included): "
          f"{result['pages_per_minute']:.2f} pages/min, load avg before {load[0]:.2f}", flush=True)
    return result


def run_parts(checkpoint: Path, page: Path, dtype: str) -> dict:
    """The runtime's stages alone, at 1 and 2 intra-op threads: the vision tower on the page,
    the prompt's prefill, one decode step (1 row) and one verify forward of 4 rows (median of 9)."""
    import numpy as np
    import torch
    import transformers  # noqa: F401

    from engines.types import Request
    from engines.glm_ocr.engine import OcrEngine
    from engines.glm_ocr.image import load_image, preprocess
    from engines.glm_ocr.positions import text_positions, text_rope

    engine = OcrEngine.load(checkpoint, runtime="torch", dtype=dtype)
    rt = engine.runtime
    pixel_values, grid = preprocess(load_image(str(page)), engine.image_config)
    grid_thw = tuple(int(x) for x in grid[0])
    prompt = engine._prompt(Request(kind="ocr", image=str(page), max_tokens=8))
    out = {"image_tokens": int(np.prod(grid_thw)) // 4, "prompt_tokens": len(prompt.ids)}

    def timed(fn, repeat=1):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    p = len(prompt.ids)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        vision = timed(lambda: rt.encode_image(pixel_values, grid_thw))
        rt.reset()
        cos, sin = text_rope(prompt.positions.rows(0, p), rt.config.text)
        prefill = timed(lambda: rt.decode(prompt.embeds, 0, cos, sin))
        rows = {}
        for n in (1, 4):
            c, s_ = text_rope(text_positions(p, n, prompt.positions.delta), rt.config.text)
            emb = rt.embeddings[np.arange(n) + 100]

            def step():
                rt.logits(rt.decode(emb, p, c, s_))
            step()  # warm
            rows[n] = timed(step, 9)
        out[f"threads{threads}"] = {"vision_s": vision, "prefill_s": prefill, "decode_1_row_s": rows[1],
                                    "verify_4_rows_s": rows[4]}
        print(f"  {dtype} {threads} thread(s): vision {vision:.2f} s, prefill {prefill:.2f} s ({p} rows), "
              f"1 row {1000 * rows[1]:.0f} ms, 4 rows {1000 * rows[4]:.0f} ms", file=sys.stderr, flush=True)
    return out


def child(args) -> None:
    fields = args.child.split(":")
    kind, dtype = fields[:2]
    threads = fields[2] if len(fields) > 2 else "0"
    steps = [s if s == "auto" else int(s) for s in fields[3].split("+")] if len(fields) > 3 else []
    load = os.getloadavg()
    if kind == "parts":
        result = run_parts(args.checkpoint, args.page, dtype)
    elif kind == "pair":
        result = run_pair(args.checkpoint, args.page, dtype, int(threads), args.tokens, args.repeats)
    elif kind == "ours":
        result = run_ours(args.checkpoint, args.page, dtype, int(threads), args.tokens, steps, args.error_rate)
    else:
        result = run_hf(args.checkpoint, args.page, dtype, int(threads), args.tokens)
    result.update(run=args.child, peak_rss_gb=peak_rss_gb(), loadavg_before=load, loadavg_after=os.getloadavg())
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path,
                        default=Path.home() / ".cache" / "specscope-bench" / "glm-ocr-published-shape")
    parser.add_argument("--model", type=Path, default=None, help="an existing checkpoint instead of building one")
    parser.add_argument("--page", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--error-rate", type=float, default=0.25)
    parser.add_argument("--repeats", type=int, default=5, help="pairs of runs in a pair run")
    parser.add_argument("--runs", default=DEFAULT_RUNS)
    parser.add_argument("--pdf-tokens", type=int, default=32)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per run (a PDF run: 3x)")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from tests.engines.glm_ocr.published_shape import fixture_page, make_published_shape_glm_ocr

    if args.child:
        child(args)
        return
    if args.model:  # an existing checkpoint (a real GLM-OCR, or a tiny one to try the script)
        args.checkpoint = args.model
    else:
        t0 = time.perf_counter()
        make_published_shape_glm_ocr(args.checkpoint)
        print(f"checkpoint {args.checkpoint} ({time.perf_counter() - t0:.0f} s)", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="ocr-bench-"))
    text_page = fixture_page(scratch / "page-448.png")
    if args.page:
        page = args.page
    else:  # the tests' fixture page (tests/engines/test_published_layouts.py): a 160 x 90 image
        from tests.engines.glm_ocr.checkpoints import test_images

        page = scratch / "fixture-page.png"
        test_images(1)[0].save(page)
    if args.build_only:
        return
    results = []
    for run in [r for r in args.runs.split(",") if r]:
        run, _, page_name = run.partition("@")
        run_page = text_page if page_name == "448" else page
        if run.startswith("pdf:"):
            results.append(run_pdf(args, text_page, run.split(":")[1]))
            continue
        cmd = [sys.executable, __file__, "--child", run, "--checkpoint", str(args.checkpoint), "--page", str(run_page),
               "--tokens", str(args.tokens), "--error-rate", str(args.error_rate), "--repeats", str(args.repeats)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            print(f"{run}: no result within {args.timeout} s", flush=True)
            continue
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            print(f"{run}: failed\n{proc.stderr[-2000:]}", flush=True)
            continue
        result = json.loads(line[0][len("RESULT "):])
        result["page"] = run_page.name
        run = f"{run}@{page_name}" if page_name else run
        results.append(result)
        if run.startswith(("parts", "pair")):
            print(proc.stderr.strip(), flush=True)
        if run.startswith("pair"):
            print(f"{run:24} median of {len(result['pairs'])} pairs: decode {result['median_decode_ratio']:.2f}x "
                  f"transformers', TTFT {result['median_ttft_ratio']:.2f}x; same tokens: {result['all_same_tokens']}",
                  flush=True)
        for name, r in result.items():
            if isinstance(r, dict) and "ttft_s" in r:
                extra = f", {r['tokens_per_forward']:.2f} tok/forward" if "tokens_per_forward" in r else ""
                if name.endswith("auto"):
                    extra += f", k chosen {r['steps_chosen']}"
                print(f"{run:24} {name:18} ttft {r['ttft_s']:5.2f} s  decode {r['decode_tok_s']:5.2f} tok/s{extra}", flush=True)
        after_load = (f"  after load: RSS {result['rss_after_load_gb']:.2f} GB, peak {result['peak_after_load_gb']:.2f} GB"
                      if "rss_after_load_gb" in result else "")
        print(f"{run:24} load {result.get('load_s', 0):.1f} s  peak RSS {result['peak_rss_gb']:.2f} GB{after_load}  "
              f"load avg before {result['loadavg_before'][0]:.2f}", flush=True)
    out = ROOT / "bench" / "results" / f"ocr-fast-runtime-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"tokens": args.tokens, "page": str(page), "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
