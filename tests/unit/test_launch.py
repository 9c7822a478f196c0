"""The launcher preloads the few-row matrix kernel and the system OpenBLAS on Linux (MLX's wheel
there links the reference BLAS)."""

import os
import re
import subprocess
import sys

import pytest

from app.launch import better_openblas_kernels, cpu_flags, system_openblas
from engines.mlx_chat import cpu_gemm

CODE = ("from app.launch import preload_cpu_libraries; preload_cpu_libraries(); import os; "
        "print(os.environ.get('LD_PRELOAD', '')); print(os.environ.get('OPENBLAS_THREAD_TIMEOUT', ''))")
OPT_OUTS = ("LD_PRELOAD", "SPECSCOPE_NO_OPENBLAS", "SPECSCOPE_SMALL_GEMM", "OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_CORETYPE")


@pytest.mark.skipif(sys.platform != "linux" or system_openblas() is None, reason="no system OpenBLAS to preload")
def test_reexecs_once_with_openblas_preloaded():
    env = {k: v for k, v in os.environ.items() if k not in OPT_OUTS}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, check=True)
    preload, timeout = out.stdout.split("\n")[:2]
    preloaded = preload.split(":")
    assert preloaded.count(system_openblas()) == 1
    kernel = cpu_gemm.library()
    if kernel is not None:  # ahead of the BLAS it hands on to, whose idle threads then sleep
        assert preloaded.index(str(kernel)) < preloaded.index(system_openblas())
        assert timeout == "4"
    # a timeout the user set is theirs
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True,
                         env=env | {"OPENBLAS_THREAD_TIMEOUT": "20"})
    assert out.stdout.split("\n")[1] == "20"


def test_openblas_kernels_named_only_on_its_generic_fallback():
    avx512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma", "sse3"}
    assert better_openblas_kernels("Prescott", avx512) == "SkylakeX"
    assert better_openblas_kernels("Prescott", {"avx2", "fma", "sse3"}) == "Haswell"
    assert better_openblas_kernels("Prescott", {"sse3", "ssse3"}) is None  # it is the best there
    assert better_openblas_kernels("Cooperlake", avx512) is None  # OpenBLAS knew the CPU


CORE = ("from app.launch import openblas_core, preload_cpu_libraries, system_openblas; "
        "preload_cpu_libraries(); print(openblas_core(system_openblas()))")


@pytest.mark.skipif(sys.platform != "linux" or system_openblas() is None, reason="no system OpenBLAS to preload")
def test_openblas_runs_kernels_this_cpu_has():
    """Debian 12's OpenBLAS takes a CPU newer than it knows for an SSE3 one (5x slower products)."""
    env = {k: v for k, v in os.environ.items() if k not in OPT_OUTS}
    core = subprocess.run([sys.executable, "-c", CORE], capture_output=True, text=True, env=env,
                          check=True).stdout.strip()
    assert core
    assert better_openblas_kernels(core, cpu_flags()) is None
    # kernels the user named are theirs
    core = subprocess.run([sys.executable, "-c", CORE], capture_output=True, text=True, check=True,
                          env=env | {"OPENBLAS_CORETYPE": "Prescott"}).stdout.strip()
    assert core == "Prescott"


def test_opt_out():
    env = {k: v for k, v in os.environ.items() if k not in OPT_OUTS} | {"SPECSCOPE_NO_OPENBLAS": "1",
                                                                        "SPECSCOPE_SMALL_GEMM": "0"}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split("\n")[:2] == ["", ""]


TORCH_LINEAR = ("import torch; torch.nn.functional.linear(torch.randn(1, 64), torch.randn(64, 64)); "
                "torch.randn(8, 64) @ torch.randn(64, 64)")


def blas_calls_taken_by_openblas(code: str, tmp_path) -> list[str]:
    """The BLAS symbols (sgemm_, sgemv_, ...) that libtorch_cpu was bound to the preloaded
    OpenBLAS for while `code` ran, as the dynamic linker reports its bindings (LD_DEBUG)."""
    tmp_path.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env |= {"LD_PRELOAD": system_openblas(), "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(tmp_path / "ld")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    log = "".join(p.read_text() for p in tmp_path.glob("ld.*"))
    assert "binding file" in log  # the linker did write its report
    openblas = os.path.basename(os.path.realpath(system_openblas()))
    return re.findall(rf"libtorch_cpu\.so \[0\] to \S*{re.escape(openblas)} \[0\]: normal symbol `(\w*gem[mv]_)'", log)


@pytest.mark.skipif(sys.platform != "linux" or system_openblas() is None, reason="no system OpenBLAS to preload")
def test_torch_keeps_its_own_blas_when_openblas_is_preloaded(tmp_path):
    pytest.importorskip("torch")
    # as the app runs: the import hook, then torch; its matrix products stay in libtorch_cpu (MKL)
    hooked = blas_calls_taken_by_openblas(
        "from app.launch import keep_torch_on_its_own_blas; keep_torch_on_its_own_blas(); " + TORCH_LINEAR, tmp_path / "a")
    # without it the preload takes them (what made float32 OCR decode 2.8x slower): the check sees it
    plain = blas_calls_taken_by_openblas(TORCH_LINEAR, tmp_path / "b")
    assert hooked == []
    assert "sgemm_" in plain and "sgemv_" in plain
