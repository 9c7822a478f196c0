"""Many requests at once: `specscope serve` (one at a time, and batched, speculation off / n-gram)
beside mlx_lm.server (batched plain decoding) on the same SmolLM2 weights, through the same
client (engines/concurrent_runs.py over engines.remote), one server at a time, in one run.

Workload (issue "Many requests at once"): the copy-heavy prompt set cycled to 8 requests,
128 tokens, T=0, c clients at a time (closed loop). Every server runs with the same
environment: OpenBLAS preloaded (what `specscope` does for itself, app/launch.py), so MLX's CPU
matmuls go to the same BLAS. mlx_lm.server reads the HF-layout copy that
bench/smollm2_hf_layout.py writes from the GGUF -- the very float32 weights our loader runs.

    python bench/serve_concurrency.py [--levels 1,2,4,8] [--servers NAME,...] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engines.types import Request, SpecConfig  # noqa: E402
from engines.concurrent_runs import run_clients, summarize  # noqa: E402

VENV = Path(sys.executable).parent
HF_COPY = Path("/tmp/specscope-bench/smollm2-hf")
DRAFT = HF_COPY.parent / "smollm2-first8"


def servers(port: int) -> dict[str, tuple[list[str], SpecConfig]]:
    serve = [str(VENV / "specscope"), "serve", "--port", str(port), "--queue-size", "16"]
    return {
        "specscope-ngram-b1": (serve + ["--spec", "ngram", "--steps", "5", "--max-batch", "1"], SpecConfig("ngram", 5)),
        "specscope-ngram-b8": (serve + ["--spec", "ngram", "--steps", "5", "--max-batch", "8"], SpecConfig("ngram", 5)),
        "specscope-off-b8": (serve + ["--spec", "off", "--max-batch", "8"], SpecConfig("off", 0)),
        # a poor draft model (SmolLM2's first 8 layers, bench/smollm2_truncated_draft.py: drafts
        # rarely accepted): what the batch controller does with drafts that do not pay
        "specscope-draft-b8": (serve + ["--spec", "draft", "--steps", "3", "--draft-model", str(DRAFT), "--max-batch", "8"],
                               SpecConfig("draft", 3, draft_model=str(DRAFT))),
        "mlx_lm.server": ([str(VENV / "python"), "-m", "mlx_lm.server", "--model", str(HF_COPY), "--port", str(port),
                           "--max-tokens", "128"], SpecConfig("off", 0)),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the server did not come up")


def peak_rss_mb(pid: int) -> int | None:
    """The server's peak resident memory so far (Linux: VmHWM of it and its children's main
    process; `specscope` re-executes itself, so the pid is the serving process)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def lane_bound(latencies: list[float], clients: int) -> float:
    """The closed loop's wall time at `clients` clients were every request to take its lone
    latency: each client takes the next request as it finishes its last, so the level lasts as
    long as its busiest client's requests. A batched forward costs at least a lone one of the
    same width, so a level ends sooner only where the batch runs a request differently from
    alone -- the controller dropping drafts that cost more than they bring (the poor draft
    model's rows) -- or finds prompts cached that c=1 read (a few tenths of a second each)."""
    free = [0.0] * clients
    for latency in latencies:
        i = free.index(min(free))
        free[i] += latency
    return max(free)


def spec_stats(url: str) -> dict | None:
    """Our server's /v1/spec_decode/metrics (None for a server without it)."""
    try:
        return json.loads(urllib.request.urlopen(f"{url}/v1/spec_decode/metrics", timeout=5).read())
    except (OSError, ValueError):
        return None


def drafting(before: dict | None, after: dict | None) -> dict:
    """What the batch controller chose over a level: drafts asked per row and step (its cap,
    where it capped), and the share of row-steps that drafted nothing."""
    if not before or not after or "total_asked" not in after:
        return {}
    steps = after["total_steps"] - before["total_steps"]
    if not steps:
        return {}
    return {"k_mean": (after["total_asked"] - before["total_asked"]) / steps,
            "no_draft_share": (after["total_fallback_steps"] - before["total_fallback_steps"]) / steps}


