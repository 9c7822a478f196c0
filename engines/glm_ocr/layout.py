"""The layout stage: PP-DocLayoutV3 finds a page's regions (label, box, reading order), the
first of GLM-OCR's two stages; each region is then read with its task's prompt (document.py).

Where things happen (`LayoutModel.regions` top to bottom):
  load         config.json must say pp_doclayout_v3; transformers' own
               PPDocLayoutV3ForObjectDetection reads the safetensors. A Core ML conversion
               (layout_coreml.py) runs on Core ML where it loads (macOS 15+), else on PyTorch from
               the checkpoint it was converted from
  preprocess   the page as transformers' PPDocLayoutV3ImageProcessor makes it, in torch: that
               class imports torchvision, which cannot be installed beside the locked CPU torch
               on Linux, so `pixel_values` repeats its few steps (see there)
  detect       the model's outputs -> Detections as the processor's post_process_object_detection
               makes them (scores, labels, boxes in page pixels, reading order), polygons left out
  find_regions the official glmocr SDK's post-processing (0.1.5: glmocr/layout/layout_detector.py,
               glmocr/utils/layout_postprocess_utils.py, glmocr/config.yaml): per-class score
               thresholds, NMS, the page-sized-image filter, merging of contained boxes (large /
               small by class), reading order, unclip, clamping, the label -> task mapping.
               Written to match the SDK on the same detections (tests/engines/glm_ocr/
               test_layout_sdk.py runs the SDK's own functions beside it): the product does not
               import the SDK, whose package pulls PyMuPDF (AGPL).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engines.types import EngineError

MODEL_TYPE = "pp_doclayout_v3"

# glmocr/config.yaml, pipeline.layout.label_task_mapping: the first task whose list holds a
# label is its task; "skip" regions are kept (figures: image references) but not read,
# "abandon" regions (headers, footers, page numbers...) are dropped.
LABEL_TASKS: dict[str, tuple[str, ...]] = {
    "text": ("abstract", "algorithm", "content", "doc_title", "figure_title", "paragraph_title",
             "reference_content", "text", "vertical_text", "vision_footnote", "seal", "formula_number"),
    "table": ("table",),
    "formula": ("display_formula", "inline_formula"),
    "skip": ("chart", "image"),
    "abandon": ("header", "footer", "number", "footnote", "aside_text", "reference", "footer_image", "header_image"),
}
# pipeline.layout.layout_merge_bboxes_mode: "large" drops a box contained in a box of that
# class, "small" drops a box that contains one of that class; every class is "large" but
# `reference`.
MERGE_MODES: dict[str, str] = {"reference": "small"}
DEFAULT_MERGE_MODE = "large"
# Never merged away (layout_postprocess_utils.apply_layout_postprocess).
PRESERVED_LABELS = ("image", "seal", "chart")
NMS_IOU_SAME, NMS_IOU_DIFFERENT = 0.6, 0.98  # apply_layout_postprocess's nms() call
CONTAINED = 0.8  # a box is inside another when this share of its area is (is_contained)


@dataclass(frozen=True)
class LayoutSettings:
    """The SDK's pipeline.layout settings, its defaults. `threshold_by_class` overrides the
    score threshold per label name."""

    threshold: float = 0.3
    threshold_by_class: dict[str, float] = field(default_factory=dict)
    nms: bool = True
    unclip_ratio: tuple[float, float] = (1.0, 1.0)
    merge_modes: dict[str, str] = field(default_factory=lambda: dict(MERGE_MODES))
    label_tasks: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(LABEL_TASKS))

    def lowest_threshold(self) -> float:
        """What the detector keeps before the per-class thresholds (the SDK's pre_threshold)."""
        return min([self.threshold, *self.threshold_by_class.values()])

    def task_of(self, label: str) -> str | None:
        return next((task for task, labels in self.label_tasks.items() if label in labels), None)


@dataclass(frozen=True)
class Detection:
    """One box as the detector reports it: class id, score, (x1, y1, x2, y2) in page pixels
    (not yet clamped to the page) and the reading-order rank the model gave its query."""

    class_id: int
    score: float
    box: tuple[float, float, float, float]
    order: int


@dataclass(frozen=True)
class Region:
    """A region the layout kept: its place in the page's reading order (from 0), its label and
    task (text | table | formula | skip), its box in page pixels, and the same box in
    thousandths of the page's width and height (the SDK's bbox_2d, from which it crops)."""

    index: int
    label: str
    task: str
    box: tuple[int, int, int, int]
    bbox_2d: tuple[int, int, int, int]
    score: float


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Preprocessing:
    """preprocessor_config.json's values (the class's defaults where a key is missing); the
    published checkpoint's: 800 x 800, rescale 1/255, mean 0, std 1."""

    height: int = 800
    width: int = 800
    resample: int = 3  # PIL's BICUBIC
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    image_std: tuple[float, float, float] = (1.0, 1.0, 1.0)

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> "Preprocessing":
        path = Path(model_dir) / "preprocessor_config.json"
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise EngineError(f"cannot read {path}: {e}") from None
        d = cls()
        size = raw.get("size") or {}
        return cls(height=int(size.get("height", d.height)), width=int(size.get("width", d.width)),
                   resample=int(raw.get("resample", d.resample)), do_resize=bool(raw.get("do_resize", d.do_resize)),
                   do_rescale=bool(raw.get("do_rescale", d.do_rescale)),
                   rescale_factor=float(raw.get("rescale_factor", d.rescale_factor)),
                   do_normalize=bool(raw.get("do_normalize", d.do_normalize)),
                   image_mean=tuple(raw.get("image_mean", d.image_mean)), image_std=tuple(raw.get("image_std", d.image_std)))


# PIL resample codes -> torch.nn.functional.interpolate modes (transformers maps them so for
# torchvision, whose resize calls interpolate).
INTERPOLATE_MODES = {0: "nearest", 2: "bilinear", 3: "bicubic"}


def pixel_values(image, prep: Preprocessing = Preprocessing()):
    """An RGB PIL page -> (1, 3, height, width) float32, as PPDocLayoutV3ImageProcessor makes it:
    the uint8 image resized by torchvision's resize with antialias=False (on CPU torchvision
    hands bicubic uint8 images to torch's interpolate as they are, align_corners=False:
    transforms.v2.functional's resize_image, _do_native_uint8_resize_on_cpu), then
    transformers' fused rescale and normalise, (x - mean / rescale) / (std / rescale) in float32.
    Not PIL's resize: PIL antialiases when it shrinks, and its bicubic kernel is another one."""
    import torch
    import torch.nn.functional as F

    from engines.glm_ocr.image import to_rgb

    x = torch.from_numpy(np.array(to_rgb(image))).permute(2, 0, 1).contiguous()[None]
    if prep.do_resize and tuple(x.shape[-2:]) != (prep.height, prep.width):
        if prep.resample not in INTERPOLATE_MODES:
            raise EngineError(f"the layout model's preprocessor asks for resample {prep.resample}, which is not supported")
        mode = INTERPOLATE_MODES[prep.resample]
        x = F.interpolate(x, size=[prep.height, prep.width], mode=mode,
                          align_corners=None if mode == "nearest" else False, antialias=False)
    x = x.to(torch.float32)
    if prep.do_normalize:
        scale = 1.0 / prep.rescale_factor if prep.do_rescale else 1.0
        mean = (torch.tensor(prep.image_mean) * scale).view(-1, 1, 1)
        std = (torch.tensor(prep.image_std) * scale).view(-1, 1, 1)
        x = (x - mean) / std
    elif prep.do_rescale:
        x = x * prep.rescale_factor
    return x


class LayoutModel:
    """A PP-DocLayoutV3 checkpoint directory (config.json + safetensors, as
    PaddlePaddle/PP-DocLayoutV3_safetensors holds it), loaded once for a document's pages, or a
    Core ML conversion of one (layout_coreml.convert_layout).

    `runtime` is "torch" (`model` is transformers' module) or "coreml" (`model` is a
    layout_coreml.CoreMLLayout); `note` says why a conversion runs on torch instead."""

    def __init__(self, model, id2label: dict[int, str], prep: Preprocessing, path: str, runtime: str = "torch",
                 note: str | None = None):
        self.model = model
        self.id2label = id2label
        self.prep = prep
        self.path = path
        self.runtime = runtime
        self.note = note

    @classmethod
    def load(cls, model_dir: str | os.PathLike) -> "LayoutModel":
        path = Path(model_dir)
        if (path / "manifest.json").is_file():
            return cls._load_converted(path)
        model_type = checkpoint_type(path)
        if model_type != MODEL_TYPE:
            raise EngineError(f"{path.name} is a {model_type or 'untyped'} checkpoint, not a PP-DocLayoutV3 layout "
                              f"model (config.json's model_type must be {MODEL_TYPE})")
        import torch
        from transformers import PPDocLayoutV3ForObjectDetection

        from transformers.utils import logging as hf_logging

        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a bar for a 130 MB load would only clutter stderr
        try:
            model = PPDocLayoutV3ForObjectDetection.from_pretrained(str(path), dtype=torch.float32).eval()
        except (OSError, ValueError, RuntimeError) as e:
            raise EngineError(f"cannot load the layout model {path.name}: {str(e).splitlines()[0]}") from None
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        id2label = {int(k): v for k, v in model.config.id2label.items()}
        return cls(model, id2label, Preprocessing.from_dir(path), str(path))

    @classmethod
    def _load_converted(cls, path: Path) -> "LayoutModel":
        """Core ML where it loads (macOS 15+), else PyTorch on the checkpoint it was converted
        from, with a note saying why."""
        from engines.glm_ocr.layout_coreml import CoreMLLayout, read_manifest

        manifest = read_manifest(path)
        try:
            model = CoreMLLayout.load(path)
        except EngineError as e:
            source = Path(manifest.get("source", {}).get("path", ""))
            if not (source / "config.json").is_file():
                raise EngineError(f"{e}; and the checkpoint it was converted from, {source}, is gone") from None
            fallback = cls.load(source)
            fallback.note = f"the layout model runs on PyTorch: {e}"
            return fallback
        id2label = {int(k): v for k, v in manifest["id2label"].items()}
        return cls(model, id2label, Preprocessing.from_dir(path), str(path), runtime="coreml")

    def outputs(self, pixels):
        """One page's (logits, pred_boxes, order_logits), batch dimension dropped, torch tensors."""
        if self.runtime == "coreml":
            return self.model.outputs(pixels)
        import torch

        with torch.inference_mode():
            out = self.model(pixel_values=pixels)
        return out.logits[0], out.pred_boxes[0], out.order_logits[0]

    def detect(self, image, threshold: float) -> list[Detection]:
        """The page's detections scoring at least `threshold`, in the model's reading order."""
        logits, boxes, order = self.outputs(pixel_values(image, self.prep))
        return decode_detections(logits, boxes, order, image.width, image.height, threshold)

    def regions(self, image, settings: LayoutSettings = LayoutSettings()) -> list[Region]:
        """The regions to read, in reading order (possibly none)."""
        found = self.detect(image, settings.lowest_threshold())
        return find_regions(found, (image.width, image.height), self.id2label, settings)


def checkpoint_type(model_dir: Path) -> str | None:
    """config.json's model_type; EngineError when the directory has no readable config."""
    config = model_dir / "config.json"
    if not config.is_file():
        raise EngineError(f"{model_dir} has no config.json (expected a PP-DocLayoutV3 checkpoint directory)")
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise EngineError(f"cannot read {config}: {e}") from None
    return raw.get("model_type") if isinstance(raw, dict) else None


def decode_detections(logits, pred_boxes, order_logits, width: int, height: int, threshold: float) -> list[Detection]:
    """One page's outputs -> Detections, the steps of PPDocLayoutV3ImageProcessor's
    post_process_object_detection in the same torch calls (so ties break the same way):
    top num_queries (query, class) pairs by sigmoid score, (cx, cy, w, h) -> corners scaled to
    the page, each query's reading-order rank from the order logits, sorted by that rank."""
    import torch

    order = reading_ranks(order_logits[None])[0]
    centers, dims = torch.split(pred_boxes, 2, dim=-1)
    boxes = torch.cat([centers - 0.5 * dims, centers + 0.5 * dims], dim=-1)
    boxes = boxes * torch.tensor([width, height, width, height])[None, :]
    num_queries, num_classes = logits.shape
    scores, index = torch.topk(torch.sigmoid(logits).flatten(), num_queries)
    labels, queries = index % num_classes, index // num_classes
    keep = scores >= threshold
    ranks, sort = torch.sort(order[queries][keep])
    kept = zip(labels[keep][sort].tolist(), scores[keep][sort].tolist(), boxes[queries][keep][sort].tolist(),
               ranks.tolist())
    return [Detection(int(c), float(s), tuple(b), int(r)) for c, s, b, r in kept]


def reading_ranks(order_logits):
    """(batch, queries, queries) order logits -> each query's rank in reading order: a query's
    votes count the queries it comes after (the processor's _get_order_seqs)."""
    import torch

    scores = torch.sigmoid(order_logits)
    batch, n, _ = scores.shape
    votes = scores.triu(diagonal=1).sum(dim=1) + (1.0 - scores.transpose(1, 2)).tril(diagonal=-1).sum(dim=1)
    pointers = torch.argsort(votes, dim=1)
    ranks = torch.empty_like(pointers)
    ranks.scatter_(1, pointers, torch.arange(n, dtype=pointers.dtype).expand(batch, -1))
    return ranks


# ----------------------------------------------------------------------------- post-processing


def find_regions(detections: list[Detection], page_size: tuple[int, int], id2label: dict[int, str],
                 settings: LayoutSettings = LayoutSettings()) -> list[Region]:
    """The SDK's post-processing of one page's detections: what survives, in reading order.
    Rows are [class, score, x1, y1, x2, y2, order] as in apply_layout_postprocess."""
    width, height = page_size
    kept = [d for d in detections if d.score >= _threshold(settings, id2label.get(d.class_id))]
    if not kept:
        return []
    rows = np.array([[d.class_id, d.score, *d.box, d.order] for d in kept], dtype=np.float64)
    if settings.nms:
        rows = rows[nms(rows)]
    rows = _drop_page_sized_images(rows, width, height, id2label)
    rows = _merge_contained(rows, id2label, settings.merge_modes)
    rows = rows[np.argsort(rows[:, 6])]  # reading order
    rows = _unclip(rows, settings.unclip_ratio)
    regions: list[Region] = []
    for class_id, score, x1, y1, x2, y2, _order in rows:
        label = id2label.get(int(class_id), f"class_{int(class_id)}")
        x1, x2 = (max(0.0, min(float(v), width)) for v in (x1, x2))
        y1, y2 = (max(0.0, min(float(v), height)) for v in (y1, y2))
        if x1 >= x2 or y1 >= y2:
            continue
        task = settings.task_of(label)
        if task is None or task == "abandon":
            continue
        box = (int(x1), int(y1), int(x2), int(y2))
        bbox_2d = (int(box[0] / width * 1000), int(box[1] / height * 1000),
                   int(box[2] / width * 1000), int(box[3] / height * 1000))
        regions.append(Region(len(regions), label, task, box, bbox_2d, float(score)))
    return regions


def _threshold(settings: LayoutSettings, label: str | None) -> float:
    return settings.threshold_by_class.get(label, settings.threshold) if label else settings.threshold


def iou(a, b) -> float:
    """Intersection over union with the SDK's +1 pixel convention (boxes as x1, y1, x2, y2)."""
    inter = max(0, min(a[2], b[2]) - max(a[0], b[0]) + 1) * max(0, min(a[3], b[3]) - max(a[1], b[1]) + 1)
    area_a = (a[2] - a[0] + 1) * (a[3] - a[1] + 1)
    area_b = (b[2] - b[0] + 1) * (b[3] - b[1] + 1)
    return inter / float(area_a + area_b - inter)


def nms(rows: np.ndarray, iou_same: float = NMS_IOU_SAME, iou_different: float = NMS_IOU_DIFFERENT) -> list[int]:
    """Greedy NMS by score: a box goes when it overlaps a kept one by iou_same (same class) or
    iou_different (another class). The indices kept, best first."""
    pending = list(np.argsort(rows[:, 1])[::-1])
    kept = []
    while pending:
        best, pending = pending[0], pending[1:]
        kept.append(best)
        limit = {True: iou_same, False: iou_different}
        pending = [i for i in pending if iou(rows[best, 2:6], rows[i, 2:6]) < limit[rows[best, 0] == rows[i, 0]]]
    return kept


def _drop_page_sized_images(rows: np.ndarray, width: int, height: int, id2label: dict[int, str]) -> np.ndarray:
    """An `image` box covering most of the page (82% landscape, 93% portrait) is the page
    itself, not a figure on it; dropped while something else is left."""
    image_ids = [k for k, v in id2label.items() if v == "image"]
    if len(rows) <= 1 or not image_ids:
        return rows
    limit = (0.82 if width > height else 0.93) * width * height
    x1, y1 = np.maximum(rows[:, 2], 0), np.maximum(rows[:, 3], 0)
    x2, y2 = np.minimum(rows[:, 4], width), np.minimum(rows[:, 5], height)
    keep = (rows[:, 0] != image_ids[0]) | ((x2 - x1) * (y2 - y1) <= limit)
    return rows[keep] if keep.any() else rows


def contained(rows: np.ndarray) -> np.ndarray:
    """inside[i, j]: at least CONTAINED of box i's area lies within box j (i != j)."""
    x1, y1, x2, y2 = (rows[:, k] for k in range(2, 6))
    area = (x2 - x1) * (y2 - y1)
    inter_w = np.maximum(0, np.minimum(x2[:, None], x2[None, :]) - np.maximum(x1[:, None], x1[None, :]))
    inter_h = np.maximum(0, np.minimum(y2[:, None], y2[None, :]) - np.maximum(y1[:, None], y1[None, :]))
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(area[:, None] > 0, inter_w * inter_h / area[:, None], 0.0)
    inside = share >= CONTAINED
    np.fill_diagonal(inside, False)
    return inside


def _merge_contained(rows: np.ndarray, id2label: dict[int, str], merge_modes: dict[str, str]) -> np.ndarray:
    """Per class, as the SDK's dict-valued layout_merge_bboxes_mode: "large" drops every box
    contained in a box of that class, "small" drops every box that contains one of that class
    (unless it is itself contained in one); image, seal and chart boxes are never dropped as
    contained. Every mask is computed on the same rows, then all apply."""
    if len(rows) == 0:
        return rows
    inside = contained(rows)
    classes = rows[:, 0].astype(int)
    preserved = np.isin(classes, [k for k, v in id2label.items() if v in PRESERVED_LABELS])
    inside &= ~preserved[:, None]  # a preserved box is never the contained one
    keep = np.ones(len(rows), dtype=bool)
    for class_id, label in id2label.items():
        mode = merge_modes.get(label, DEFAULT_MERGE_MODE)
        if mode == "large":
            keep &= ~(inside & (classes == class_id)[None, :]).any(axis=1)
        elif mode == "small":
            pairs = inside & (classes == class_id)[:, None]
            keep &= ~pairs.any(axis=0) | pairs.any(axis=1)
    return rows[keep]


def _unclip(rows: np.ndarray, ratio: tuple[float, float]) -> np.ndarray:
    """Boxes scaled about their centres (the SDK's unclip_boxes; its default ratio is 1, which
    still goes through this arithmetic, so the coordinates match its to the last bit)."""
    if not ratio:
        return rows
    w, h = rows[:, 4] - rows[:, 2], rows[:, 5] - rows[:, 3]
    cx, cy = rows[:, 2] + w / 2, rows[:, 3] + h / 2
    new_w, new_h = w * ratio[0], h * ratio[1]
    out = rows.copy()
    out[:, 2], out[:, 3], out[:, 4], out[:, 5] = cx - new_w / 2, cy - new_h / 2, cx + new_w / 2, cy + new_h / 2
    return out
