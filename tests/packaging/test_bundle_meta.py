"""The macOS bundle's Info.plist and icon, as far as Linux can check them: written the way the
spec writes them, read back with plistlib and Pillow. Whether Finder honours them (Open With,
the Dock icon, the version gate) only a Mac shows: see README, "The macOS app"."""

from __future__ import annotations

import importlib.util
import plistlib
from pathlib import Path

from PIL import Image

from app import APP_ID, APP_NAME, __version__

ROOT = Path(__file__).resolve().parents[2]


def load_bundle_meta():
    spec = importlib.util.spec_from_file_location("bundle_meta", ROOT / "packaging" / "bundle_meta.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def check_info_plist(path: Path) -> None:
    """Shared with the build test, which reads the plist the spec wrote."""
    from engines.glm_ocr.runtime_coreml import MIN_MACOS as COREML_STATEFUL_MIN

    with open(path, "rb") as f:
        info = plistlib.load(f)
    assert info["CFBundleIdentifier"] == APP_ID
    assert info["CFBundleName"] == APP_NAME
    assert info["CFBundleShortVersionString"] == __version__ == info["CFBundleVersion"]
    # Not below what the app's runtimes need: the Core ML runtime's own gate (stateful models)
    # and MLX's (macOS 14).
    assert as_version(info["LSMinimumSystemVersion"]) >= (COREML_STATEFUL_MIN, 0)
    assert as_version(info["LSMinimumSystemVersion"]) >= (14, 0)
    assert info["NSHighResolutionCapable"] is True
    assert info["LSApplicationCategoryType"].startswith("public.app-category.")
    kinds = {t for doc in info["CFBundleDocumentTypes"] for t in doc["LSItemContentTypes"]}
    assert {"public.png", "public.jpeg", "com.adobe.pdf"} <= kinds
    for doc in info["CFBundleDocumentTypes"]:
        assert doc["CFBundleTypeRole"] == "Viewer"  # Specscope reads documents, never edits them


def check_icns(path: Path) -> None:
    with Image.open(path) as icon:
        assert icon.format == "ICNS"
        sizes = set(icon.info["sizes"])
        # what macOS asks of an app icon: 16 to 512 points, each at 2x (512 @2x is 1024 px)
        assert {(16, 16, 2), (32, 32, 2), (128, 128, 2), (256, 256, 2), (512, 512, 2)} <= sizes
        icon.size = (512, 512)
        icon.load(scale=2)
        assert icon.size == (1024, 1024)
        rgba = icon.convert("RGBA")
        assert rgba.getpixel((512, 512))[3] == 255  # the drawing, not a transparent square
        assert rgba.getpixel((2, 2))[3] == 0  # rounded corners stay transparent


def test_info_plist_read_back(tmp_path):
    meta = load_bundle_meta()
    check_info_plist(meta.write_info_plist(tmp_path / "Info.plist"))


def test_icns_generated_from_the_source_image(tmp_path):
    meta = load_bundle_meta()
    check_icns(meta.write_icns(tmp_path / "specscope.icns"))


def test_icon_source_must_be_1024_square(tmp_path):
    meta = load_bundle_meta()
    small = tmp_path / "small.png"
    Image.new("RGBA", (256, 256), (0, 0, 0, 255)).save(small)
    try:
        meta.write_icns(tmp_path / "x.icns", source=small)
    except ValueError as e:
        assert "1024x1024" in str(e)
    else:
        raise AssertionError("a 256 px source was accepted")
