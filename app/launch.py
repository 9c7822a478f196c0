"""The `specscope` console entry point: the process environment, then app.cli.main.main.

Linux: before a window opens on X11, the system libraries Qt's xcb platform plugin links are
checked with the dynamic loader, so a missing one is one line naming its package, not Qt's
"could not load the Qt platform plugin" abort (scripts/setup installs them on Debian/Ubuntu).

Linux only: MLX's CPU wheel links the reference BLAS (netlib), which multiplies at ~2 GFLOP/s
here, so every forward is compute-bound and a forward of k+1 tokens costs k+1 single-token
forwards (measured [8,576]x[576,1536]: 5.8 ms vs 0.22 ms with OpenBLAS). Speculation cannot pay
off on it. When the system's OpenBLAS is installed (scripts/setup installs it on Debian), the
process re-executes itself once with it preloaded, so MLX's BLAS calls go to OpenBLAS. macOS is
untouched (Metal / Accelerate).

OpenBLAS picks its kernels by the CPU's model number, and one too new for it (Debian 12's 0.3.21
on a Xeon of family 6 model 207) gets its generic SSE3 kernels ("Prescott"): a 2048x2048 product
at 60 GFLOP/s instead of 300, a drafter's training step 1.9x slower. So the launcher asks
the library which kernels it chose, and on that fallback names the ones the CPU's flags allow
(OPENBLAS_CORETYPE), unless the user set it.

The preload is for MLX only. torch carries its own BLAS (MKL, linked into libtorch_cpu), but
its calls to sgemm_ / sgemv_ go through the dynamic linker like any other, so a preloaded
OpenBLAS takes them over too: GLM-OCR's float32 decode, one row through 1536 x 9216 linears,
then runs 2.8x slower (a linear: 2.9 ms instead of 1.0; the fixture page's time to first token
1.94 s instead of 0.68). So torch's extension module is loaded with RTLD_DEEPBIND, which makes
libtorch_cpu resolve its symbols in itself before the preloaded library (`TorchOwnBlas`;
tests/unit/test_launch.py reads the dynamic linker's bindings to check it).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.abc
import importlib.machinery
import os
import shutil
import sys
from collections.abc import Mapping

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


def cpu_libraries(environ: Mapping[str, str] = os.environ) -> list[str]:
    """What MLX's CPU backend should run with, in LD_PRELOAD order: the few-row matrix kernel
    (engines/mlx_chat/cpu_gemm.c, built on first use; SPECSCOPE_SMALL_GEMM=0 leaves it out),
    which takes the products of decoding and verifying and hands the rest on to the next
    library, then the system's OpenBLAS (SPECSCOPE_NO_OPENBLAS=1 leaves it out)."""
    if sys.platform != "linux":
        return []
    libs = []
    if environ.get("SPECSCOPE_SMALL_GEMM", "1") != "0":
        from engines.mlx_chat import cpu_gemm

        kernel = cpu_gemm.library()
        libs += [str(kernel)] if kernel else []
    blas = None if environ.get("SPECSCOPE_NO_OPENBLAS") else system_openblas()
    return libs + ([blas] if blas else [])


