"""The launcher's check for Qt's X11 libraries, on a machine where one of them is really gone.

A library is hidden from the dynamic loader, not from a list: in a private mount namespace
(`unshare -m`, needs root) an empty file is bind-mounted over the library the loader resolves,
so dlopen fails on it exactly as on a machine without the package. The launcher then has to say
what to install in one line and exit 1 before Qt loads (no "could not load the Qt platform
plugin" abort)."""

from __future__ import annotations

import ctypes.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.launch import XCB_LIBRARIES, missing_packages, opens_xcb_window

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = "libxcb-cursor.so.0"  # Debian: libxcb-cursor0, the one Qt 6.5+ added

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="Qt's xcb platform plugin and its libraries are Linux only")


def loader_path(soname: str) -> Path | None:
    """The file the dynamic loader opens for soname, from its cache (ldconfig -p)."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():  # "\tlibxcb-cursor.so.0 (libc6,x86-64) => /lib/x86_64-linux-gnu/..."
        name, _, target = line.strip().partition(" => ")
        if name.split(" ")[0] == soname:
            return Path(target).resolve()
    return None


def can_hide() -> str | None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return "hiding a library needs root and unshare (a private mount namespace)"
    if ctypes.util.find_library("xcb-cursor") is None or loader_path(HIDDEN) is None:
        return f"{HIDDEN} is not installed here, so there is nothing to hide"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode:
        return "this machine does not allow private mount namespaces"
    return None


def run_hidden(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs args with HIDDEN's file replaced by an empty one, for this process tree only."""
    target = loader_path(HIDDEN)
    empty = Path(env["TMPDIR"]) / "empty.so"
    empty.write_bytes(b"")
    command = shlex.join(args)
    script = f"mount --bind {shlex.quote(str(empty))} {shlex.quote(str(target))} && exec {command}"
    return subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def window_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=":97", SPECSCOPE_HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path))
    return env


@pytest.mark.skipif(can_hide() is not None, reason=can_hide() or "")
def test_check_finds_the_hidden_library(tmp_path):
    before = missing_packages(XCB_LIBRARIES)
    code = ("from app.launch import XCB_LIBRARIES, missing_packages; "
            "print(' '.join(missing_packages(XCB_LIBRARIES)))")
    out = run_hidden([sys.executable, "-c", code], window_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [p for p in XCB_LIBRARIES.values() if p in before or p == "libxcb-cursor0"]


@pytest.mark.skipif(can_hide() is not None, reason=can_hide() or "")
def test_launcher_names_the_package_and_exits_1_before_qt(tmp_path):
    out = run_hidden([sys.executable, "-m", "app"], window_env(tmp_path))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "libxcb-cursor0" in lines[0]
    assert "install them with: apt-get install " in lines[0]  # root: no sudo
    assert "Qt platform plugin" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(can_hide() is not None, reason=can_hide() or "")
def test_launcher_as_a_normal_user_prints_the_sudo_command(tmp_path):
    """The real entry point with the effective user switched to nobody (the interpreter itself
    lives under root's home here, so it is started as root and drops to nobody first)."""
    code = ("import os, sys; import app.launch, app.cli.main; os.setegid(65534); os.seteuid(65534); "
            "sys.argv = ['specscope']; sys.exit(app.launch.entry())")
    # no re-exec (entry() runs as is) and no new import after the switch: nobody cannot read
    # this interpreter's library under root's home
    env = window_env(tmp_path) | {"SPECSCOPE_FAST_CPU": "0"}
    out = run_hidden([sys.executable, "-c", code], env)
    assert out.returncode == 1, out.stderr
    line = out.stderr.strip()
    assert "libxcb-cursor0" in line and "install them with: sudo apt-get install " in line
    assert "\n" not in line


def test_only_a_window_on_x11_is_checked():
    from app.cli.main import COMMANDS

    x11 = {"DISPLAY": ":0"}
    assert opens_xcb_window([], x11)
    assert opens_xcb_window(["page.png"], x11)
    assert opens_xcb_window(["--screenshot", "a.png", "--chat", "hi"], {"QT_QPA_PLATFORM": "xcb"})
    assert not opens_xcb_window([], {"QT_QPA_PLATFORM": "offscreen"})
    assert not opens_xcb_window([], {"WAYLAND_DISPLAY": "wayland-0"})
    assert not opens_xcb_window(["--version"], x11)
    for command in COMMANDS:
        assert not opens_xcb_window([command, "--help"], x11)
