"""The `specscope` console entry point: the process environment, then app.cli.main.main.

Linux: MLX's CPU backend is pointed at a fast BLAS first (engines/cpu: the BLAS is preloaded by
re-executing the command once; torch keeps its own). Before a window opens on X11, the system
libraries Qt's xcb platform plugin links are checked with the dynamic loader, so a missing one
is one line naming its package, not Qt's "could not load the Qt platform plugin" abort
(scripts/setup installs them on Debian/Ubuntu). macOS is untouched.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys

from app.torchless import leave_torch_out, only_chats
from engines.cpu.preload import preload_cpu_libraries
from engines.cpu.torch_blas import keep_torch_on_its_own_blas

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
    if getattr(sys, "frozen", False):
        # The app bundle is its own Python: the engine process and multiprocessing's resource
        # tracker start as this binary with their own arguments, which this hands to them.
        import multiprocessing

        multiprocessing.freeze_support()
    preload_cpu_libraries()
    keep_torch_on_its_own_blas()
    argv = sys.argv[1:]
    if only_chats(argv):
        leave_torch_out()
    if opens_xcb_window(argv, dict(os.environ)):
        status = check_xcb_libraries()
        if status:
            return status
    from app.cli.main import main

    return main(argv)
