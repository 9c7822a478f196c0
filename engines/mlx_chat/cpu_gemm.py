"""cpu_gemm.c built into a shared library the launcher preloads ahead of the BLAS (Linux x86-64).

The library replaces cblas_sgemm for products of a few rows -- every nn.Linear of a decoding or
verifying forward -- and hands everything else to the BLAS (see cpu_gemm.c for why, and what it
measured). It is compiled on first use with the system's C compiler into the user's cache
folder, named by a hash of its source and flags, so an edit builds a new one and a stale one is
never loaded (about a third of a second, by the first `specscope` or scripts/test). No compiler,
another platform: None, and MLX keeps the BLAS's own kernels (slower, still correct). Nothing here imports MLX: the launcher calls it
before any library is loaded.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu_gemm.c")
# -ffp-contract=off: the tails' a * b + s must not become an FMA in one tile and not another
# (cpu_gemm.c's bit-for-bit promise across row counts)
FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]


def supported() -> bool:
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specscope"


def library_path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:12]
    return cache_folder() / f"cpu_gemm-{digest}.so"


def library() -> Path | None:
    """The built library, built if it is not there yet; None when it cannot be had here
    (another platform, no C compiler, a failed build: said on stderr)."""
    if not supported() or not SOURCE.is_file():
        return None
    path = library_path()
    if path.is_file():
        return path
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    # built beside and renamed: two processes starting at once never load a half-written file
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, "-o", tmp, str(SOURCE), "-ldl"], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            print(f"specscope: could not build the few-row matrix kernel ({compiler}: {first}); "
                  "decoding on the CPU stays on the BLAS's own", file=sys.stderr)
            return None
        os.replace(tmp, path)
        for old in path.parent.glob("cpu_gemm-*.so"):  # earlier sources' (a process using one keeps its mapping)
            if old != path:
                old.unlink(missing_ok=True)
        return path
    except (OSError, subprocess.SubprocessError) as e:
        print(f"specscope: could not build the few-row matrix kernel ({e})", file=sys.stderr)
        return None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def loaded() -> bool:
    """Whether this process runs with the library mapped (preloaded by the launcher)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return "/cpu_gemm-" in maps
