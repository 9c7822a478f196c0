"""The few-row matrix kernel (engines/mlx_chat/cpu_gemm.c), preloaded as the launcher preloads it:
it takes MLX's few-row products (the dynamic linker's own report says so), computes them right
against float64, makes every row of a many-row product equal the one-row product bit for bit
(what lets a verify see plain decoding's logits), and hands other products on to the BLAS."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from app.launch import system_openblas
from engines.mlx_chat import cpu_gemm

pytestmark = [
    pytest.mark.skipif(not cpu_gemm.supported(), reason="the kernel is for Linux x86-64 (MLX's CPU backend)"),
    pytest.mark.skipif(not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")),
                       reason="no C compiler here to build the kernel (the launcher then runs without it)"),
]

# Runs in a child with the kernel preloaded; prints what the test checks, as JSON.
CHILD = r"""
import json, mlx.core as mx, numpy as np
mx.random.seed(0)
report = {"error": 0.0, "rows_equal": True, "others_error": 0.0}  # relative to the largest |value|
for N, K in [(1000, 576), (37, 77), (4099, 1536), (8, 3)]:
    W = mx.random.normal((N, K))
    X = mx.random.normal((20, K))
    ref = np.array(X).astype(np.float64) @ np.array(W).astype(np.float64).T
    alone = [np.array(X[i:i + 1] @ W.T)[0] for i in range(20)]
    for M in list(range(1, 18)) + [20]:
        Y = np.array(X[:M] @ W.T)
        scale = np.abs(ref[:M]).max() + 1
        report["error"] = max(report["error"], float(np.abs(Y - ref[:M]).max() / scale))
        if M <= 16:  # the kernel's, at SPECSCOPE_SMALL_GEMM_ROWS=16 (more rows go to the BLAS)
            report["rows_equal"] &= all((Y[i] == alone[i]).all() for i in range(M))
    # x @ W with W [K, N] (the BLAS's), C = alpha X W^T + beta C (addmm), a batch of products
    C = mx.random.normal((3, N))
    checks = [(X[:3] @ mx.array(np.ascontiguousarray(np.array(W).T)), ref[:3]),
              (mx.addmm(C, X[:3], W.T, alpha=0.5, beta=2.0), 0.5 * ref[:3] + 2.0 * np.array(C).astype(np.float64)),
              (mx.stack([X[:2], X[2:4]]) @ W.T, np.stack([ref[:2], ref[2:4]]))]
    for got, want in checks:
        report["others_error"] = max(report["others_error"], float(np.abs(np.array(got) - want).max() / (np.abs(want).max() + 1)))
print(json.dumps(report))
"""


def run_child(tmp_path, kernel_on: bool = True) -> tuple[dict, str]:
    kernel = cpu_gemm.library()
    if kernel is None:
        pytest.fail("the kernel did not build with this machine's C compiler")
    blas = system_openblas()
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SPECSCOPE_SMALL_GEMM")}
    env |= {"LD_PRELOAD": ":".join(p for p in (str(kernel), blas) if p), "LD_DEBUG": "bindings",
            "LD_DEBUG_OUTPUT": str(tmp_path / "ld"), "SPECSCOPE_SMALL_GEMM": "1" if kernel_on else "0",
            "SPECSCOPE_SMALL_GEMM_ROWS": "16"}  # every tile shape, not only the default's 1-6 rows
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
    log = "".join(p.read_text() for p in tmp_path.glob("ld.*"))
    return json.loads(out.stdout), log


def test_few_row_products_are_right_and_rows_equal_the_one_row_product(tmp_path):
    report, log = run_child(tmp_path)
    # libmlx's cblas_sgemm went to the kernel, not to OpenBLAS or the wheel's reference BLAS
    assert re.search(r"libmlx\.so \[0\] to \S*/cpu_gemm-\w+\.so \[0\]: normal symbol `cblas_sgemm'", log)
    assert report["error"] < 1e-5, report
    assert report["rows_equal"], report
    assert report["others_error"] < 1e-5, report


def test_switched_off_it_hands_everything_on(tmp_path):
    # SPECSCOPE_SMALL_GEMM=0 with the library loaded anyway: the BLAS's own products, still right
    report, _ = run_child(tmp_path, kernel_on=False)
    assert report["error"] < 1e-5 and report["others_error"] < 1e-5, report


def test_built_once_by_its_source(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = cpu_gemm.library()
    assert path is not None and path.parent == tmp_path / "specscope"
    stamp = path.stat().st_mtime_ns
    assert cpu_gemm.library() == path and path.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind


def test_no_compiler_is_no_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert cpu_gemm.library() is None
