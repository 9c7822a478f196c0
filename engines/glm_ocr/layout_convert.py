"""Convert the layout model (PP-DocLayoutV3) into a Core ML package.

    convert_layout(model_dir, out_dir, progress=None) -> manifest

writes to out_dir:
  layout.mlpackage   transformers' PPDocLayoutV3ForObjectDetection at the preprocessor's fixed
                     size: pixel_values (1, 3, H, W) -> logits (1, Q, labels), pred_boxes (1, Q, 4:
                     cx, cy, w, h in fractions of the page), order_logits (1, Q, Q); ML program,
                     float16 compute, macOS 15
  config.json, preprocessor_config.json   copied: the labels and the page's preprocessing
  manifest.json      input size, outputs, labels, per-output parity, the source checkpoint (path,
                     sha256), converter versions; written last, so its presence means "complete"

The page's preprocessing and the decoding of the outputs stay on the host (layout.py), the same
code for both runtimes. What is traced is transformers' own model with four conversion patches
(conversion_patches: without three of them coremltools 9.0 does not convert it); the traced graph is
checked against the unpatched eager model on a page other than the one it was traced on
(float32, max abs error per output, into the manifest).

layout_coreml.CoreMLLayout runs the package (macOS 15+). UNCHECKED: Core ML's own prediction
of it (float16, the topk choosing queries in float16 included) has never run here: coremltools
predicts on macOS only.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import numpy as np

from engines.glm_ocr.layout import LayoutModel, Preprocessing, pixel_values
from engines.glm_ocr.layout_coreml import MANIFEST_FORMAT, OUTPUTS, PACKAGE, is_conversion
from engines.types import EngineError

try:  # conversion needs the `convert` extra; this module still imports without it
    import torch.nn as nn

    _Module = nn.Module
except ImportError:  # pragma: no cover - exercised only where torch is absent
    _Module = object

MANIFEST_VERSION = 1
COPIED = ("config.json", "preprocessor_config.json")
PARITY_RTOL = 1e-4  # float32, relative to the reference output's largest magnitude (as convert.py)

Progress = Callable[[str, float], None]


# ----------------------------------------------------------------------------- conversion


def convert_layout(model_dir: str | os.PathLike, out_dir: str | os.PathLike, progress: Progress | None = None) -> dict:
    """Convert the PP-DocLayoutV3 checkpoint in `model_dir` into `out_dir`; returns the manifest
    (also written to out_dir/manifest.json). EngineError with one line for user errors and for a
    parity check that fails."""
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only where torch is absent
        raise EngineError("conversion needs torch and transformers: pip install 'specscope[convert]'") from None
    from engines.glm_ocr.convert import checkpoint_hash, converter_versions

    report = progress or (lambda message, fraction: None)
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if not model_dir.is_dir():
        raise EngineError(f"checkpoint directory not found: {model_dir}")
    if model_dir.resolve() == out_dir.resolve():
        raise EngineError("--out must differ from --from (the checkpoint is not overwritten)")
    if (model_dir / "manifest.json").is_file():
        raise EngineError(f"{model_dir} is a Core ML conversion already; convert the checkpoint it came from")
    prep = Preprocessing.from_dir(model_dir)
    if not prep.do_resize:
        raise EngineError(f"{model_dir.name}'s preprocessor does not resize pages to one size; the Core ML "
                          "package takes a fixed size")
    report("loading the checkpoint with transformers", 0.0)
    layout = LayoutModel.load(model_dir)  # refuses a checkpoint of another architecture
    _prepare_out_dir(out_dir)
    report("hashing the source checkpoint", 0.05)
    source_hash = checkpoint_hash(model_dir)

    report("tracing the model", 0.1)
    torch.manual_seed(0)
    detector = Detector(layout.model).eval()
    traced_on, checked_on = (_page_pixels(seed, prep) for seed in (0, 1))
    with conversion_patches():
        with torch.no_grad():
            detector(traced_on)  # fills transformers' caches of the size's constants (see conversion_patches)
        traced = _trace(detector, traced_on)
    report("checking the traced model against transformers' on another page", 0.3)
    with torch.no_grad():
        got = traced(checked_on)
        expected = detector(checked_on)  # the unpatched eager model
    parity = {name: _parity(name, g, e) for name, g, e in zip(OUTPUTS, got, expected)}
    worst = max(parity.values(), key=lambda r: r["max_abs_error"] / r["tolerance"])
    if not all(r["ok"] for r in parity.values()):
        raise EngineError(f"parity check failed for the layout model: max abs error {worst['max_abs_error']:.3g} > "
                          f"{worst['tolerance']:.3g}; the conversion is not trustworthy")

    report("converting with coremltools (ML program, float16)", 0.4)
    started = time.perf_counter()
    _convert(traced, prep, out_dir / PACKAGE)
    seconds = round(time.perf_counter() - started, 2)
    copied = [name for name in COPIED if (model_dir / name).is_file()]
    for name in copied:
        shutil.copy2(model_dir / name, out_dir / name)

    manifest = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": {"path": str(model_dir.resolve()), "sha256": source_hash},
        "converters": converter_versions(),
        "compute_precision": "float16",
        "minimum_deployment_target": "macOS15",
        "package": {"path": PACKAGE, "conversion_seconds": seconds},
        "input": {"pixel_values": {"shape": [1, 3, prep.height, prep.width], "dtype": "float32"}},
        "outputs": {name: {"shape": list(x.shape), "dtype": "float32"} for name, x in zip(OUTPUTS, got)},
        "id2label": {str(k): v for k, v in layout.id2label.items()},
        "parity": parity,
        "unchecked": "Core ML prediction of the package (float16): it runs on macOS only",
        "copied_files": copied,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    report("done", 1.0)
    return manifest


def _prepare_out_dir(out_dir: Path) -> None:
    """An empty or new directory, or one holding an earlier layout conversion (replaced)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise EngineError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not is_conversion(out_dir):
            raise EngineError(f"{out_dir} is not empty and holds no earlier layout conversion; choose another --out")
        (out_dir / "manifest.json").unlink()  # from here on the directory is incomplete
        shutil.rmtree(out_dir / PACKAGE, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)


