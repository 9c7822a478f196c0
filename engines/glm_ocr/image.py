"""Image loading and GLM-OCR's image preprocessing.

`load_image(path)` turns any file PIL can read into an upright 8-bit RGB image, or raises
EngineError with one clear line (never a traceback) for empty, truncated, non-image, too
large or too elongated inputs.

`preprocess(image, config)` is GLM-OCR's image processor itself: transformers'
Glm46VImageProcessorPil (PIL backend, no torch) with the checkpoint's preprocessor_config.json:
smart resize to multiples of patch * merge = 28 within [min_pixels, max_pixels] counted over
the 2 temporal frames, bicubic resize, rescale, CLIP mean/std, patches ordered by 2x2 merge
windows.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from engines.types import EngineError, one_line

# The largest image we decode at all. A decompression bomb declares a huge size in a tiny
# file; we refuse it from the header, before any pixel is decoded. 80 MP (a 600 dpi A3
# scan is 70 MP) is far beyond what the model can use: it sees at most ~4.8 MP. It is
# below Pillow's own bomb warning (89 MP), so our message, with the size, is the one shown.
MAX_SOURCE_PIXELS = 80_000_000

# GLM-OCR's smart_resize refuses aspect ratios above this (transformers raises ValueError).
MAX_ASPECT_RATIO = 200

# OpenAI CLIP statistics, as in GLM-OCR's preprocessor_config.json.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class ImageProcessorConfig:
    """GLM-OCR's preprocessor_config.json. The pixel bounds count both temporal frames,
    so one image's budget is half of them (as in transformers' smart_resize)."""

    min_pixels: int = 12544  # size.shortest_edge in the checkpoint's file (112 * 112)
    max_pixels: int = 9633792  # size.longest_edge in the checkpoint's file
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> "ImageProcessorConfig":
        """Read preprocessor_config.json if the directory has one, else GLM-OCR's defaults."""
        path = Path(model_dir) / "preprocessor_config.json"
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise EngineError(f"cannot read {path}: {exc}") from None
        size = raw.get("size") or {}
        defaults = cls()
        return cls(
            min_pixels=int(size.get("shortest_edge", raw.get("min_pixels", defaults.min_pixels))),
            max_pixels=int(size.get("longest_edge", raw.get("max_pixels", defaults.max_pixels))),
            patch_size=int(raw.get("patch_size", defaults.patch_size)),
            temporal_patch_size=int(raw.get("temporal_patch_size", defaults.temporal_patch_size)),
            merge_size=int(raw.get("merge_size", defaults.merge_size)),
            image_mean=tuple(raw.get("image_mean", defaults.image_mean)),
            image_std=tuple(raw.get("image_std", defaults.image_std)),
        )


# ---------------------------------------------------------------------------------------
# Loading


