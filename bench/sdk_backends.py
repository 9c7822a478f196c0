"""GLM-OCR's official SDK (glmocr 0.1.5, self-hosted mode) reading the same PDF through
`specscope serve` and through mlx-vlm's server (`mlx_vlm.server`, 0.7.10) on the same checkpoint
with the same SDK settings: pages per minute side by side (issue 48's goal: >= 1.5x mlx-vlm).

    python bench/sdk_backends.py [--pages 4] [--regions 8] [--tokens 48] [--repeats 3]
                                 [--max-workers 8] [--threads 2] [--spec off|mtp]

The checkpoint: GLM-OCR at the published shapes with random weights
(tests/engines/glm_ocr/published_shape.py), in a directory of its own that links those weights
and holds a tokenizer over the whole vocabulary (59,392 ids) with GLM's special tokens at the
published ids: the published-shape checkpoint's tiny byte-level tokenizer puts `<|image|>` at
270, where mlx-vlm's processor looks the image token up, while the config (and our runtime) say
59280, and mlx-vlm's detokenizer fails on an id beyond the tokenizer's. `specscope serve` reads
that directory as it is (its torch runtime computes in float32); mlx-vlm reads it converted to
float32 by its own tool (`mlx_vlm convert --dtype float32`): the stored bfloat16 on MLX's CPU
backend read a 448 x 448 page's prompt at about 1 token/s here.

mlx-vlm is a peer, not a dependency of Specscope: `mlx_vlm.server` and `mlx_vlm convert` run with
the python of a venv of their own outside the checkout, which `scripts/peer-mlx-vlm` makes on the
first run from its lock (requirements/peers/, made by scripts/lock from requirements/peers/
mlx-vlm.in) and prints; `specscope serve` runs from this venv.

The SDK: `pipeline.ocr_api` pointed at each server, `max_workers` regions at a time (each server
batches that many: serve `--max-batch`, mlx-vlm `--max-num-seqs`), `page_loader.max_tokens` =
--tokens, its other settings as shipped (T=0, top_k 1, repetition_penalty 1.1), the request
timeout raised so no region is retried for being slow. Random weights emit no end of sequence, so
every region decodes --tokens tokens on both servers (checked first with one region each; keep
--tokens < 64: serve's repetition stop needs 64 tokens of loop, mlx-vlm has none). Its layout
detector: torchvision, which the SDK's own needs, does not install here, so as in
tests/app/serve/test_glmocr_sdk.py the detector is the product's LayoutModel (PP-DocLayoutV3 at
its published size, bench/layout_stage.py's, random weights); its forward runs on every page, and
since random weights find random boxes the regions handed to the SDK are a fixed set
(bench/ocr_batch.py's crops, --regions of them), as in bench/ocr_document.py.

Every repeat renders a new document (its own text on every page), read by both servers in turn
(the order alternating), so neither server's caches (mlx-vlm's vision features and prompt prefixes)
see a page twice. Both servers run at once on loopback, each idle while the other is read, with
OpenBLAS preloaded (what `specscope` does for itself). Threads: serve's torch runtime and the
layout forward take --threads; mlx-vlm's OpenBLAS takes --mlx-blas-threads, 1 by default because
with 2 its decode was several times slower here (a 448 x 448 page, 16 tokens, float32, on a
2-core machine at load 2-4: 12.3 prompt / 2.96 decode tokens/s with 1, 5.8 / 0.3 with 2; MLX's
CPU backend runs its own thread beside OpenBLAS's). The load average is printed per run: on a
shared machine the figures move with it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

VENV = Path(sys.executable).parent  # the product's venv: `specscope serve`


@functools.cache
def mlx_vlm_python() -> str:
    """The python of mlx-vlm's own venv (scripts/peer-mlx-vlm installs it on the first call)."""
    out = subprocess.run([str(ROOT / "scripts" / "peer-mlx-vlm")], check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


# GLM's special tokens at the published ids: eos [59246, 59253], the image and video markers
# 59256-59259 and 59280-59281 are in the published config.json; the others follow GLM-4's order.
SPECIALS = {59246: "<|endoftext|>", 59247: "[MASK]", 59248: "[gMASK]", 59249: "[sMASK]", 59250: "<sop>",
            59251: "<eop>", 59252: "<|system|>", 59253: "<|user|>", 59254: "<|assistant|>",
            59255: "<|observation|>", 59256: "<|begin_of_image|>", 59257: "<|end_of_image|>",
            59258: "<|begin_of_video|>", 59259: "<|end_of_video|>", 59280: "<|image|>", 59281: "<|video|>"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=4, help="pages of the PDF (default 4)")
    ap.add_argument("--regions", type=int, default=8, help="regions a page (default 8, at most 12)")
    ap.add_argument("--tokens", type=int, default=48, help="the SDK's max_tokens: tokens a region (default 48, < 64)")
    ap.add_argument("--repeats", type=int, default=3, help="documents, each read by both servers (default 3)")
    ap.add_argument("--max-workers", type=int, default=8, help="the SDK's concurrent region requests, and each "
                    "server's batch (default 8)")
    ap.add_argument("--threads", type=int, default=2, help="serve's torch threads (--ocr-threads) and the layout "
                    "forward's (default 2)")
    ap.add_argument("--mlx-blas-threads", type=int, default=1, help="mlx-vlm's OpenBLAS threads (default 1: see the "
                    "module's docstring)")
    ap.add_argument("--spec", choices=["off", "mtp"], default="off", help="serve's speculation (default off: random "
                    "weights' drafts are not accepted, and mlx-vlm has no GLM-OCR drafter)")
    args = ap.parse_args(argv)
    if not 1 <= args.regions <= 12:
        ap.error("--regions must be 1..12 (bench/ocr_batch.py has 12 crops)")
    if not 1 <= args.tokens < 64:
        ap.error("--tokens must be 1..63 (serve stops a loop of 64 tokens or more; mlx-vlm does not)")
    if min(args.pages, args.repeats, args.max_workers, args.threads, args.mlx_blas_threads) < 1:
        ap.error("--pages, --repeats, --max-workers, --threads and --mlx-blas-threads must be >= 1")
    return args


# ---- the checkpoint, for both servers ----

def full_vocab_tokenizer(out: Path, vocab_size: int) -> None:
    """tokenizer.json + tokenizer_config.json: the byte-level BPE of the tests' tokenizer (ids
    0-255 the bytes), GLM's specials at their published ids, and a word `Ġw{id}` at every other
    id, so any id the model emits decodes (to " w{id}")."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from tests.engines.glm_ocr.checkpoints import _bytes_to_unicode

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    vocab.update({f"Ġw{i}": i for i in range(256, vocab_size) if i not in SPECIALS})
    vocab.update({token: i for i, token in SPECIALS.items()})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS.values()])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "backend": "tokenizers", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "model_max_length": 8192, "tokenizer_class": "TokenizersBackend"}, indent=2))


def checkpoints(cache: Path) -> tuple[Path, Path, Path]:
    """(GLM-OCR for serve, the same converted to float32 for mlx-vlm, PP-DocLayoutV3), each
    built once into the tests' cache folder."""
    from layout_stage import build
    from tests.engines.glm_ocr.published_shape import make_published_shape_glm_ocr

    weights = make_published_shape_glm_ocr(cache / "glm-ocr-published-shape")
    ocr = cache / "glm-ocr-published-shape-full-vocab"
    if not (ocr / ".complete").is_file():
        ocr.mkdir(parents=True, exist_ok=True)
        for f in weights.iterdir():
            if not f.name.startswith(("tokenizer", ".")) and not (ocr / f.name).exists():
                (ocr / f.name).symlink_to(f)
        full_vocab_tokenizer(ocr, json.loads((weights / "config.json").read_text())["text_config"]["vocab_size"])
        (ocr / ".complete").write_text("ok\n")
    mlx = cache / "glm-ocr-published-shape-full-vocab-mlx-float32"
    if not (mlx / "config.json").is_file():
        subprocess.run([mlx_vlm_python(), "-m", "mlx_vlm", "convert", "--hf-path", str(ocr),
                        "--mlx-path", str(mlx), "--dtype", "float32"], check=True)
    return ocr, mlx, build(cache / "pp-doclayout-v3-published-shape")


# ---- the document ----

def make_pdf(folder: Path, pages: int, salt: int) -> Path:
    """`pages` 448 x 448 pages (at 200 dpi, as the SDK renders PDFs) of text lines, every page's
    text its own (the page and `salt` in every line), so no page's image repeats an earlier one."""
    from PIL import Image, ImageDraw

    images = []
    for p in range(pages):
        image = Image.new("RGB", (448, 448), "white")
        draw = ImageDraw.Draw(image)
        for row, y in enumerate(range(16, 448 - 24, 22)):
            line = f"{row + 1:02d} [{salt}.{p}] The quick brown fox jumps over the lazy dog; {salt * 7 + p}."
            draw.text((16, y), line, fill="black")
        images.append(image)
    pdf = folder / f"document-{salt}.pdf"
    images[0].save(pdf, save_all=True, append_images=images[1:], resolution=200.0)
    return pdf


# ---- the SDK ----

def fixed_region_detector(layout_dir: Path, count: int):
    """A glmocr BaseLayoutDetector: the product's LayoutModel forward on every page (its cost),
    then the same `count` text regions on every page, in the SDK's format (bbox_2d in thousandths)."""
    from glmocr.layout.base import BaseLayoutDetector

    from engines.glm_ocr.layout import LayoutModel
    from ocr_batch import CROPS

    class FixedRegions(BaseLayoutDetector):
        batch_size = 1

        def start(self):
            self.model = LayoutModel.load(layout_dir)

        def stop(self):
            self.model = None

        def process(self, images, save_visualization=False, global_start_idx=0, use_polygon=False):
            pages = []
            for image in images:
                self.model.regions(image.convert("RGB"))  # timed with the page; its random boxes are not read
                w, h = image.size
                pages.append([{"index": i, "label": "text", "score": 1.0, "task_type": "text", "polygon": [],
                               "bbox_2d": [x0 * 1000 // 448, y0 * 1000 // 448, x1 * 1000 // 448, y1 * 1000 // 448]}
                              for i, (x0, y0, x1, y1) in enumerate(CROPS[:count])])
            return pages, {}

    return FixedRegions(None)


def sdk_config(url: str, model: str, args: argparse.Namespace):
    """The SDK's shipped config in self-hosted mode, pointed at `url`: the same for both servers
    but for the model name each serves under."""
    from urllib.parse import urlsplit

    from glmocr.config import load_config

    where = urlsplit(url)
    config = load_config(mode="selfhosted", ocr_api_host=where.hostname, ocr_api_port=where.port, model=model).pipeline
    config.max_workers = args.max_workers
    config.ocr_api.connect_timeout = 600  # the start-up check waits for a first answer
    config.ocr_api.request_timeout = 3600  # a slow region is waited for, never retried
    config.page_loader.max_tokens = args.tokens
    return config


def read_document(url: str, model: str, pdf: Path, layout: Path, args: argparse.Namespace) -> dict:
    """The whole document through the SDK: wall time from the request to the last page's result."""
    from glmocr.pipeline import Pipeline

    pipeline = Pipeline(sdk_config(url, model, args), layout_detector=fixed_region_detector(layout, args.regions))
    pipeline.start()
    try:
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        page = {"type": "image_url", "image_url": {"url": f"file://{pdf}"}}
        request = {"messages": [{"role": "user", "content": [page]}]}
        results = list(pipeline.process(request, save_layout_visualization=False))
        wall = time.perf_counter() - t0
    finally:
        pipeline.stop()
    regions = [r for result in results for page in result.json_result for r in page]
    read = sum(1 for r in regions if r.get("content"))
    return {"pages": args.pages, "regions": len(regions), "regions_read": read, "wall_s": round(wall, 1),
            "pages_per_min": round(60 * args.pages / wall, 3), "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2)}


def serve_prompt_tokens(ocr: Path, body: dict) -> int:
    """The prompt serve reads for a request `body`, counted with the product's own preprocessing
    and prompt (serve's usage says 0 prompt tokens for an OCR request)."""
    import base64
    import io

    from PIL import Image

    from engines.glm_ocr.config import GlmOcrConfig
    from engines.glm_ocr.image import ImageProcessorConfig, num_image_tokens, preprocess
    from engines.glm_ocr.prompts import GlmTokenizer, prompt_ids

    url = next(c["image_url"]["url"] for c in body["messages"][0]["content"] if c["type"] == "image_url")
    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
    _, grid = preprocess(image, ImageProcessorConfig.from_dir(ocr))
    config = GlmOcrConfig.load(ocr)
    return len(prompt_ids(GlmTokenizer(ocr), "text", num_image_tokens(grid, config.vision.spatial_merge_size),
                          config.image_token_id))


def check_server(url: str, model: str, pdf: Path, ocr: Path, args: argparse.Namespace) -> dict:
    """One region (the first crop of the first page), built by the SDK's own page loader, sent
    straight to the server: both must read the same prompt and decode exactly --tokens tokens.
    Also the server's warm-up."""
    from glmocr.dataloader.page_loader import PageLoader
    from ocr_batch import CROPS

    config = sdk_config(url, model, args)
    loader = PageLoader(config.page_loader)
    page = loader.load_pages(f"file://{pdf}")[0]
    x0, y0, x1, y1 = (v * page.width // 448 for v in CROPS[0])
    body = loader.build_request_from_image(page.crop((x0, y0, x1, y1)), "text") | {"model": model}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as response:
        answer = json.loads(response.read())
    usage = answer.get("usage") or {}
    prompt = usage.get("prompt_tokens") if model != ocr.name else serve_prompt_tokens(ocr, body)
    return {"prompt_tokens": prompt, "completion_tokens": usage.get("completion_tokens"),
            "finish_reason": answer["choices"][0].get("finish_reason"), "wall_s": round(time.perf_counter() - t0, 1)}


# ---- the servers ----

def start_servers(ocr: Path, mlx: Path, args: argparse.Namespace,
                  logs: Path) -> dict[str, tuple[subprocess.Popen, str, str]]:
    """{name: (process, url, model id)}; both up before anything is timed (their stderr in `logs`)."""
    from serve_concurrency import blas_env, free_port, wait_up

    env = {"specscope serve": blas_env() | {"OMP_NUM_THREADS": str(args.threads)},
           "mlx_vlm.server": blas_env() | {"OPENBLAS_NUM_THREADS": str(args.mlx_blas_threads)}}
    ports = {"specscope serve": free_port(), "mlx_vlm.server": free_port()}
    commands = {
        "specscope serve": [str(VENV / "specscope"), "serve", "--no-chat", "--ocr-model", str(ocr),
                            "--port", str(ports["specscope serve"]), "--spec", args.spec,
                            "--max-batch", str(args.max_workers), "--ocr-threads", str(args.threads)],
        "mlx_vlm.server": [mlx_vlm_python(), "-m", "mlx_vlm.server", "--model", str(mlx), "--host", "127.0.0.1",
                           "--port", str(ports["mlx_vlm.server"]), "--max-num-seqs", str(args.max_workers),
                           "--log-level", "WARNING"],
    }
    models = {"specscope serve": ocr.name, "mlx_vlm.server": str(mlx)}  # what each serves the model as
    running = {}
    try:
        for name, command in commands.items():
            with open(logs / f"{name.split()[0]}.log", "w") as log:
                proc = subprocess.Popen(command, env=env[name], stdout=subprocess.DEVNULL, stderr=log)
            running[name] = (proc, f"http://127.0.0.1:{ports[name]}", models[name])
            wait_up(running[name][1], proc, seconds=900)
    except BaseException:
        stop_servers(running)
        print(f"a server did not come up: its stderr is in {logs}", file=sys.stderr)
        raise
    return running


def stop_servers(running: dict) -> None:
    for proc, _, _ in running.values():
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch
    from glmocr.utils.logging import configure_logging

    from serve_concurrency import peak_rss_mb
    from tests.engines.glm_ocr.checkpoints import cache_root

    configure_logging("WARNING")
    torch.set_num_threads(args.threads)  # the layout forward, in this process
    ocr, mlx, layout = checkpoints(cache_root())
    scratch = Path(tempfile.mkdtemp(prefix="sdk-backends-"))
    print(f"{args.pages}-page PDF, {args.regions} regions x {args.tokens} tokens a page, SDK max_workers "
          f"{args.max_workers}, serve --spec {args.spec}, {args.threads} torch threads, {args.mlx_blas_threads} "
          f"mlx-vlm BLAS threads, {args.repeats} repeats; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    running = start_servers(ocr, mlx, args, scratch)
    runs: dict[str, list[dict]] = {name: [] for name in running}
    try:
        warm = make_pdf(scratch, 1, salt=0)
        for name, (_, url, model) in running.items():
            check = check_server(url, model, warm, ocr, args)
            print(f"  {name:<16} one region: {json.dumps(check)}", flush=True)
            if check["completion_tokens"] != args.tokens:
                print(f"  {name}: decoded {check['completion_tokens']} tokens, not {args.tokens}: "
                      "the two servers do not do the same work", flush=True)
        for repeat in range(args.repeats):
            pdf = make_pdf(scratch, args.pages, salt=repeat + 1)
            order = list(running) if repeat % 2 == 0 else list(reversed(running))
            for name in order:
                _, url, model = running[name]
                run = read_document(url, model, pdf, layout, args)
                runs[name].append(run)
                print(f"  {name:<16} repeat {repeat + 1}: {json.dumps(run)}", flush=True)
        peaks = {name: peak_rss_mb(proc.pid) for name, (proc, _, _) in running.items()}
    finally:
        stop_servers(running)
    median = {name: statistics.median(r["pages_per_min"] for r in rs) for name, rs in runs.items()}
    for name, rs in runs.items():
        print(f"{name:<16} {median[name]:.3f} pages/min (median of {[r['pages_per_min'] for r in rs]}), "
              f"peak RSS {peaks[name]} MB", flush=True)
    loads = [r[k] for rs in runs.values() for r in rs for k in ("load_before", "load_after")]
    print(f"specscope serve / mlx_vlm.server: {median['specscope serve'] / median['mlx_vlm.server']:.2f}x pages/min "
          f"(goal >= 1.5x); load {min(loads):.2f}-{max(loads):.2f}", flush=True)


if __name__ == "__main__":
    main()
