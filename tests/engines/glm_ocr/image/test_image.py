"""GLM-OCR image loading and preprocessing: equality with transformers' own GLM-OCR image
processor, and every bad input gives a correct result or one clear EngineError line.

The reference processor is loaded with AutoImageProcessor from GLM-OCR's own
preprocessor_config.json (verbatim below), so it is whatever class transformers picks for
the real checkpoint (here the PIL backend, Glm46VImageProcessorPil: no torchvision)."""

from __future__ import annotations

import io
import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from engines.types import EngineError
from engines.glm_ocr.image import (
    ImageProcessorConfig,
    load_image,
    upright_size,
    num_image_tokens,
    preprocess,
    smart_resize,
)

# zai-org/GLM-OCR's preprocessor_config.json.
GLM_OCR_PREPROCESSOR_CONFIG = {
    "size": {"shortest_edge": 12544, "longest_edge": 9633792},
    "do_rescale": True,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Glm46VImageProcessor",
    "processor_class": "Glm46VProcessor",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("glm_ocr_processor")
    (directory / "preprocessor_config.json").write_text(json.dumps(GLM_OCR_PREPROCESSOR_CONFIG))
    return directory


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def config(model_dir):
    return ImageProcessorConfig.from_dir(model_dir)


def _reference(processor, image, **kwargs):
    out = processor(image, return_tensors="np", **kwargs)
    return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])


def _noise(width, height, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2, "CMYK": 4}[mode]
    data = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    return Image.fromarray(data[..., 0] if channels == 1 else data, mode=mode)


def test_config_is_read_from_the_checkpoint_file(config):
    assert (config.min_pixels, config.max_pixels) == (12544, 9633792)
    assert (config.patch_size, config.merge_size, config.temporal_patch_size) == (14, 2, 2)
    assert config.image_mean == tuple(GLM_OCR_PREPROCESSOR_CONFIG["image_mean"])


@pytest.mark.parametrize("width,height", [(1, 1), (28, 28), (100, 37), (37, 100), (640, 480), (1700, 90)])
def test_preprocess_equals_glm_ocr_processor_on_sizes(reference, config, width, height):
    image = _noise(width, height, seed=width * 7 + height)
    expected_pixels, expected_grid = _reference(reference, image)
    pixels, grid = preprocess(image, config)
    assert grid.tolist() == expected_grid.tolist()
    assert pixels.shape == expected_pixels.shape and pixels.dtype == np.float32
    np.testing.assert_allclose(pixels, expected_pixels, rtol=0, atol=1e-6)


def test_preprocess_equals_processor_when_downscaling_to_max_pixels(reference):
    # A small budget exercises the max_pixels branch without a huge image.
    small = ImageProcessorConfig(min_pixels=3136, max_pixels=2 * 28 * 28 * 12)
    image = _noise(500, 300, seed=3)
    expected_pixels, expected_grid = _reference(
        reference, image, size={"shortest_edge": 3136, "longest_edge": 2 * 28 * 28 * 12}
    )
    pixels, grid = preprocess(image, small)
    assert grid.tolist() == expected_grid.tolist()
    assert grid[0, 1] * grid[0, 2] * 14 * 14 * 2 <= small.max_pixels
    np.testing.assert_allclose(pixels, expected_pixels, rtol=0, atol=1e-6)


def _save(image, path, **params):
    image.save(path, **params)
    return path


@pytest.mark.parametrize(
    "mode,fmt",
    [("L", "PNG"), ("RGBA", "PNG"), ("LA", "PNG"), ("CMYK", "JPEG"), ("1", "PNG"), ("P", "PNG")],
)
def test_modes_load_and_preprocess_as_the_processor_does(tmp_path, reference, config, mode, fmt):
    """Through the file: our load_image + preprocess equals the processor given the file as
    PIL opened it (the processor composites transparency on white and converts to RGB)."""
    if mode == "1":
        source = _noise(90, 60, "L", seed=5).convert("1")
    elif mode == "P":
        source = _noise(90, 60, "RGB", seed=6).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    else:
        source = _noise(90, 60, mode, seed=7)
    path = _save(source, tmp_path / f"image.{fmt.lower()}", format=fmt)
    with Image.open(path) as opened:
        assert opened.mode == mode
        expected_pixels, expected_grid = _reference(reference, opened.copy())
    image = load_image(path)
    assert image.mode == "RGB" and image.size == (90, 60)
    pixels, grid = preprocess(image, config)
    assert grid.tolist() == expected_grid.tolist()
    np.testing.assert_allclose(pixels, expected_pixels, rtol=0, atol=1e-6)