def load_image(path: str | os.PathLike) -> Image.Image:
    """Open `path` as an upright 8-bit RGB image (EXIF orientation applied, transparency
    composited on white, CMYK / palette / 16-bit / float converted). Raises EngineError."""
    path = Path(path)
    name = path.name or str(path)
    if not path.exists():
        raise EngineError(f"image not found: {path}")
    if path.is_dir():
        raise EngineError(f"{path} is a directory, not an image file")
    if path.stat().st_size == 0:
        raise EngineError(f"{name} is empty (0 bytes)")
    try:
        # PIL warns above Image.MAX_IMAGE_PIXELS and raises above twice that; make the
        # warning an error too, so no half-decoded giant slips through.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as opened:
                _refuse_oversized(name, opened.size)
                opened.load()  # decodes now, so truncation is found here
                image = _upright(opened)
    except EngineError:
        raise
    except UnidentifiedImageError:
        raise EngineError(f"{name} is not an image (or not a format Pillow can read)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise EngineError(f"{name} is too large to decode safely (decompression bomb guard)") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise EngineError(f"{name} is truncated or corrupt: {one_line(exc)}") from None
    except MemoryError:
        raise EngineError(f"{name} is too large to decode in memory") from None

    try:
        rgb = to_rgb(image)
    except (ValueError, OSError) as exc:  # a mode Pillow cannot convert (e.g. premultiplied "La")
        raise EngineError(f"{name} has an unsupported pixel format ({image.mode}): {one_line(exc)}") from None
    if min(rgb.size) < 1:
        raise EngineError(f"{name} has no pixels ({rgb.size[0]}x{rgb.size[1]})")
    return rgb


def upright_size(path: str | os.PathLike) -> tuple[int, int]:
    """(width, height) of the image at `path` as load_image gives it (EXIF orientation
    applied), read from its header without decoding the pixels: what its image tokens depend
    on. An image that cannot be opened raises as load_image does."""
    try:
        with Image.open(path) as opened:
            width, height = opened.size
            orientation = opened.getexif().get(0x0112)  # EXIF Orientation: 5-8 turn it a quarter
    except (OSError, SyntaxError, ValueError, EOFError, UnidentifiedImageError, Image.DecompressionBombError):
        load_image(path)  # the one place that says what is wrong with it
        raise
    _refuse_oversized(Path(path).name, (width, height))
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def _refuse_oversized(name: str, size: tuple[int, int]) -> None:
    width, height = size
    if width * height > MAX_SOURCE_PIXELS:
        raise EngineError(
            f"{name} is {width}x{height} = {width * height / 1e6:.0f} MP, above the "
            f"{MAX_SOURCE_PIXELS / 1e6:.0f} MP limit (decompression bomb guard)"
        )


def _upright(image: Image.Image) -> Image.Image:
    """A copy rotated/flipped as the EXIF Orientation tag says (phones store photos
    sideways). A broken EXIF block must not lose the image: then it is used as stored."""
    try:
        upright = ImageOps.exif_transpose(image)
    except Exception:
        upright = None
    upright = upright if upright is not None else image.copy()
    if "transparency" in image.info and "transparency" not in upright.info:
        upright.info["transparency"] = image.info["transparency"]
    return upright


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode -> 8-bit RGB. Transparency goes on white (as transformers'
    convert_to_rgb does); 16-bit and 32-bit data are scaled down, not clipped."""
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        return _high_depth_to_rgb(image)
    if mode == "La":  # premultiplied; Pillow converts it only to LA
        image = image.convert("LA")
    has_alpha = "A" in image.getbands() or "a" in image.getbands() or image.info.get("transparency") is not None
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


def _high_depth_to_rgb(image: Image.Image) -> Image.Image:
    """16-bit or 32-bit grayscale -> 8-bit. PIL's own convert clips at 255, which turns a
    16-bit scan almost white; scale by the range the data was stored in instead."""
    values = np.asarray(image, dtype=np.float64)
    peak = float(values.max()) if values.size else 0.0
    if image.mode == "F" and peak <= 1.0:
        full_scale = 1.0
    elif peak <= 255:
        full_scale = 255.0
    elif peak <= 65535:
        full_scale = 65535.0
    else:
        full_scale = peak
    gray = np.clip(np.rint(values / full_scale * 255.0), 0, 255).astype(np.uint8)
    return Image.fromarray(gray, mode="L").convert("RGB")


# ---------------------------------------------------------------------------------------
# Preprocessing


def smart_resize(height: int, width: int, config: ImageProcessorConfig) -> tuple[int, int]:
    """GLM-OCR's target size: multiples of `factor`, the pixel count of the 2 temporal
    frames within [min_pixels, max_pixels], aspect ratio kept -- transformers' own
    smart_resize of the GLM-4.6V processor; an extreme aspect ratio is one clear line."""
    from transformers.models.glm46v.image_processing_pil_glm46v import smart_resize as glm46v_smart_resize

    try:
        return glm46v_smart_resize(config.temporal_patch_size, height, width, config.temporal_patch_size,
                                   config.factor, config.min_pixels, config.max_pixels)
    except ValueError:
        ratio = max(height, width) / max(min(height, width), 1)
        raise EngineError(
            f"image aspect ratio {ratio:.0f}:1 is too extreme (GLM-OCR accepts at most {MAX_ASPECT_RATIO}:1); "
            "crop it into pieces") from None


def preprocess(
    image: Image.Image, config: ImageProcessorConfig | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """RGB image -> (pixel_values float32 [grid_h * grid_w, 3 * T * P * P],
    image_grid_thw int64 [1, 3] = [[1, grid_h, grid_w]]) from transformers' GLM-4.6V image
    processor, PIL backend (no torch): GLM-OCR's own preprocessing."""
    from transformers import Glm46VImageProcessorPil

    config = config or ImageProcessorConfig()
    smart_resize(image.height, image.width, config)  # refuses an extreme aspect ratio in one line
    processor = Glm46VImageProcessorPil(
        size={"shortest_edge": config.min_pixels, "longest_edge": config.max_pixels},
        patch_size=config.patch_size, temporal_patch_size=config.temporal_patch_size, merge_size=config.merge_size,
        image_mean=list(config.image_mean), image_std=list(config.image_std))
    out = processor(images=[to_rgb(image)], return_tensors="np")
    return np.asarray(out["pixel_values"], dtype=np.float32), np.asarray(out["image_grid_thw"], dtype=np.int64)


def num_image_tokens(image_grid_thw: np.ndarray, merge_size: int = 2) -> int:
    """How many <|image|> tokens the prompt needs: one per merge window."""
    t, h, w = (int(v) for v in np.asarray(image_grid_thw).reshape(-1, 3)[0])
    return t * h * w // (merge_size * merge_size)
