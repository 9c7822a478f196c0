"""The README's first command as a stranger runs it: a user who is not root, with their own
clone and home, on a machine where specscope finds no system OpenBLAS. `scripts/app` sets up
its venv from the lock (downloading from the package index: minutes, so `slow`), then the
window opens offscreen, runs a chat on the embedded model to its end and saves a screenshot.
MLX multiplies with the wheel's OpenBLAS, whose copy lands in that user's own cache."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from tests.packaging.checkout import checkout_copy

USER = "specscope-stranger"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("useradd")
                       or not shutil.which("runuser"),
                       reason="makes a user of its own: Linux, as root, with useradd and runuser"),
]


@pytest.fixture
def stranger():
    # a home the user can reach: pytest's own temporary folders are root's alone (mode 700)
    home = Path(tempfile.mkdtemp(prefix="specscope-stranger-")) / "home"
    subprocess.run(["userdel", "-r", USER], capture_output=True)  # one a killed run left
    subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", USER], check=True)
    home.parent.chmod(0o755)
    try:
        yield pwd.getpwnam(USER), home
    finally:
        subprocess.run(["userdel", "-r", USER], capture_output=True)
        shutil.rmtree(home.parent, ignore_errors=True)


def test_scripts_app_as_a_normal_user_without_openblas(stranger, tmp_path):
    user, home = stranger
    clone = checkout_copy(home / "specscope")
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(home)], check=True)
    shot = home / "chat.png"
    # a login shell's environment: no venv, no pyenv, nothing preloaded; the system's Python
    env = {"HOME": str(home), "USER": USER, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "QT_QPA_PLATFORM": "offscreen", "SPECSCOPE_NO_SYSTEM_OPENBLAS": "1"}
    env |= {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # this machine's package index
    out = subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                          "scripts/app", "--screenshot", str(shot), "--chat",
                          "Rewrite exactly: The quick brown fox jumps over the lazy dog.", "--spec", "ngram",
                          "--max-tokens", "40"],
                         cwd=clone, capture_output=True, text=True, timeout=1800,
                         env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})  # runuser's own
    assert out.returncode == 0, out.stderr[-4000:]
    assert "Segmentation" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-4000:]
    with Image.open(shot) as image:
        assert image.size[0] >= 800 and image.size[1] >= 500
    copies = list((home / ".cache" / "specscope").glob("openblas-*.so"))
    assert copies and copies[0].stat().st_uid == user.pw_uid  # the wheel's OpenBLAS, in their own cache
    shutil.copy(shot, Path(os.environ.get("SPECSCOPE_SHOTS", tmp_path)) / "stranger-chat.png")
