"""Tensor parallel on this machine (issue 24): what the ranks' communication costs, and tok/s of
`specscope serve --ranks 2` against one process, on the same checkpoint and workload.

The model: a random llama shaped like SmolLM2-135M's body (hidden 576, 30 layers; 4 query / 2
KV heads, so mlx-lm can split it in two -- SmolLM2's own 9 / 3 heads cannot be), written once
to /tmp/specscope-bench/tp-llama. Its vocabulary is the test word list (80 tokens), so the LM
head is nearly free and every forward is the body's work.

1. Collectives, under mlx.launch -n 2 --backend ring (loopback): the median time of the one
   message rank 0 sends per forward (all_sum of 1024 int32) and of the all_sum every split
   layer makes twice per forward (attention output, MLP output), at a decode step's size
   (1 x 1 x 576 floats), a batch-of-4 verify's (4 x 6 x 576) and a prefill chunk's (1 x 512 x 576).
   And one decode forward (one row, 20 tokens of context, median of 40) in one process and split
   over 2 ranks: unpinned with OpenBLAS's default threads, unpinned with one BLAS thread per
   rank, and pinned as `serve --ranks` pins them (each rank on its own core).
2. Serving: 8 requests of the test words, 128 tokens, T=0, 1 and 4 clients at a time, plain and
   n-gram (5 drafts), against `specscope serve` in one process and with --ranks 2 (both
   --max-batch 4); aggregate tok/s, and the ranks' own totals (compute and wait seconds per rank,
   rank 0's broadcast seconds) from /v1/spec_decode/metrics.

3. The draft model on rank 0 only (option A, the default) against on every rank (option B,
   `--drafter-on every-rank`), `--drafters` (this part alone): the same serving workload with
   `--spec draft` (4 drafts) and a draft model made of the target's first 4 layers (its
   embedding, final norm and head kept: the layer-skip draft of bench/smollm2_truncated_draft.py),
   in one process and over 2 ranks under A and B; per rank and forward, the time in the target's
   forward, in the draft model, and rank 0's broadcasts. `--drafters --seeded`: T=0.8 requests
   with seeds instead (in a batch the controller caps a T=0 row's drafts by this machine's step
   costs -- a poor drafter's to almost none -- and leaves a seeded row's alone).

This machine has 2 cores, shared by both ranks: a split forward is half the work per rank but
the ranks run side by side on the same two cores, and every layer waits on loopback twice.
Expect slower, not faster; what tensor parallel buys here is memory (each rank holds half).

    python bench/tensor_parallel.py [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = Path("/tmp/specscope-bench/tp-llama")
HIDDEN, LAYERS = 576, 30
DRAFT_LAYERS = 4
DRAFT = Path(f"/tmp/specscope-bench/tp-llama-first{DRAFT_LAYERS}")
PROMPTS = ["the cat and the dog see the cat and the dog see the cat", "a red bird and an old fish",
           "the big house on the old road and the big house", "see the moon"]


def build_model() -> None:
    if (MODEL / "config.json").exists():
        return
    from tests.engines.mlx_chat.checkpoints import make_tiny_llama

    make_tiny_llama(MODEL, hidden=HIDDEN, layers=LAYERS)


def build_draft() -> None:
    """The target's first DRAFT_LAYERS layers, its embedding, final norm and head: a small drafter
    with the target's tokenizer (same files), without any training."""
    import shutil

    from safetensors.numpy import load_file, save_file

    if (DRAFT / "config.json").exists():
        return
    DRAFT.mkdir(parents=True, exist_ok=True)
    for f in MODEL.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, DRAFT / f.name)
    config = json.loads((MODEL / "config.json").read_text())
    config["num_hidden_layers"] = DRAFT_LAYERS
    (DRAFT / "config.json").write_text(json.dumps(config, indent=1))
    weights = {k: w for k, w in load_file(str(MODEL / "model.safetensors")).items()
               if ".layers." not in k or int(k.split(".layers.")[1].split(".")[0]) < DRAFT_LAYERS}
    save_file(weights, str(DRAFT / "model.safetensors"), metadata={"format": "pt"})


# -- 1. collectives (this file runs itself under mlx.launch with --collectives) -------------------
def collectives() -> None:
    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend="ring")

    def median_ms(make, reps: int = 200) -> float:
        times = []
        for _ in range(reps):
            x = make()
            mx.eval(x)
            t0 = time.perf_counter()
            mx.eval(mx.distributed.all_sum(x, group=group, stream=mx.cpu))
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000

    sizes = {"message (1024 int32)": lambda: mx.zeros((1024,), dtype=mx.int32),
             "layer all_sum, decode (1x1x576 f32)": lambda: mx.zeros((1, 1, HIDDEN)),
             "layer all_sum, verify 4x6 (4x6x576 f32)": lambda: mx.zeros((4, 6, HIDDEN)),
             "layer all_sum, prefill chunk (1x512x576 f32)": lambda: mx.zeros((1, 512, HIDDEN))}
    out = {name: median_ms(make) for name, make in sizes.items()}
    if group.rank() == 0:
        print(json.dumps(out), flush=True)


