"""The `specscope` console entry point: the process environment, then app.cli.main.

Linux only: MLX's CPU wheel links the reference BLAS (netlib), which multiplies at ~2 GFLOP/s
here, so every forward is compute-bound and a forward of k+1 tokens costs k+1 single-token
forwards (measured [8,576]x[576,1536]: 5.8 ms vs 0.22 ms with OpenBLAS). Speculation cannot pay
off on it. When the system's OpenBLAS is installed (scripts/setup installs it on Debian), the
process re-executes itself once with it preloaded, so MLX's BLAS calls go to OpenBLAS. macOS is
untouched (Metal / Accelerate).
"""

from __future__ import annotations

import glob
import os
import sys

OPENBLAS_GLOBS = [
    "/usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
]


def system_openblas() -> str | None:
    for pattern in OPENBLAS_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def preload_openblas() -> None:
    """Re-exec this very command line with OpenBLAS in LD_PRELOAD (once; SPECSCOPE_NO_OPENBLAS=1
    opts out). Call it first thing: the console script and the benchmark scripts do."""
    if sys.platform != "linux" or os.environ.get("SPECSCOPE_NO_OPENBLAS"):
        return
    lib = system_openblas()
    if lib is None or lib in os.environ.get("LD_PRELOAD", ""):
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD")) if p)
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def entry() -> int:
    preload_openblas()
    from app.cli import main

    return main()