def _page_pixels(seed: int, prep):
    """A white A4 page at 150 dpi with twelve grey blocks at seeded places, preprocessed as
    layout.pixel_values does: the tracing (seed 0) and checking (seed 1) input."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    page = Image.new("RGB", (1240, 1754), "white")
    draw = ImageDraw.Draw(page)
    for _ in range(12):
        x, y = int(rng.integers(60, 1000)), int(rng.integers(60, 1600))
        grey = int(rng.integers(0, 160))
        draw.rectangle((x, y, x + int(rng.integers(20, 600)), y + int(rng.integers(8, 300))), fill=(grey,) * 3)
    return pixel_values(page, prep)


def _parity(name: str, got, expected) -> dict:
    """Max abs error of one output. order_logits is compared above its diagonal only: reading
    order reads those (layout.reading_ranks); the rest is the model's constant -1e4 mask."""
    got, expected = (np.asarray(x.detach(), dtype=np.float64)[0] for x in (got, expected))
    if got.shape != expected.shape:
        raise EngineError(f"parity check of {name}: shape {got.shape} != reference {expected.shape}")
    if name == "order_logits":
        upper = np.triu_indices(got.shape[-1], k=1)
        got, expected = got[upper], expected[upper]
    scale = float(np.abs(expected).max())
    error, tolerance = float(np.abs(got - expected).max()), PARITY_RTOL * max(1.0, scale)
    return {"reference": f"transformers PPDocLayoutV3ForObjectDetection ({name}), eager", "max_abs_error": error,
            "reference_max_abs": scale, "tolerance": tolerance, "ok": error <= tolerance,
            "checked": "traced torch module vs the unpatched eager model, float32, a preprocessed page other "
                       "than the one traced"}