def blas_env() -> dict:
    from engines.cpu import blas as cpu_blas

    # mlx_lm.server's /v1/models scans the hub cache and fails when there is none: an empty one
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_CACHE=str(Path("/tmp/specscope-bench/hub-cache")))
    Path(env["HF_HUB_CACHE"]).mkdir(parents=True, exist_ok=True)
    blas = cpu_blas.choose().path  # the BLAS our own processes run with
    if blas:
        env["LD_PRELOAD"] = blas
    return env


def workload(n: int, max_tokens: int, spec: SpecConfig) -> list[tuple[str, Request]]:
    import resources

    prompts = json.loads(resources.path("prompts", "copy_heavy.json").read_text())["prompts"]
    return [(prompts[i % len(prompts)]["name"], Request(prompt=prompts[i % len(prompts)]["prompt"], max_tokens=max_tokens,
                                                         spec=spec)) for i in range(n)]


def measure(name: str, cmd: list[str], spec: SpecConfig, port: int, levels: list[int], n: int,
            max_tokens: int) -> list[dict]:
    from engines.remote.engine import RemoteEngine

    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(cmd, env=blas_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_up(url, proc)
        make = lambda: RemoteEngine.load(url)  # noqa: E731
        requests = workload(n, max_tokens, spec)
        run_clients(make, requests[:2], 2)  # warm-up (and every kernel shape of a 2-batch)
        rows = []
        for c in levels:
            before = spec_stats(url)
            records, wall = run_clients(make, requests, c)
            s = summarize(records, wall) | drafting(before, spec_stats(url))
            rows.append({"server": name, "concurrency": c, **s, "texts": [r.text for r in records],
                         "latencies_s": [r.latency_s for r in records]})
            print(f"{name:<32} c={c}: {s['aggregate_tok_s']:6.1f} tok/s aggregate, per request "
                  f"{s['per_request_decode_tok_s_median'] or 0:5.1f}, TTFT p50 {s['ttft_p50_s']:.2f} s, "
                  f"latency p50 {s['latency_p50_s']:.2f} / p95 {s['latency_p95_s']:.2f} s, "
                  f"acceptance {s['acceptance'] if s['acceptance'] is not None else '-'}"
                  + (f", drafts asked per row-step {s['k_mean']:.2f}, steps without drafts {s['no_draft_share']:.0%}"
                     if s.get("k_mean") is not None else ""), file=sys.stderr, flush=True)
        alone = next((r for r in rows if r["concurrency"] == 1), None)
        for row in rows:
            if alone is not None and row["concurrency"] > 1:
                wall = lane_bound(alone["latencies_s"], row["concurrency"])
                row["lane_bound_tok_s"] = row["tokens"] / wall
                print(f"{name:<32} c={row['concurrency']}: were every request as fast as alone, the level "
                      f"would still take {wall:.1f} s (its busiest client): "
                      f"{row['lane_bound_tok_s']:.1f} tok/s aggregate", file=sys.stderr)
        peak = peak_rss_mb(proc.pid)
        for row in rows:
            row["server_peak_rss_mb"] = peak
        print(f"{name:<32} peak RSS {peak} MB", file=sys.stderr)
        return rows
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--servers", default=None, help="comma-separated: specscope-ngram-b1, specscope-ngram-b8, specscope-off-b8, "
                    "specscope-draft-b8, mlx_lm.server (default: all)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    if not (HF_COPY / "config.json").exists():
        from bench.smollm2_hf_layout import main as export

        export(HF_COPY)
    if not (DRAFT / "config.json").exists():
        from bench.smollm2_truncated_draft import truncated

        truncated(8, DRAFT)
    levels = [int(x) for x in args.levels.split(",")]
    port = free_port()
    table = servers(port)
    chosen = args.servers.split(",") if args.servers else list(table)
    rows = []
    for name in chosen:
        cmd, spec = table[name]
        rows += measure(name, cmd, spec, port, levels, args.requests, args.max_tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"serve-concurrency-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"load": os.getloadavg(), "rows": rows}, indent=1))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
