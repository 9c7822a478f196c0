"""The launcher preloads the system OpenBLAS on Linux (MLX's wheel there links the reference BLAS)."""

import os
import subprocess
import sys

import pytest

from app.launch import system_openblas

CODE = "from app.launch import preload_openblas; preload_openblas(); import os; print(os.environ.get('LD_PRELOAD', ''))"


@pytest.mark.skipif(sys.platform != "linux" or system_openblas() is None, reason="no system OpenBLAS to preload")
def test_reexecs_once_with_openblas_preloaded():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SPECSCOPE_NO_OPENBLAS")}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip().split(":").count(system_openblas()) == 1


def test_opt_out():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | {"SPECSCOPE_NO_OPENBLAS": "1"}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == ""