def forward(ranks: int) -> None:
    """Median time of one decode forward, this process's shard (ranks > 1) or the whole model."""
    import mlx.core as mx

    from engines.batch.cache import BatchCache
    from engines.mlx_chat.loading import load_model

    rank = 0
    if ranks > 1:
        from engines.distributed.engine import load_shard

        group = mx.distributed.init(strict=True, backend="ring")
        model, rank = load_shard(str(MODEL), group).model, group.rank()
    else:
        model = load_model(str(MODEL)).model
    cache = BatchCache(model, 1)
    cache.begin(20)
    mx.eval(model(mx.array([[3] * 20], dtype=mx.uint32), cache=cache.layers))
    cache.settle([20])
    times = []
    for _ in range(40):
        t0 = time.perf_counter()
        cache.begin(1)
        mx.eval(model(mx.array([[5]], dtype=mx.uint32), cache=cache.layers))
        cache.settle([1])
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"forward_ms": statistics.median(times) * 1000}), flush=True)


def measure_forwards() -> dict:
    out = {"1 process": _run([sys.executable, __file__, "--forward", "1"], blas_env())["forward_ms"]}
    for name, extra in [("2 ranks, unpinned, default BLAS threads", {}),
                        ("2 ranks, unpinned, 1 BLAS thread each", {"OPENBLAS_NUM_THREADS": "1"}),
                        ("2 ranks, pinned (as serve --ranks)", {"OPENBLAS_NUM_THREADS": "1", "TP_BENCH_PIN": "1"})]:
        out[name] = _launch(["--forward", "2"], blas_env() | extra)["forward_ms"]
    return out


def _run(cmd: list[str], env: dict) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    line = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if not line:
        raise RuntimeError(out.stderr)
    return json.loads(line[-1])


def _launch(args: list[str], env: dict) -> dict:
    launcher = Path(sys.executable).with_name("mlx.launch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return _run([str(launcher), "-n", "2", "--backend", "ring", "--starting-port", str(port),
                 "--python", sys.executable, "--", __file__, *args], env)


def measure_collectives() -> dict:
    return _launch(["--collectives"], blas_env())



