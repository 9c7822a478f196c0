"""Pipeline parallel on this machine (issue 24): what moving the hidden state costs, and tok/s
of `specscope serve --ranks 2 --split pipeline` against one process and against tensor parallel.

1. send/recv, under mlx.launch -n 2 --backend ring (loopback): the median time to move one
   forward's hidden state from rank 1 to rank 0 (`mx.distributed.send` / `recv`, float32) at a
   decode step's size (1 x 1 x 576), a batch-of-4 verify's (4 x 6 x 576) and a prefill chunk's
   (1 x 512 x 576) -- once per forward, where tensor parallel makes 2 all_sums per layer.
2. Serving, the SmolLM2-shaped random llama of bench/tensor_parallel.py (hidden 576, 30
   layers): one process, --ranks 2 tensor parallel, --ranks 2 pipeline (rank 1 layers 0-14,
   rank 0 15-29); plain and n-gram (5 drafts), 1 and 4 clients.
3. Serving the tiny Gemma 4 pair with its trained assistant (MTP, 3 drafts; the assistant of
   tests/engines/mlx_chat/gemma4/trained.py, from its cache): one process against --ranks 2 (pipeline).

Two ranks on this machine share its 2 cores, and a pipeline's stages run one after the other
(no micro-batching): what it buys is memory (each rank holds its layers), not speed.

    python bench/pipeline.py [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import tensor_parallel as tp  # noqa: E402  (its model, its environment, its helpers)

GEMMA = Path("/tmp/specscope-bench/gemma4-pair")
GEMMA_PROMPTS = ["w10 w20 w30", "w40 w50 w60", "w70 w80 w90", "w15 w25 w35"]


def transfers() -> None:
    """A rank of part 1."""
    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend="ring")
    out = {}
    for name, shape in [("decode (1x1x576 f32)", (1, 1, tp.HIDDEN)), ("verify 4x6 (4x6x576 f32)", (4, 6, tp.HIDDEN)),
                        ("prefill chunk (1x512x576 f32)", (1, 512, tp.HIDDEN))]:
        times = []
        for _ in range(200):
            x = mx.zeros(shape)
            mx.eval(x)
            mx.eval(mx.distributed.all_sum(mx.zeros((1,)), group=group, stream=mx.cpu))  # start together
            t0 = time.perf_counter()
            if group.rank() == 1:
                mx.eval(mx.distributed.send(x, 0, group=group, stream=mx.cpu))
            else:
                mx.eval(mx.distributed.recv(shape, mx.float32, 1, group=group, stream=mx.cpu))
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times) * 1000
    if group.rank() == 0:
        print(json.dumps(out), flush=True)


def build_gemma() -> tuple[Path, Path]:
    target, assistant = GEMMA / "target", GEMMA / "assistant"
    if (assistant / "model.safetensors").exists():
        return target, assistant
    from engines.mlx_chat.engine import ChatEngine
    from tests.engines.mlx_chat.gemma4.checkpoints import DENSE_TARGET, AssistantSpec, build_assistant, build_target
    from tests.engines.mlx_chat.gemma4.trained import trained_assistant

    build_target(target, DENSE_TARGET)
    build_assistant(GEMMA / "random-assistant", target, AssistantSpec())
    drafter = trained_assistant(ChatEngine.load(str(target)), target, GEMMA / "random-assistant")
    import shutil

    shutil.copytree(GEMMA / "random-assistant", assistant)
    for f in assistant.glob("model*.safetensors*"):
        f.unlink()
    drafter.save_weights(str(assistant / "model.safetensors"))
    return target, assistant


def serve(model: Path, port: int, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "app", "serve", "--model", str(model), "--port", str(port), "--max-batch", "4",
           "--queue-size", "16", *extra]
    proc = subprocess.Popen(cmd, env=tp.blas_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {cmd}")
        try:
            tp.get(f"http://127.0.0.1:{port}/health")
            return proc
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the server did not come up")


def measure(name: str, model: Path, extra: list[str], specs, prompts, levels, n: int, max_tokens: int) -> list[dict]:
    from engines.concurrent_runs import run_clients, summarize
    from engines.remote.engine import RemoteEngine
    from engines.types import Request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = serve(model, port, extra)
    rows = []
    try:
        make = lambda: RemoteEngine.load(url)  # noqa: E731
        for spec in specs:
            requests = [(f"p{i}", Request(prompt=prompts[i % len(prompts)], max_tokens=max_tokens, spec=spec))
                        for i in range(n)]
            run_clients(make, requests[:2], 2)  # warm-up
            for c in levels:
                before = tp.get(f"{url}/v1/spec_decode/metrics")
                records, wall = run_clients(make, requests, c)
                after = tp.get(f"{url}/v1/spec_decode/metrics")
                row = {"server": name, "spec": spec.method, "concurrency": c, **summarize(records, wall),
                       "texts": [r.text for r in records],
                       "accepted": after["total_accepted"] - before["total_accepted"],
                       "proposed": after["total_proposed"] - before["total_proposed"]}
                if after.get("rank_times"):
                    row["rank_times"] = [{k: round(t1[k] - t0.get(k, 0), 4) for k in ("forwards", "compute_s", "wait_s")}
                                         for t0, t1 in zip(before.get("rank_times") or [{}] * 2, after["rank_times"])]
                    row["broadcast_s"] = round(after["rank_broadcast_s"] - before["rank_broadcast_s"], 4)
                    row["broadcasts"] = after["rank_broadcasts"] - before["rank_broadcasts"]
                rows.append(row)
                print(f"{name:<22} {spec.method:<5} c={c}: {row['aggregate_tok_s']:6.1f} tok/s"
                      f" accepted {row['accepted']}/{row['proposed']}" + (f"; ranks {row['rank_times']}"
                                                                           if "rank_times" in row else ""),
                      file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return rows


def main() -> None:
    from engines.types import SpecConfig

    p = argparse.ArgumentParser()
    p.add_argument("--transfers", action="store_true", help=argparse.SUPPRESS)  # a rank of part 1
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    if args.transfers:
        return transfers()
    tp.build_model()
    launcher = Path(sys.executable).with_name("mlx.launch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moved = tp._run([str(launcher), "-n", "2", "--backend", "ring", "--starting-port", str(port),
                     "--python", sys.executable, "--", __file__, "--transfers"], tp.blas_env())
    for name, ms in moved.items():
        print(f"send/recv {name:<32} {ms:7.3f} ms (median)", file=sys.stderr, flush=True)
    plain_ngram = (SpecConfig("off", 0), SpecConfig("ngram", 5))
    rows = []
    for name, extra in [("llama, 1 process", []), ("llama, 2 ranks tensor", ["--ranks", "2", "--split", "tensor"]),
                        ("llama, 2 ranks pipeline", ["--ranks", "2", "--split", "pipeline"])]:
        rows += measure(name, tp.MODEL, extra, plain_ngram, tp.PROMPTS, [1, 4], args.requests, args.max_tokens)
    target, assistant = build_gemma()
    mtp = (SpecConfig("mtp", 3, draft_model=str(assistant)),)
    for name, extra in [("gemma4 pair, 1 process", []), ("gemma4 pair, 2 ranks", ["--ranks", "2"])]:
        rows += measure(name, target, ["--draft-model", str(assistant), "--spec", "mtp", *extra], mtp, GEMMA_PROMPTS,
                        [1, 4], args.requests, args.max_tokens)
    for row in rows:
        alone = next(r for r in rows if r["server"].split(",")[0] == row["server"].split(",")[0]
                     and r["server"].endswith("1 process") and r["spec"] == row["spec"]
                     and r["concurrency"] == row["concurrency"])
        row["identical_to_one_process"] = row["texts"] == alone["texts"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pipeline.json"
    path.write_text(json.dumps({"send_recv_ms": moved, "serving": [{k: v for k, v in r.items() if k != "texts"}
                                                                   for r in rows]}, indent=1))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
