"""The BLAS MLX's CPU backend multiplies with, on SmolLM2 (the embedded default): the target's
forward of 1..16 tokens (a decode step, a verify of 1..15 drafts; 8 and 16 rows are also a
batch of 4 or 8 verifying one draft each) and the 49152 x 576 head product alone, under each
BLAS in its own process, alternating, median of the repetitions.

    python bench/cpu_blas.py [--reps 30] [--context 200] [--rounds 2] [--preload NAME=LIB[:LIB...]]

The BLASes (engines/cpu/blas.py): `wheel` (scipy-openblas32's renamed copy, what specscope
uses), `system` (the system's OpenBLAS, when installed), `reference` (MLX's own netlib BLAS);
--preload adds others by their LD_PRELOAD (say, a kernel ahead of a BLAS). Prints milliseconds,
a forward of n tokens against one of 1 (what a round with n-1 drafts costs in plain steps) and
each BLAS against the first. Run on a quiet machine; ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKENS = (1, 2, 3, 4, 5, 6, 8, 16)


def measure(reps: int, context: int) -> dict:
    """In this process: the forward's median ms by token count, and the head product's."""
    import mlx.core as mx

    from engines.batch.cache import BatchCache
    from engines.mlx_chat.loading import load_model
    from engines.mlx_chat.models import default_chat_model

    model = load_model(str(default_chat_model())).model
    cache = BatchCache(model, 1)
    cache.begin(context)
    mx.eval(model(mx.arange(100, 100 + context, dtype=mx.uint32)[None], cache=cache.layers))
    cache.settle([context])

    def median_ms(fn) -> float:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return sorted(times)[reps // 2] * 1000

    def forward(n: int) -> None:
        cache.begin(n)
        mx.eval(mx.argmax(model(mx.arange(500, 500 + n, dtype=mx.uint32)[None], cache=cache.layers), axis=-1))
        cache.abandon()  # its slots written over: every repetition at the same context length

    head = mx.random.normal((49152, 576))
    mx.eval(head)
    out = {"forward": {}, "head": {}}
    for n in TOKENS:
        out["forward"][n] = median_ms(lambda: forward(n))
        x = mx.random.normal((n, 576))
        out["head"][n] = median_ms(lambda: mx.eval(x @ head.T))
    return out


def blases(extra: list[str]) -> dict[str, str]:
    """name -> LD_PRELOAD ("" for MLX's own BLAS)."""
    from engines.cpu import blas

    copy, why = blas.renamed_copy()
    found = {"wheel": str(copy) if copy else None, "system": blas.system_openblas(), "reference": ""}
    if copy is None:
        print(f"no wheel BLAS: {why}", file=sys.stderr)
    for item in extra:
        name, _, preload = item.partition("=")
        found[name] = preload
    return {name: preload for name, preload in found.items() if preload is not None}


def child(preload: str, reps: int, context: int) -> dict:
    # LD_PRELOAD set here and nothing else of engines/cpu/preload.py: the child does not re-exec
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | ({"LD_PRELOAD": preload} if preload else {})
    done = subprocess.run([sys.executable, __file__, "--child", "--reps", str(reps), "--context", str(context)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--context", type=int, default=200, help="tokens in the cache before each forward")
    p.add_argument("--rounds", type=int, default=2, help="each BLAS this many times, alternating")
    p.add_argument("--preload", action="append", default=[], metavar="NAME=LIB[:LIB...]",
                   help="another BLAS to compare, by its LD_PRELOAD")
    p.add_argument("--only", help="comma-separated names to run (default: all found)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.reps, args.context)))
        return 0
    found = blases(args.preload)
    if args.only:
        found = {name: found[name] for name in args.only.split(",")}
    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {name: [] for name in found}
    for _ in range(args.rounds):
        for name, preload in found.items():
            runs[name].append(child(preload, args.reps, args.context))

    def best(name: str, what: str, n: int) -> float:  # the quieter of the alternating runs
        return min(r[what][str(n)] for r in runs[name])

    names = list(found)
    first = names[0]
    print(f"SmolLM2-135M float32 forward at a {args.context}-token context, median of {args.reps}, "
          f"best of {args.rounds} alternating runs; load {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    for name in names:
        print(f"  {name}: {found[name] or '(MLX wheel reference BLAS)'}")
    print("forward ms (x the 1-token forward) [x " + first + "]")
    print(f"{'tokens':>6} " + " ".join(f"{name:>24}" for name in names))
    for n in TOKENS:
        cells = []
        for name in names:
            ms = best(name, "forward", n)
            cells.append(f"{ms:7.1f} ({ms / best(name, 'forward', 1):4.2f}x) [{ms / best(first, 'forward', n):4.2f}x]")
        print(f"{n:>6} " + " ".join(f"{c:>24}" for c in cells))
    print("head product ms (49152 x 576)")
    for n in TOKENS:
        print(f"{n:>6} " + " ".join(f"{best(name, 'head', n):>24.2f}" for name in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
