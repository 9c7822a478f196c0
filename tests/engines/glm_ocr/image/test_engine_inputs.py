"""Every bad input of the issue, end to end through the OCR engine (PyTorch runtime on a tiny
GLM-OCR checkpoint): odd but valid images give a result, broken ones a single clear
EngineError line from `generate`, never a traceback from deep inside."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from engines.types import EngineError, Request, SpecConfig
from tests.engines.glm_ocr.checkpoints import make_tiny_glm_ocr


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from engines.glm_ocr.engine import OcrEngine

    checkpoint = make_tiny_glm_ocr(tmp_path_factory.mktemp("glm_ocr_inputs") / "tiny")
    engine = OcrEngine.load(checkpoint, runtime="torch", cache_length=256)
    engine.repetition = None  # random weights repeat themselves; not what these tests look at
    return engine


def _run(engine, path, steps=0):
    request = Request(kind="ocr", image=str(path), max_tokens=3,
                      spec=SpecConfig(method="mtp" if steps else "off", steps=steps))
    return list(engine.generate(request))


def _noise(width, height, channels=3, seed=0):
    data = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return data[..., 0] if channels == 1 else data


def _valid_images(tmp_path):
    """name -> path of images that are odd but valid."""
    images = {}
    images["cmyk.jpg"] = Image.fromarray(_noise(60, 40, 4), "CMYK")
    images["deep.png"] = Image.fromarray((np.arange(40 * 60).reshape(40, 60) * 27).astype(np.uint16))
    images["rgba.png"] = Image.fromarray(_noise(60, 40, 4, 1), "RGBA")
    palette = Image.fromarray(_noise(60, 40, 3, 2)).convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    images["palette.png"] = palette
    images["gray-alpha.png"] = Image.fromarray(_noise(60, 40, 2, 3), "LA")
    images["dot.png"] = Image.new("RGB", (1, 1), (0, 0, 0))
    images["wide.png"] = Image.new("L", (20000, 200), 255)
    paths = {}
    for name, image in images.items():
        path = tmp_path / name
        params = {"transparency": 0} if name == "palette.png" else {}
        image.save(path, **params)
        paths[name] = path
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(_noise(60, 40, 3, 4)).save(tmp_path / "rotated.jpg", exif=exif)
    paths["rotated.jpg"] = tmp_path / "rotated.jpg"
    return paths


def test_odd_but_valid_images_are_read(engine, tmp_path):
    for name, path in _valid_images(tmp_path).items():
        rounds = _run(engine, path)
        assert rounds and sum(len(r.tokens) for r in rounds) >= 1, name


def _declared_size_png(side):
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    at = data.index(b"IHDR")
    data[at + 4 : at + 12] = struct.pack(">II", side, side)
    data[at + 17 : at + 21] = struct.pack(">I", zlib.crc32(bytes(data[at : at + 17])) & 0xFFFFFFFF)
    return bytes(data)


def _broken_files(tmp_path):
    """name -> (path, words the message must contain)."""
    png, jpg = io.BytesIO(), io.BytesIO()
    Image.fromarray(_noise(120, 80)).save(png, format="PNG")
    Image.fromarray(_noise(120, 80)).save(jpg, format="JPEG")
    contents = {
        "empty.png": (b"", ["empty"]),
        "cut.png": (png.getvalue()[: len(png.getvalue()) // 2], ["truncated or corrupt"]),
        "cut.jpg": (jpg.getvalue()[: len(jpg.getvalue()) // 2], ["truncated or corrupt"]),
        "letter.png": (b"Dear reader,\nthis is text.\n" * 10, ["not an image"]),
        "bomb.png": (_declared_size_png(30000), ["decompression bomb"]),
    }
    files = {}
    for name, (data, words) in contents.items():
        (tmp_path / name).write_bytes(data)
        files[name] = (tmp_path / name, [name] + words)
    Image.new("L", (20000, 20), 255).save(tmp_path / "strip.png")
    files["strip.png"] = (tmp_path / "strip.png", ["aspect ratio"])
    files["missing.png"] = (tmp_path / "missing.png", ["not found"])
    return files


def test_broken_inputs_give_one_clear_line(engine, tmp_path):
    for name, (path, words) in _broken_files(tmp_path).items():
        with pytest.raises(EngineError) as excinfo:
            _run(engine, path, steps=3)
        message = str(excinfo.value)
        assert "\n" not in message and "Traceback" not in message, name
        for word in words:
            assert word in message, (name, message)
