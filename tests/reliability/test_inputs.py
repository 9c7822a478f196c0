"""Issue 16 items 10-12: OCR inputs are checked before any model loads; an EXIF-rotated photo is
shown as the model reads it; a converted model's manifest cannot point outside its folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from engines.types import EngineError


def test_a_bad_image_is_said_before_the_model_loads(tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    # a model folder that would fail to load: the image's error must come first (before: the
    # model was loaded, 7-8 s for GLM-OCR, and only then "empty.png is empty")
    out = subprocess.run([sys.executable, "-m", "app", "ocr", str(empty), "--model", str(tmp_path / "no-model"),
                          "--runtime", "torch"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["specscope: error: empty.png is empty (0 bytes)"]


def exif_rotated_photo(path: Path) -> Path:
    """A 40x20 JPEG whose EXIF Orientation (6) says: rotate 90 degrees to view, as phones store them."""
    image = Image.new("RGB", (40, 20), "white")
    image.paste((200, 0, 0), (0, 0, 10, 20))  # a red band on the left of the stored pixels
    exif = Image.Exif()
    exif[0x0112] = 6
    image.save(path, exif=exif.tobytes())
    return path


def test_the_document_view_shows_an_exif_rotated_photo_as_the_model_reads_it(qtbot, tmp_path):
    from app.gui.views.document import DocumentView
    from engines.glm_ocr.image import load_image

    photo = exif_rotated_photo(tmp_path / "photo.jpg")
    seen_by_model = load_image(photo)
    assert seen_by_model.size == (20, 40)  # upright
    view = DocumentView()
    qtbot.addWidget(view)
    assert view.add_images([str(photo)]) == 1
    shown = view.view.item.pixmap().toImage()
    assert (shown.width(), shown.height()) == seen_by_model.size  # before: 40x20, sideways
    top = shown.pixelColor(10, 2)  # the red band is on top once upright
    assert top.red() > 150 and top.green() < 80, (top.red(), top.green(), top.blue())


@pytest.mark.parametrize("bad_path", ["../outside.npy", "/etc/passwd", "sub/../../outside.npy"])
def test_manifest_paths_are_confined_to_the_model_folder(tmp_path, bad_path):
    from engines.glm_ocr.runtime_coreml import MANIFEST_FORMAT, read_manifest

    model = tmp_path / "converted"
    model.mkdir()
    (tmp_path / "outside.npy").write_bytes(b"not yours")
    (model / "vision.mlpackage").mkdir()
    manifest = {"format": MANIFEST_FORMAT, "seq_len": 8, "cache_length": 64,
                "packages": {"vision": {"path": "vision.mlpackage"}}, "embeddings": {"path": bad_path}}
    (model / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EngineError, match="outside the model folder"):
        read_manifest(model)
    manifest["embeddings"]["path"] = "embeddings.npy"  # the same folder, as a conversion writes it
    manifest["packages"]["vision"]["path"] = bad_path
    (model / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EngineError, match="outside the model folder"):
        read_manifest(model)