# OpenBLAS's x86-64 kernel sets, best first, with the instructions each needs (its names, as
# OPENBLAS_CORETYPE takes them). Prescott is its generic fallback, SSE3 only.
OPENBLAS_KERNELS = [
    ("SkylakeX", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
    ("Haswell", {"avx2", "fma"}),
]


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def openblas_core(library: str) -> str:
    """The kernel set a DYNAMIC_ARCH OpenBLAS chose for this CPU ("" when it cannot say)."""
    try:
        get_corename = ctypes.CDLL(library).openblas_get_corename
    except (OSError, AttributeError):
        return ""
    get_corename.restype = ctypes.c_char_p
    return (get_corename() or b"").decode()


def better_openblas_kernels(core: str, flags: set[str]) -> str | None:
    """The kernels to ask for when OpenBLAS fell back to its generic ones on a CPU with better."""
    if core.lower() != "prescott":
        return None
    return next((name for name, needs in OPENBLAS_KERNELS if needs <= flags), None)


def cpu_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What `environ` (this process's) lacks to run MLX on the CPU as `specscope` runs it:
    LD_PRELOAD with `cpu_libraries()` (the kernel ahead of the BLAS it hands on to) and, with
    the kernel, OPENBLAS_THREAD_TIMEOUT=4 unless set; OPENBLAS_CORETYPE when OpenBLAS does not
    know this CPU (see the module's docstring). OpenBLAS's idle threads spin for 2^28
    cycles (~0.1 s) after each threaded call before they sleep; once the kernel takes decoding's
    products, OpenBLAS's are only the big ones (a prompt) and its spinning threads hold the core
    the Python thread needs between forwards: SmolLM2 decoded 25 tok/s plain and 25 with one
    MTP draft a round with them spinning, 30 and 35 with them asleep (2^4 cycles; 12 open chat
    prompts). Without the kernel they stay as they are: there every product is theirs."""
    preloaded = [p for p in environ.get("LD_PRELOAD", "").split(":") if p]
    libs = cpu_libraries(environ)
    missing = [lib for lib in libs if lib not in preloaded]
    changes = {"LD_PRELOAD": ":".join(missing + preloaded)} if missing else {}
    openblas = [lib for lib in missing if "/cpu_gemm-" not in lib]
    if openblas and "OPENBLAS_CORETYPE" not in environ:
        kernels = better_openblas_kernels(openblas_core(openblas[0]), cpu_flags())
        if kernels:
            changes["OPENBLAS_CORETYPE"] = kernels
    if any("/cpu_gemm-" in lib for lib in libs) and "OPENBLAS_THREAD_TIMEOUT" not in environ:
        changes["OPENBLAS_THREAD_TIMEOUT"] = "4"
    return changes


def preload_cpu_libraries() -> None:
    """Re-exec this very command line with `cpu_environment()` (once: when something is
    missing). Call it first thing: the console script and the benchmark scripts do."""
    changes = cpu_environment()
    if changes:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **changes})


class _DeepBoundExtension(importlib.machinery.ExtensionFileLoader):
    """An extension module loaded with RTLD_DEEPBIND: it and the libraries it pulls in look up
    symbols in themselves before the process's global scope (where LD_PRELOAD puts OpenBLAS)."""

    def create_module(self, spec):
        flags = sys.getdlopenflags()
        sys.setdlopenflags(flags | os.RTLD_DEEPBIND)
        try:
            return super().create_module(spec)
        finally:
            sys.setdlopenflags(flags)


class TorchOwnBlas(importlib.abc.MetaPathFinder):
    """Finds torch._C (which loads libtorch_cpu) and has it loaded deep-bound; every other
    module is left to the usual finders. Lazy: torch is imported when OCR first needs it."""

    def find_spec(self, name, path, target=None):
        if name != "torch._C":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and type(spec.loader) is importlib.machinery.ExtensionFileLoader:
            spec.loader = _DeepBoundExtension(spec.loader.name, spec.loader.path)
        return spec


def keep_torch_on_its_own_blas() -> None:
    """When OpenBLAS or the few-row kernel is preloaded (for MLX), load torch so that it keeps
    its own BLAS. Call it before anything imports torch: the entry point and the tests' conftest do."""
    if sys.platform != "linux" or not os.environ.get("LD_PRELOAD"):
        return
    if "torch" in sys.modules or any(isinstance(f, TorchOwnBlas) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, TorchOwnBlas())


# What Qt's xcb platform plugin (PySide6's libqxcb.so and libQt6XcbQpa.so.6) links from the
# system, as `ldd` lists them, with the Debian/Ubuntu package of each. libc, libstdc++ and the
# like are left out: Python itself needs them.
XCB_LIBRARIES = {
    "libxcb.so.1": "libxcb1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libX11.so.6": "libx11-6",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libdbus-1.so.3": "libdbus-1-3",
}


def missing_packages(libraries: dict[str, str]) -> list[str]:
    """The packages of the libraries the dynamic loader cannot load, by the same lookup Qt's
    plugin loader uses (dlopen by soname: LD_LIBRARY_PATH, the ld.so cache, the system dirs)."""
    missing: list[str] = []
    for soname, package in libraries.items():
        try:
            ctypes.CDLL(soname)
        except OSError:
            if package not in missing:
                missing.append(package)
    return missing


def opens_xcb_window(argv: list[str], env: dict[str, str]) -> bool:
    """Whether this command line opens a window on X11: Linux, no subcommand, and Qt's platform
    xcb (asked for, or Qt's default when no Wayland display is there)."""
    from app.cli.main import COMMANDS

    if sys.platform != "linux" or (argv and (argv[0] in COMMANDS or argv[0] in ("-h", "--help", "help", "--version"))):
        return False
    platform = env.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0] == "xcb"
    return not env.get("WAYLAND_DISPLAY")


def install_command(packages: list[str]) -> str:
    sudo = "" if os.geteuid() == 0 else "sudo "
    return f"{sudo}apt-get install {' '.join(packages)}"


def check_xcb_libraries(libraries: dict[str, str] = XCB_LIBRARIES) -> int:
    """0 when the window can open; else one line on stderr saying what to install, and 1."""
    missing = missing_packages(libraries)
    if not missing:
        return 0
    if shutil.which("apt-get"):
        how = f"install them with: {install_command(missing)}"
    else:
        names = [soname for soname, package in libraries.items() if package in missing]
        how = f"install the packages that provide {', '.join(names)}"
    print(f"specscope: the window needs Qt's X11 libraries {', '.join(missing)}; {how}", file=sys.stderr)
    return 1


def entry() -> int:
    preload_cpu_libraries()
    keep_torch_on_its_own_blas()
    argv = sys.argv[1:]
    if opens_xcb_window(argv, dict(os.environ)):
        status = check_xcb_libraries()
        if status:
            return status
    from app.cli.main import main

    return main(argv)
