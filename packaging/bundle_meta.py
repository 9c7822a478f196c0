"""What the macOS bundle says about itself: its Info.plist and its icon. Plain Python (plistlib,
Pillow), so the spec uses it on a Mac and the tests check it anywhere.

Loaded by path (this folder is not a package: a package named `packaging` would shadow the
PyPI `packaging` that PyInstaller and pip import).
"""

from __future__ import annotations

import plistlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app import APP_ID, APP_NAME, __version__  # noqa: E402

# The oldest macOS the app runs on is the newer of its two runtimes' minimums:
# - MLX (chat): "macOS >= 14.0" (https://ml-explore.github.io/mlx/build/html/install.html,
#   "Python Installation"; the `mlx` wheels on PyPI are built for macOS 14 and later).
# - Core ML stateful models (GLM-OCR's KV cache, MLState): "Starting from iOS18 / macOS15, Core ML
#   models can have a state input type" (https://apple.github.io/coremltools/docs-guides/source/
#   stateful-models.html); engines/glm_ocr/convert.py converts with minimum_deployment_target
#   macOS15 for that reason.
MIN_MACOS = "15.0"

ICON_SOURCE = ROOT / "resources" / "icons" / "specscope-1024.png"
# The sizes (points, points, scale) the .icns holds: the PNG-coded ones Pillow writes, 16 @2x to
# 512 @2x (1024 px). Finder draws 16 and 32 @1x by scaling these down.
ICNS_SIZES = [(16, 16, 2), (32, 32, 2), (128, 128, 1), (128, 128, 2), (256, 256, 1), (256, 256, 2),
              (512, 512, 1), (512, 512, 2)]

IMAGE_TYPES = ["public.png", "public.jpeg", "public.tiff", "com.microsoft.bmp", "org.webmproject.webp",
               "public.image"]
PDF_TYPES = ["com.adobe.pdf"]


def document_types() -> list[dict]:
    """What Finder offers Specscope for (Open With, a drop on the Dock icon). Viewer + Alternate:
    Specscope reads these files, it never becomes their default editor."""
    return [
        {"CFBundleTypeName": "Image", "CFBundleTypeRole": "Viewer", "LSHandlerRank": "Alternate",
         "LSItemContentTypes": IMAGE_TYPES},
        {"CFBundleTypeName": "PDF document", "CFBundleTypeRole": "Viewer", "LSHandlerRank": "Alternate",
         "LSItemContentTypes": PDF_TYPES},
    ]


def info_plist() -> dict:
    """The keys Specscope sets in Contents/Info.plist; PyInstaller's BUNDLE adds the executable's
    own (CFBundleExecutable, CFBundlePackageType, ...)."""
    return {
        "CFBundleName": APP_NAME,
        "CFBundleDisplayName": APP_NAME,
        "CFBundleIdentifier": APP_ID,
        "CFBundleShortVersionString": __version__,
        "CFBundleVersion": __version__,
        "LSMinimumSystemVersion": MIN_MACOS,
        "LSApplicationCategoryType": "public.app-category.productivity",
        "NSHighResolutionCapable": True,
        "NSRequiresAquaSystemAppearance": False,  # follow the system's dark mode
        "CFBundleDocumentTypes": document_types(),
    }


def write_info_plist(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        plistlib.dump(info_plist(), f)
    return path


def write_icns(path: Path, source: Path = ICON_SOURCE) -> Path:
    """The app icon, from the committed 1024 px PNG (a render of resources/icons/specscope.svg).
    Pillow's ICNS writer makes every size of ICNS_SIZES from it."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    with Image.open(source) as image:
        if image.size != (1024, 1024):
            raise ValueError(f"{source}: the icon source must be 1024x1024, not {image.size}")
        image.convert("RGBA").save(path, format="ICNS")
    return path