class Detector(_Module):
    """The three outputs the decoding reads (layout.decode_detections), as a tuple."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return out.logits, out.pred_boxes, out.order_logits


def _trace(module, example):
    import warnings

    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jit.trace's deprecation and its tracer warnings on shapes
        return torch.jit.trace(module, (example,), check_trace=False)


def _convert(traced, prep, path: Path) -> None:
    import coremltools as ct

    from engines.glm_ocr.convert import fix_coremltools_cast_for_numpy2

    fix_coremltools_cast_for_numpy2()
    with warnings.catch_warnings():
        # clamp(min=eps)'s open upper bound (float32's largest value: inverse_sigmoid clamps so)
        # is inf in float16, and numpy warns of the overflow; clip(x, eps, inf) is what is meant
        warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
        mlmodel = ct.convert(
            traced,
            inputs=[ct.TensorType(name="pixel_values", shape=(1, 3, prep.height, prep.width), dtype=np.float32)],
            outputs=[ct.TensorType(name=name, dtype=np.float32) for name in OUTPUTS],
            convert_to="mlprogram",
            compute_precision=ct.precision.FLOAT16,
            minimum_deployment_target=ct.target.macOS15,
            skip_model_load=True,  # loading compiles, which needs macOS; the runtime loads later
        )
    mlmodel.save(str(path))


@contextmanager
def conversion_patches():
    """While tracing, transformers' module with four changes (nothing else in the traced graph is
    ours), each equal to what it replaces in float32:
      - the decoder's deformable attention runs as deformable_attention_rank5: Core ML takes
        tensors of rank 5 at most, and transformers' sampling offsets and locations are rank 6
        (batch, query, head, level, point, xy); levels and points are one axis here
      - mask_to_box_coordinate runs as mask_boxes_finite
      - the two things computed from the feature maps' sizes, the encoder's sine position
        embeddings and the decoder's anchors, get those sizes as Python ints (`int` for
        `torch_int`, anchors_by_int_sizes), so the eager forward before tracing fills
        transformers' caches of them and the trace finds them there: constants. Traced as ops,
        coremltools 9.0 fails on both: the embeddings' float64 aranges become int32 and its matmul
        refuses int32 x float32 (the `outer` of emb_h), and the anchors' in-place
        `grid_xy[..., 0] /= width` becomes a slice_update of the wrong shape. The page size is
        fixed anyway."""
    from transformers.models.pp_doclayout_v3 import modeling_pp_doclayout_v3 as modeling

    model_class, attention_class = modeling.PPDocLayoutV3Model, modeling.PPDocLayoutV3MultiscaleDeformableAttention
    originals = (modeling.mask_to_box_coordinate, modeling.torch_int, model_class.generate_anchors,
                 attention_class.forward)

    def anchors_by_int_sizes(self, spatial_shapes=None, *args, **kwargs):
        if spatial_shapes is not None:
            spatial_shapes = tuple((int(h), int(w)) for h, w in spatial_shapes)
        return originals[2](self, spatial_shapes, *args, **kwargs)

    modeling.mask_to_box_coordinate, modeling.torch_int = mask_boxes_finite, int
    model_class.generate_anchors, attention_class.forward = anchors_by_int_sizes, deformable_attention_rank5
    try:
        yield
    finally:
        (modeling.mask_to_box_coordinate, modeling.torch_int, model_class.generate_anchors,
         attention_class.forward) = originals


def deformable_attention_rank5(self, hidden_states, attention_mask=None, encoder_hidden_states=None,
                               encoder_attention_mask=None, position_embeddings=None, reference_points=None,
                               spatial_shapes=None, spatial_shapes_list=None, level_start_index=None, **kwargs):
    """PPDocLayoutV3MultiscaleDeformableAttention.forward (with its MultiScaleDeformableAttention)
    in tensors of rank 5 at most: the same products and sums, levels and points as one axis where
    transformers keeps two. Only what this model passes: boxes as reference points, one for every
    level (transformers' (batch, query, 1, 4))."""
    import torch
    import torch.nn.functional as F

    if position_embeddings is not None:
        hidden_states = hidden_states + position_embeddings
    batch, queries, _ = hidden_states.shape
    heads, levels, points = self.n_heads, self.n_levels, self.n_points
    head_dim = self.d_model // heads
    if reference_points.shape[-1] != 4 or reference_points.shape[2] != 1:
        raise EngineError(f"the layout model's conversion takes one box per query as its reference point, not "
                          f"{tuple(reference_points.shape)}")
    value = self.value_proj(encoder_hidden_states)  # (batch, sequence, heads * head_dim)
    if attention_mask is not None:
        value = value.masked_fill(~attention_mask[..., None], float(0))
    offsets = self.sampling_offsets(hidden_states).view(batch, queries, heads, levels * points, 2)
    weights = F.softmax(self.attention_weights(hidden_states).view(batch, queries, heads, levels * points), -1)
    boxes = reference_points.view(batch, queries, 1, 1, 4)
    locations = boxes[..., :2] + offsets / points * boxes[..., 2:] * 0.5  # (batch, query, head, level*point, xy)
    grids = (2 * locations - 1).transpose(1, 2).reshape(batch * heads, queries, levels, points, 2)
    sampled = []
    for level, part in enumerate(value.split([h * w for h, w in spatial_shapes_list], dim=1)):
        height, width = spatial_shapes_list[level]
        level_value = part.transpose(1, 2).reshape(batch * heads, head_dim, height, width)
        sampled.append(F.grid_sample(level_value, grids[:, :, level], mode="bilinear", padding_mode="zeros",
                                     align_corners=False))  # (batch * heads, head_dim, query, point)
    weights_by_head = weights.transpose(1, 2).reshape(batch * heads, 1, queries, levels * points)
    output = (torch.stack(sampled, dim=-2).flatten(-2) * weights_by_head).sum(-1)
    output = output.view(batch, heads * head_dim, queries).transpose(1, 2).contiguous()
    return self.output_proj(output), weights.view(batch, queries, heads, levels, points)


def mask_boxes_finite(mask, dtype):
    """transformers' mask_to_box_coordinate (the mask-enhanced queries' first boxes) with the
    pixels outside a mask filled with the mask's width + height instead of float32's largest
    value. Equal in float32: the fill only wins a min over an empty mask, whose box is then
    multiplied by 0. Why: float32's largest value is inf in float16, and inf * 0 is NaN, so on
    Core ML a query whose mask is empty would get a NaN box."""
    import torch

    mask = mask.bool()
    height, width = mask.shape[-2:]
    y_coords, x_coords = torch.meshgrid(torch.arange(height, device=mask.device),
                                        torch.arange(width, device=mask.device), indexing="ij")
    x_coords, y_coords = x_coords.to(dtype), y_coords.to(dtype)
    beyond = torch.full((), float(width + height), dtype=dtype, device=mask.device)
    x_masked, y_masked = x_coords * mask, y_coords * mask
    x_max = x_masked.flatten(start_dim=-2).max(dim=-1).values + 1
    x_min = torch.where(mask, x_masked, beyond).flatten(start_dim=-2).min(dim=-1).values
    y_max = y_masked.flatten(start_dim=-2).max(dim=-1).values + 1
    y_min = torch.where(mask, y_masked, beyond).flatten(start_dim=-2).min(dim=-1).values
    box = torch.stack([x_min, y_min, x_max, y_max], dim=-1) * torch.any(mask, dim=(-2, -1)).unsqueeze(-1)
    box = box / torch.tensor([width, height, width, height], device=mask.device, dtype=dtype)
    x1, y1, x2, y2 = box.unbind(dim=-1)
    return torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], dim=-1)
