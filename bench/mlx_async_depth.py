"""How far the host can run ahead of the device with mx.async_eval: the time async_eval takes
to return for a chain of n dependent ops, against the time the chain takes to finish.

    python bench/mlx_async_depth.py [--size 512]

Depth-2 overlap (and plain decoding's lookahead) rely on async_eval returning at once, so the
host can build the next graph while the device runs this one. On Metal it does. On MLX's CPU
backend async_eval blocks once a few dozen ops are in flight, until the queue drains below
that, so a host can only ever be that far ahead: for a forward of hundreds of ops the host
waits out most of it. This script shows where that happens on the machine it runs on.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()

import mlx.core as mx  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=512, help="square matrix size of each op (a matmul)")
    args = ap.parse_args()
    a = mx.random.normal((args.size, args.size)) / args.size**0.5
    mx.eval(a)
    print(f"device {mx.default_device()}, ops: [{args.size}x{args.size}] matmuls, each on the previous result")
    print(f"{'ops':>5} {'async_eval returned':>20} {'all done':>10} {'host ran ahead by':>18}")
    for n in (5, 10, 20, 40, 60, 80, 120, 200):
        x = a
        for _ in range(n):
            x = x @ a
        t0 = time.perf_counter()
        mx.async_eval(x)
        t1 = time.perf_counter()
        mx.eval(x)
        t2 = time.perf_counter()
        ahead = (t2 - t1) / (t2 - t0) * n  # ops still queued when the host got control back
        print(f"{n:5d} {1e3 * (t1 - t0):17.2f} ms {1e3 * (t2 - t0):7.1f} ms {ahead:14.0f} ops")
    print(f"(OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")


if __name__ == "__main__":
    main()
