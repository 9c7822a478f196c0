"""Host overhead per round: the share of a speculative round's wall time not spent evaluating
the model.

A real n-gram session runs; each decode round verified n = 1 + drafts tokens at some context
length. Then the bare target forward for each (n, context length) is timed on its own (fresh
cache prefilled to that length, median of repeats). Overhead = 1 - sum(isolated forwards) /
sum(round wall times): everything the loop does besides the model (drafting, verification
bookkeeping, rollback, detokenizing, building the Round) that the pipelining did not hide.

    python bench/chat_host_overhead.py [MODEL] [--tokens N]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()  # the process environment `specscope` runs in (engines/cpu: MLX on OpenBLAS)


def main() -> None:
    import json

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    import resources
    from engines.types import Request, SpecConfig
    from engines.factory import load_engine
    from engines.mlx_chat.models import default_chat_model

    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompt", default="repeat-recipe", help="a name from the copy-heavy set")
    args = ap.parse_args()

    engine = load_engine("chat", args.model or str(default_chat_model()))
    prompts = {p["name"]: p["prompt"] for p in json.loads(resources.path("prompts", "copy_heavy.json").read_text())["prompts"]}
    request = Request(prompt=prompts[args.prompt], max_tokens=args.tokens, spec=SpecConfig(method="ngram", steps=args.steps))
    list(engine.generate(request))  # warm-up
    rounds = list(engine.generate(request))
    prompt_ids = engine.prompt_ids(request)
    tokens = prompt_ids + [t for r in rounds for t in r.tokens]

    # Each decode round's forward: n tokens on top of a cache of `length` tokens.
    shapes, length = [], len(prompt_ids)
    for r in rounds:
        if not r.prefill:
            shapes.append((1 + r.proposed, length))
        length += len(r.tokens)

    def isolated(n: int, length: int, repeats: int = 3) -> float:
        times = []
        for _ in range(repeats):
            cache = make_prompt_cache(engine.model)
            mx.eval(engine.model(mx.array([tokens[:length]]), cache=cache))
            chunk = mx.array([tokens[length : length + n] + [0] * (n - len(tokens[length : length + n]))])
            t0 = time.perf_counter()
            mx.eval(mx.argmax(engine.model(chunk, cache=cache)[0], axis=-1))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    # Time each distinct shape once; context lengths are bucketed to 32 to keep it quick.
    memo: dict[tuple[int, int], float] = {}
    model_s = 0.0
    for n, length in shapes:
        key = (n, length // 32 * 32)
        if key not in memo:
            memo[key] = isolated(*key)
        model_s += memo[key]
    wall_s = sum(r.wall_s for r in rounds if not r.prefill)
    decode = [r for r in rounds if not r.prefill]
    print(f"model: {engine.model_path}  prompt: {args.prompt}  steps: {args.steps}")
    print(f"rounds: {len(decode)}  tokens: {sum(len(r.tokens) for r in decode)}  "
          f"tau: {sum(len(r.tokens) for r in decode) / len(decode):.2f}")
    print(f"round wall: {1000 * wall_s / len(decode):.1f} ms/round  isolated forward: {1000 * model_s / len(decode):.1f} ms/round")
    print(f"host overhead: {100 * (1 - model_s / wall_s):.1f}% of round time")


if __name__ == "__main__":
    main()