# -- 2. serving ---------------------------------------------------------------------------------
def blas_env() -> dict:
    from engines.cpu import blas as cpu_blas

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    blas = cpu_blas.choose().path  # the BLAS our own processes run with
    if blas:
        env["LD_PRELOAD"] = blas
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def serve(ranks: int, port: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "app", "serve", "--model", str(MODEL), "--port", str(port), "--max-batch", "4",
           "--queue-size", "16", *extra]
    if ranks > 1:
        cmd += ["--ranks", str(ranks)]
    proc = subprocess.Popen(cmd, env=blas_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            get(f"http://127.0.0.1:{port}/health")
            return proc
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the server did not come up")


def measure_serving(ranks: int, levels: list[int], n: int, max_tokens: int, specs=None,
                    extra: tuple[str, ...] = (), label: str = "", seeded: bool = False) -> list[dict]:
    """seeded: T=0.8 with a seed per request (a seeded request keeps its k in a batch) instead of T=0."""
    from engines.concurrent_runs import run_clients, summarize
    from engines.remote.engine import RemoteEngine
    from engines.types import Request, Sampling, SpecConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = serve(ranks, port, extra)
    rows = []
    try:
        make = lambda: RemoteEngine.load(url)  # noqa: E731
        for spec in specs or (SpecConfig("off", 0), SpecConfig("ngram", 5)):
            requests = [(f"p{i}", Request(prompt=PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens, spec=spec,
                                          sampling=Sampling(0.8, top_p=0.95, seed=1000 + i) if seeded else Sampling()))
                        for i in range(n)]
            run_clients(make, requests[:2], 2)  # warm-up
            for c in levels:
                settle = lambda: time.sleep(1.5 if ranks > 1 else 0)  # noqa: E731  (an idle heartbeat gathers the ranks' totals)
                settle()
                before = get(f"{url}/v1/spec_decode/metrics")
                records, wall = run_clients(make, requests, c)
                settle()
                after = get(f"{url}/v1/spec_decode/metrics")
                s = summarize(records, wall)
                row = {"ranks": ranks, "spec": spec.method, "concurrency": c, "seeded": seeded, **s,
                       "texts": [r.text for r in records]}
                if label:
                    row["drafter_on"] = label
                if ranks > 1:
                    keys = ("forwards", "compute_s", "wait_s", "draft_s", "drafted")
                    row["rank_times"] = [{k: round(t1[k] - t0.get(k, 0), 4) for k in keys}
                                         for t0, t1 in zip(before.get("rank_times") or [{}] * ranks, after["rank_times"])]
                    row["broadcast_s"] = round(after["rank_broadcast_s"] - before["rank_broadcast_s"], 4)
                    row["broadcasts"] = after["rank_broadcasts"] - before["rank_broadcasts"]
                rows.append(row)
                print(f"ranks={ranks} {label} {spec.method:<5} c={c}: {s['aggregate_tok_s']:6.1f} tok/s aggregate, "
                      f"acceptance {s['acceptance']}"
                      + (f"; rank times {row['rank_times']}, broadcasts {row['broadcasts']} in {row['broadcast_s']} s"
                         if ranks > 1 else ""), file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return rows


def measure_drafters(levels: list[int], n: int, max_tokens: int, out: Path, seeded: bool = False) -> None:
    """Part 3: one process, then 2 ranks with the draft model on rank 0 (A), then on every rank (B).
    seeded: T>0 requests with seeds -- in a batch the controller caps a T=0 row's k by this machine's
    step costs (with a poor drafter, to nothing), but leaves a seeded row's k alone."""
    from engines.types import SpecConfig

    build_draft()
    specs = (SpecConfig("draft", 4),)
    extra = ("--spec", "draft", "--draft-model", str(DRAFT))
    rows = measure_serving(1, levels, n, max_tokens, specs, extra, "one process", seeded)
    rows += measure_serving(2, levels, n, max_tokens, specs, extra, "rank0", seeded)
    rows += measure_serving(2, levels, n, max_tokens, specs, extra + ("--drafter-on", "every-rank"), "every-rank", seeded)
    for row in rows:
        alone = next(r for r in rows if r["ranks"] == 1 and r["concurrency"] == row["concurrency"])
        row["identical_to_one_process"] = row["texts"] == alone["texts"]
        if row["ranks"] > 1:  # per forward (rank 0's count: a forward runs on every rank), in ms
            forwards = row["rank_times"][0]["forwards"]
            row["per_forward_ms"] = {
                "compute": [round(1000 * t["compute_s"] / forwards, 1) for t in row["rank_times"]],
                "draft": [round(1000 * t["draft_s"] / forwards, 1) for t in row["rank_times"]],
                "broadcast": round(1000 * row["broadcast_s"] / forwards, 2),
                "broadcasts_per_forward": round(row["broadcasts"] / forwards, 2)}
            print(f"  {row['drafter_on']} c={row['concurrency']}: per forward {row['per_forward_ms']}, drafted "
                  f"{[t['drafted'] for t in row['rank_times']]}, identical {row['identical_to_one_process']}",
                  file=sys.stderr, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"tensor_parallel_drafters{'_seeded' if seeded else ''}.json"
    path.write_text(json.dumps({"layers": LAYERS, "draft_layers": DRAFT_LAYERS, "hidden": HIDDEN,
                                "serving": [{k: v for k, v in r.items() if k != "texts"} for r in rows]}, indent=1))
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--collectives", action="store_true", help=argparse.SUPPRESS)  # a rank of part 1
    p.add_argument("--forward", type=int, default=0, help=argparse.SUPPRESS)  # a process of part 1
    p.add_argument("--levels", default="1,4")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--forwards-only", action="store_true", help="parts 1 only: collectives and one forward")
    p.add_argument("--drafters", action="store_true", help="part 3 only: the draft model on rank 0 vs every rank")
    p.add_argument("--seeded", action="store_true", help="part 3 with seeded T=0.8 requests instead of T=0")
    args = p.parse_args()
    if args.collectives:
        return collectives()
    if args.forward:
        if os.environ.get("TP_BENCH_PIN") and "MLX_RANK" in os.environ:
            from engines.distributed.launch import pin_local_rank

            pin_local_rank(int(os.environ["MLX_RANK"]), 2)
        return forward(args.forward)
    build_model()
    if args.drafters:
        return measure_drafters([int(x) for x in args.levels.split(",")], args.requests, args.max_tokens, Path(args.out),
                                args.seeded)
    comm = measure_collectives()
    for name, ms in comm.items():
        print(f"{name:<48} {ms:7.3f} ms (median)", file=sys.stderr, flush=True)
    forwards = measure_forwards()
    for name, ms in forwards.items():
        print(f"decode forward, {name:<40} {ms:7.1f} ms (median)", file=sys.stderr, flush=True)
    if args.forwards_only:
        return
    levels = [int(x) for x in args.levels.split(",")]
    rows = measure_serving(1, levels, args.requests, args.max_tokens)
    rows += measure_serving(2, levels, args.requests, args.max_tokens)
    for row in rows[len(rows) // 2:]:  # T=0: the ranks answer what one process answers
        alone = next(r for r in rows if r["ranks"] == 1 and r["spec"] == row["spec"]
                     and r["concurrency"] == row["concurrency"])
        row["identical_to_one_process"] = row["texts"] == alone["texts"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tensor_parallel.json"
    path.write_text(json.dumps({"collectives_ms": comm, "decode_forward_ms": forwards, "layers": LAYERS, "hidden": HIDDEN,
                                "serving": [{k: v for k, v in r.items() if k != "texts"} | {
                                    "identical_to_one_process": r.get("identical_to_one_process")} for r in rows]},
                               indent=1))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