def test_alpha_is_composited_on_white(tmp_path):
    data = np.zeros((10, 10, 4), dtype=np.uint8)
    data[..., 0] = 200  # red-ish, but fully transparent on the left half
    data[:, 5:, 3] = 255
    image = load_image(_save(Image.fromarray(data, "RGBA"), tmp_path / "alpha.png"))
    pixels = np.asarray(image)
    assert (pixels[:, :5] == 255).all()  # transparent -> white, not black
    assert (pixels[:, 5:] == [200, 0, 0]).all()


def test_palette_with_transparency_goes_on_white(tmp_path):
    image = Image.new("P", (12, 8), 0)
    image.putpalette([0, 0, 0, 10, 20, 30] + [0, 0, 0] * 254)
    image.paste(1, (6, 0, 12, 8))
    path = _save(image, tmp_path / "palette.png", transparency=0)
    with Image.open(path) as opened:
        assert opened.mode == "P" and "transparency" in opened.info
    pixels = np.asarray(load_image(path))
    assert (pixels[:, :6] == 255).all()
    assert (pixels[:, 6:] == [10, 20, 30]).all()


def test_16_bit_png_is_scaled_not_clipped(tmp_path):
    # PIL's own convert("RGB") clips 16-bit values at 255 and turns this gradient white.
    gradient = np.linspace(0, 65535, 64 * 32).reshape(32, 64).astype(np.uint16)
    path = _save(Image.fromarray(gradient), tmp_path / "deep.png")
    with Image.open(path) as opened:
        assert opened.mode.startswith("I")
    pixels = np.asarray(load_image(path))
    expected = np.rint(gradient / 65535 * 255).astype(np.uint8)
    assert (pixels[..., 0] == expected).all() and (pixels[..., 1] == expected).all()
    assert pixels.min() == 0 and pixels.max() == 255


def test_exif_orientation_6_is_applied(tmp_path):
    # Stored 40 wide x 20 high: left half red, right half blue. Orientation 6 means
    # "rotate 90 degrees clockwise to display": the left half goes to the top.
    stored = Image.new("RGB", (40, 20), (255, 0, 0))
    stored.paste((0, 0, 255), (20, 0, 40, 20))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = _save(stored, tmp_path / "rotated.jpg", format="JPEG", exif=exif, quality=95)
    image = load_image(path)
    assert image.size == (20, 40)
    pixels = np.asarray(image).astype(int)
    top, bottom = pixels[:16].mean(axis=(0, 1)), pixels[24:].mean(axis=(0, 1))
    assert top[0] > 200 and top[2] < 60
    assert bottom[2] > 200 and bottom[0] < 60


def test_the_upright_size_from_the_header_is_load_images(tmp_path):
    """What the prompt's image tokens are counted from without decoding (serve's usage): the
    size load_image gives, EXIF orientation included; a bad file raises as load_image does."""
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = _save(Image.new("RGB", (40, 20)), tmp_path / "rotated.jpg", format="JPEG", exif=exif)
    plain = _save(Image.new("RGB", (40, 20)), tmp_path / "plain.png", format="PNG")
    for path in (rotated, plain):
        assert upright_size(path) == load_image(path).size
    assert upright_size(rotated) == (20, 40)
    (tmp_path / "not.png").write_bytes(b"not an image")
    with pytest.raises(EngineError, match="not an image"):
        upright_size(tmp_path / "not.png")


def test_one_pixel_image_gives_the_minimum_grid(tmp_path, reference, config):
    path = _save(Image.new("RGB", (1, 1), (10, 200, 30)), tmp_path / "dot.png")
    pixels, grid = preprocess(load_image(path), config)
    expected_pixels, expected_grid = _reference(reference, Image.new("RGB", (1, 1), (10, 200, 30)))
    assert grid.tolist() == expected_grid.tolist() == [[1, 6, 6]]
    np.testing.assert_allclose(pixels, expected_pixels, rtol=0, atol=1e-6)
    assert num_image_tokens(grid) == 9


