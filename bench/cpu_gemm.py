"""The few-row matrix kernel (engines/mlx_chat/cpu_gemm.c) on SmolLM2, the embedded default, on
MLX's CPU backend: the target's forward of 1..16 tokens (a decode step, a verify of 1..15
drafts; 8 and 16 rows are also a batch of 4 or 8 verifying one draft each) with the kernel and
without it (SPECSCOPE_SMALL_GEMM=0: OpenBLAS's sgemm), each in its own process, alternating,
median of the repetitions; and the products alone (the 49152 x 576 head). The kernel takes up
to 6 rows by default; SPECSCOPE_SMALL_GEMM_ROWS=16 shows it beyond.

    python bench/cpu_gemm.py [--reps 30] [--context 200]

Prints milliseconds and the ratios that decide whether speculation pays: a forward of n tokens
against one of 1 (what a round with n-1 drafts costs in plain steps), and kernel against none.
Run on a quiet machine; ratios, not absolute times.
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

TOKENS = (1, 2, 3, 4, 6, 8, 12, 16)


def measure(reps: int, context: int) -> dict:
    """In this process: the forward's median ms by token count, and the head product's."""
    import mlx.core as mx

    from engines.mlx_chat.cache import make_rollback_cache, rollback
    from engines.mlx_chat.engine import ChatEngine
    from engines.mlx_chat.models import default_chat_model

    model = ChatEngine.load(str(default_chat_model())).model
    cache = make_rollback_cache(model)
    mx.eval(model(mx.arange(100, 100 + context, dtype=mx.uint32)[None], cache=cache))

    def median_ms(fn) -> float:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return sorted(times)[reps // 2] * 1000

    def forward(n: int) -> None:
        mx.eval(mx.argmax(model(mx.arange(500, 500 + n, dtype=mx.uint32)[None], cache=cache), axis=-1))
        rollback(cache, n)  # every repetition at the same context length

    head = mx.random.normal((49152, 576))
    mx.eval(head)
    out = {"forward": {}, "head": {}}
    for n in TOKENS:
        out["forward"][n] = median_ms(lambda: forward(n))
        x = mx.random.normal((n, 576))
        out["head"][n] = median_ms(lambda: mx.eval(x @ head.T))
    return out


def child(kernel: bool, reps: int, context: int) -> dict:
    """A process set up as `specscope` sets itself up (app/launch.cpu_environment), with the
    kernel or without it (SPECSCOPE_SMALL_GEMM=0: OpenBLAS alone, its threads as they were)."""
    from app.launch import cpu_environment

    ours = ("LD_PRELOAD", "SPECSCOPE_SMALL_GEMM", "OPENBLAS_THREAD_TIMEOUT")  # set here, not inherited
    env = {k: v for k, v in os.environ.items() if k not in ours} | {"SPECSCOPE_SMALL_GEMM": "1" if kernel else "0"}
    env |= cpu_environment(env)
    done = subprocess.run([sys.executable, __file__, "--child", "--reps", str(reps), "--context", str(context)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--context", type=int, default=200, help="tokens in the cache before each forward")
    p.add_argument("--rounds", type=int, default=2, help="each side this many times, alternating")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.reps, args.context)))
        return 0
    load0 = os.getloadavg()[0]
    runs = {True: [], False: []}
    for _ in range(args.rounds):
        for kernel in (True, False):
            runs[kernel].append(child(kernel, args.reps, args.context))

    def best(kernel: bool, what: str, n: int) -> float:  # the quieter of the alternating runs
        return min(r[what][str(n)] for r in runs[kernel])

    print(f"SmolLM2-135M float32 forward at a {args.context}-token context, median of {args.reps}, "
          f"best of {args.rounds} alternating runs; load {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print(f"{'tokens':>6} {'kernel ms':>10} {'x 1 token':>10} {'OpenBLAS ms':>12} {'x 1 token':>10} {'kernel speedup':>15}"
          f" {'head: kernel':>13} {'OpenBLAS':>9}")
    for n in TOKENS:
        k, b = best(True, "forward", n), best(False, "forward", n)
        print(f"{n:>6} {k:>10.1f} {k / best(True, 'forward', 1):>9.2f}x {b:>12.1f} {b / best(False, 'forward', 1):>9.2f}x"
              f" {b / k:>14.2f}x {best(True, 'head', n):>12.2f} {best(False, 'head', n):>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
