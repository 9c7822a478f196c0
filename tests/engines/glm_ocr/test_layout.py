"""The layout stage on tiny PP-DocLayoutV3 checkpoints in the real format: loading through
LayoutModel, the page's preprocessing against the image processor's math, the decoding of the
model's outputs, per-class thresholds. (The SDK comparison is in test_layout_sdk.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engines.glm_ocr.layout import (Detection, LayoutModel, LayoutSettings, Preprocessing, decode_detections,
                                    find_regions, pixel_values)
from engines.types import EngineError
from tests.engines.glm_ocr.layout_checkpoints import ID2LABEL, PREPROCESSOR_CONFIG, layout_page

torch = pytest.importorskip("torch")


def test_tiny_checkpoints_load_and_find_what_they_were_made_to(layouts):
    page = layout_page()
    regions = LayoutModel.load(layouts["regions"]).regions(page)
    assert [(r.index, r.label, r.task) for r in regions] == [(0, "doc_title", "text"), (1, "display_formula", "formula")]
    for r in regions:
        x1, y1, x2, y2 = r.box
        assert 0 <= x1 < x2 <= page.width and 0 <= y1 < y2 <= page.height
        assert r.bbox_2d == tuple(int(v / s * 1000) for v, s in zip(r.box, (page.width, page.height) * 2))
    assert LayoutModel.load(layouts["nothing"]).regions(page) == []
    slivers = LayoutModel.load(layouts["slivers"]).regions(page)
    assert slivers and all(r.box[2] - r.box[0] < 28 for r in slivers)


def test_another_architecture_is_one_line(tiny_glm_ocr, tmp_path):
    with pytest.raises(EngineError, match=r"is a glm_ocr checkpoint, not a PP-DocLayoutV3 layout model"):
        LayoutModel.load(tiny_glm_ocr)
    with pytest.raises(EngineError, match="has no config.json"):
        LayoutModel.load(tmp_path)


def test_the_processor_cannot_be_built_here_so_its_math_is_checked():
    """PPDocLayoutV3ImageProcessor is transformers' TorchvisionBackend: its module imports
    torchvision at the top and its resize is torchvision's. Without torchvision (PyPI's Linux
    x86_64 build is CUDA's and does not import beside torch 2.13.0+cpu) the class refuses to be
    built; where torchvision imports, the processor itself is compared."""
    from transformers import PPDocLayoutV3ImageProcessor

    page = _smooth_page(370, 530)
    try:
        processor = PPDocLayoutV3ImageProcessor(**{k: v for k, v in PREPROCESSOR_CONFIG.items()
                                                  if k != "image_processor_type"})
    except ImportError as e:
        assert "Torchvision" in str(e)
        pytest.skip("no torchvision here: test_preprocessing_is_the_processors_math checks the math instead")
    expected = processor(images=[page], return_tensors="pt")["pixel_values"]
    assert torch.equal(pixel_values(page, Preprocessing(**_prep_kwargs())), expected)


def test_preprocessing_is_the_processors_math(tmp_path):
    """The processor's documented steps with preprocessor_config.json's values: resize to
    size.height x size.width with torchvision's bicubic (Keys' cubic convolution, a = -0.75,
    align_corners=False, no antialiasing) on the uint8 image, then (x - mean / rescale) /
    (std / rescale). The reference here is that kernel written out in numpy, float64; torch's
    uint8 kernel computes in fixed point, so it may differ by one grey level."""
    import json

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG))
    prep = Preprocessing.from_dir(tmp_path)
    assert (prep.height, prep.width, prep.resample, prep.image_mean, prep.image_std) == (800, 800, 3, (0, 0, 0), (1, 1, 1))
    assert math.isclose(prep.rescale_factor, 1 / 255)

    page = _smooth_page(370, 530)
    ours = pixel_values(page, prep)
    assert ours.shape == (1, 3, 800, 800) and ours.dtype == torch.float32
    reference = _bicubic(np.asarray(page, dtype=np.float64), 800, 800)
    levels = np.clip(np.rint(reference), 0, 255).transpose(2, 0, 1)[None]
    assert np.abs(ours.numpy() * 255 - levels).max() <= 1.0 + 1e-4
    assert np.mean(np.abs(ours.numpy() * 255 - levels) > 0.5) < 0.3

    # a constant page stays constant: c / 255 exactly, as (c - 0) / 255.0 in float32
    flat = pixel_values(_flat_page(200, 300, 77), prep)
    assert torch.equal(flat, torch.full((1, 3, 800, 800), 77, dtype=torch.float32) / 255.0)
    # mean and std as the processor fuses them with the rescale factor
    other = Preprocessing(image_mean=(0.5, 0.25, 0.0), image_std=(0.5, 2.0, 1.0))
    got = pixel_values(_flat_page(800, 800, 102), other)[0, :, 0, 0]
    expected = (torch.tensor(102.0) - torch.tensor([0.5, 0.25, 0.0]) * 255.0) / (torch.tensor([0.5, 2.0, 1.0]) * 255.0)
    assert torch.allclose(got, expected, rtol=0, atol=1e-7)


def test_decoding_the_outputs():
    """Corners from (cx, cy, w, h) scaled to the page, the top (query, class) pairs by sigmoid
    score, the threshold, and reading order as the processor's _get_order_seqs votes it: a
    query's votes are sigmoid(order[i, j]) from every earlier query i and 1 - sigmoid(order[j, i])
    for every later one, and fewer votes come first. With order[0, 1] high and the rest low,
    query 2 has 0 votes, query 0 one and query 1 two: query 2, then 0, then 1."""
    big = 8.0
    logits = torch.full((3, 4), -big)
    logits[0, 1], logits[1, 3], logits[2, 0] = big, big, 0.0  # query 2 scores 0.5
    boxes = torch.tensor([[0.5, 0.5, 0.2, 0.1], [0.25, 0.75, 0.5, 0.5], [0.1, 0.1, 0.2, 0.2]])
    order = torch.full((3, 3), -big)
    order[0, 1] = big
    found = decode_detections(logits, boxes, order, 200, 100, threshold=0.4)
    assert [(d.class_id, d.order) for d in found] == [(0, 0), (1, 1), (3, 2)]
    assert found[0].box == pytest.approx((0.0, 0.0, 40.0, 20.0))
    assert found[0].score == pytest.approx(0.5)
    assert found[1].box == pytest.approx((80.0, 45.0, 120.0, 55.0))
    assert found[2].box == pytest.approx((0.0, 50.0, 100.0, 100.0))
    assert [d.class_id for d in decode_detections(logits, boxes, order, 200, 100, threshold=0.6)] == [1, 3]


def test_per_class_thresholds():
    """threshold_by_class by label name; other labels keep the global threshold (the SDK's
    _apply_per_class_threshold, which cannot be imported here: its module needs OpenCV)."""
    page = (1000, 1000)
    detections = [Detection(22, 0.35, (10, 10, 400, 100), 0), Detection(21, 0.25, (10, 200, 400, 400), 1),
                  Detection(5, 0.45, (10, 500, 400, 600), 2)]
    default = find_regions(detections, page, ID2LABEL)
    assert [r.label for r in default] == ["text", "display_formula"]
    settings = LayoutSettings(threshold_by_class={"table": 0.2, "text": 0.5})
    assert settings.lowest_threshold() == 0.2
    assert [r.label for r in find_regions(detections, page, ID2LABEL, settings)] == ["table", "display_formula"]


# ----------------------------------------------------------------------------- helpers


def _prep_kwargs() -> dict:
    c = PREPROCESSOR_CONFIG
    return dict(height=c["size"]["height"], width=c["size"]["width"], rescale_factor=c["rescale_factor"],
                image_mean=tuple(c["image_mean"]), image_std=tuple(c["image_std"]))


def _smooth_page(height: int, width: int):
    """Smooth grey levels, so no bicubic overshoot is clipped between the two passes."""
    from PIL import Image

    yy, xx = np.mgrid[0:height, 0:width]
    base = 127 + 60 * np.sin(xx / 23.0) + 50 * np.cos(yy / 17.0)
    rgb = np.stack([base, 255 - base, 0.5 * base + 40], axis=-1)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


def _flat_page(height: int, width: int, level: int):
    from PIL import Image

    return Image.new("RGB", (width, height), (level, level, level))


def _bicubic(image: np.ndarray, out_h: int, out_w: int, a: float = -0.75) -> np.ndarray:
    """Keys' cubic convolution, align_corners=False, edge pixels repeated: torch's bicubic."""

    def weights(n_in: int, n_out: int) -> np.ndarray:
        scale = n_in / n_out
        m = np.zeros((n_out, n_in))
        for i in range(n_out):
            src = (i + 0.5) * scale - 0.5
            x0 = math.floor(src)
            t = src - x0
            for k, d in zip(range(-1, 3), (1 + t, t, 1 - t, 2 - t)):
                d = abs(d)
                w = ((a + 2) * d - (a + 3)) * d * d + 1 if d <= 1 else ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
                m[i, min(max(x0 + k, 0), n_in - 1)] += w
        return m

    rows, cols = weights(image.shape[0], out_h), weights(image.shape[1], out_w)
    # two matrix products (einsum over all three at once would loop over every index)
    return np.stack([rows @ image[:, :, c] @ cols.T for c in range(image.shape[2])], axis=-1)


def test_decoding_equals_the_processors_own_code(layouts):
    """The processor's post_process_object_detection and _get_order_seqs need only torch, but
    their module imports torchvision at the top: their source is read from the installed
    transformers and run as it is (polygons, which need OpenCV, left out) on the tiny model's
    outputs for a page, beside our decode_detections."""
    import ast
    import inspect
    import types

    import transformers.models.pp_doclayout_v3 as package

    source = (inspect.getfile(package).rsplit("/", 1)[0] + "/image_processing_pp_doclayout_v3.py")
    tree = ast.parse(open(source, encoding="utf-8").read())
    wanted = {"_get_order_seqs", "post_process_object_detection"}
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in wanted]
    assert {f.name for f in functions} == wanted
    for f in functions:
        f.decorator_list = []  # transformers' backend checks, which ask for torchvision
    namespace = {"torch": torch, "TensorType": object}
    exec(compile(ast.Module(body=functions, type_ignores=[]), source, "exec"), namespace)
    processor = types.SimpleNamespace(size={"height": 800, "width": 800},
                                      _extract_polygon_points_by_masks=lambda boxes, masks, scale: [])
    processor._get_order_seqs = types.MethodType(namespace["_get_order_seqs"], processor)

    model = LayoutModel.load(layouts["regions"])
    page = layout_page()
    with torch.inference_mode():
        out = model.model(pixel_values=pixel_values(page, model.prep))
    theirs = namespace["post_process_object_detection"](processor, out, threshold=0.05,
                                                        target_sizes=torch.tensor([[page.height, page.width]]))[0]
    ours = decode_detections(out.logits[0], out.pred_boxes[0], out.order_logits[0], page.width, page.height, 0.05)
    assert len(ours) == len(theirs["scores"]) > 2
    assert [d.class_id for d in ours] == theirs["labels"].tolist()
    assert [d.order for d in ours] == theirs["order_seq"].tolist()
    assert [d.score for d in ours] == theirs["scores"].tolist()
    assert [list(d.box) for d in ours] == theirs["boxes"].tolist()