def test_20000_px_wide_line_is_downscaled_within_the_budget(tmp_path, reference, config):
    line = Image.new("L", (20000, 200), 255)
    line.paste(0, (0, 90, 20000, 110))
    path = _save(line, tmp_path / "wide.png")
    image = load_image(path)
    pixels, grid = preprocess(image, config)
    expected_pixels, expected_grid = _reference(reference, Image.open(path).convert("RGB"))
    assert grid.tolist() == expected_grid.tolist()
    assert 2 * grid[0, 1] * grid[0, 2] * 14 * 14 <= config.max_pixels
    np.testing.assert_allclose(pixels, expected_pixels, rtol=0, atol=1e-6)


def _assert_clear(excinfo, *words):
    message = str(excinfo.value)
    assert "\n" not in message and "Traceback" not in message
    for word in words:
        assert word in message, message


def test_20000_by_20_is_refused_with_the_aspect_ratio(tmp_path, config):
    path = _save(Image.new("L", (20000, 20), 255), tmp_path / "strip.png")
    image = load_image(path)  # loading is fine; the model cannot take 1000:1
    with pytest.raises(EngineError) as excinfo:
        preprocess(image, config)
    _assert_clear(excinfo, "aspect ratio", "1000:1", "200:1")


def test_zero_byte_file(tmp_path):
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    with pytest.raises(EngineError) as excinfo:
        load_image(path)
    _assert_clear(excinfo, "empty.png", "empty")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_file(tmp_path, fmt):
    buffer = io.BytesIO()
    _noise(200, 150, seed=9).save(buffer, format=fmt)
    data = buffer.getvalue()
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(EngineError) as excinfo:
        load_image(path)
    _assert_clear(excinfo, path.name, "truncated or corrupt")


def test_text_file_is_not_an_image(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("this is not a picture\n" * 20)
    with pytest.raises(EngineError) as excinfo:
        load_image(path)
    _assert_clear(excinfo, "notes.png", "not an image")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(EngineError) as excinfo:
        load_image(tmp_path / "nowhere.png")
    _assert_clear(excinfo, "not found")
    with pytest.raises(EngineError) as excinfo:
        load_image(tmp_path)
    _assert_clear(excinfo, "directory")


def _png_with_declared_size(width, height):
    """A real 1x1 PNG whose IHDR then claims width x height (CRC fixed): a decompression
    bomb's header without the bomb."""
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17])) & 0xFFFFFFFF
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


@pytest.mark.parametrize("side", [10000, 40000])
def test_decompression_bomb_header_is_refused_before_decoding(tmp_path, side):
    # 10000^2 = 100 MP trips our cap (and Pillow's warning); 40000^2 trips Pillow's error.
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_with_declared_size(side, side))
    with pytest.raises(EngineError) as excinfo:
        load_image(path)
    _assert_clear(excinfo, "bomb.png", "decompression bomb")


def test_smart_resize_matches_transformers_on_many_sizes():
    from transformers.models.glm46v.image_processing_pil_glm46v import smart_resize as reference_resize

    config = ImageProcessorConfig()
    rng = np.random.default_rng(0)
    sizes = [(1, 1), (27, 29), (6000, 4000), (100, 19999)] + [tuple(rng.integers(1, 9000, 2)) for _ in range(200)]
    for height, width in sizes:
        if max(height, width) / min(height, width) > 150:  # past transformers' ValueError
            continue
        expected = reference_resize(2, int(height), int(width), 2, 28, config.min_pixels, config.max_pixels)
        assert smart_resize(int(height), int(width), config) == expected


def test_every_pil_mode_becomes_rgb():
    """All of Pillow's modes (TIFF and PSD files decode to many of them)."""
    from engines.glm_ocr.image import to_rgb

    for mode in ["1", "L", "P", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "HSV", "I", "F", "LA", "PA",
                 "RGBX", "RGBa", "La", "I;16", "I;16B", "I;16L"]:
        image = to_rgb(Image.new(mode, (6, 4)))
        assert image.mode == "RGB" and image.size == (6, 4), mode
