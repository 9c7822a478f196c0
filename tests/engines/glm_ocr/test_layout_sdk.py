"""Our layout post-processing and Markdown against the official glmocr SDK's own code (0.1.5, a
test dependency only), on recorded detections of synthetic pages.

The SDK's detector (glmocr/layout/layout_detector.py) imports OpenCV and transformers'
PPDocLayoutV3ImageProcessor (torchvision) at the top; neither is installed here, and neither is
used by what is compared: OpenCV only turns masks into polygons (in start(), never called) and
the processor only makes the detections, which are recorded. So the module is imported with a
blank `cv2` module and no processor class, the model and the processor are replaced by the
recorded detections, and the detector's own process() runs everything after them: per-class
thresholds, apply_layout_postprocess (NMS, the page-sized-image filter, merging of contained
boxes, reading order, unclip, clamping) and the label -> task mapping with its 0-1000 boxes.
The Markdown is compared with the SDK's ResultFormatter.process on the same regions' texts.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from PIL import Image

from engines.glm_ocr.document import ReadRegion, markdown_pages
from engines.glm_ocr.layout import Detection, LayoutSettings, find_regions
from tests.engines.glm_ocr.layout_checkpoints import ID2LABEL

torch = pytest.importorskip("torch")
pytest.importorskip("glmocr")

LABEL_IDS = {v: k for k, v in ID2LABEL.items()}


def f32(x: float) -> float:
    """Recorded values as the detector hands them over (float32 tensors)."""
    return float(np.float32(x))


def det(label: str, score: float, box: tuple, order: int) -> Detection:
    return Detection(LABEL_IDS[label], f32(score), tuple(f32(v) for v in box), order)


# Synthetic pages: (width, height), detections as the detector reports them (score >= 0.2, as
# with a per-class threshold of 0.2; the SDK's default is 0.3), in the model's reading order.
PAGES = {
    "two columns": ((1240, 1754), [
        det("doc_title", 0.95, (120, 80, 1120, 150), 0),
        det("text", 0.97, (120, 200, 600, 900), 1),
        det("text", 0.62, (125, 205, 598, 880), 2),  # a weaker copy: NMS (same class, IoU >= 0.6)
        det("paragraph_title", 0.9, (640, 200, 1120, 240), 3),
        det("content", 0.89, (640, 200, 1120, 240), 4),  # another class, IoU >= 0.98: NMS
        det("text", 0.96, (640, 260, 1120, 900), 5),
        det("inline_formula", 0.55, (700, 400, 760, 430), 6),  # inside a text block: merged away
        det("text", 0.28, (120, 950, 600, 1000), 7),  # under the 0.3 threshold
        det("number", 0.8, (600, 1700, 640, 1730), 8),  # abandoned
    ]),
    "a table": ((1240, 1754), [
        det("figure_title", 0.88, (150, 120, 1090, 170), 0),
        det("table", 0.98, (150, 190, 1090, 900), 1),
        det("text", 0.5, (170, 210, 500, 260), 2),  # a cell read as text: inside the table
        det("chart", 0.86, (200, 950, 1000, 1500), 3),
        det("text", 0.6, (220, 1000, 400, 1040), 4),  # inside the chart: dropped
        det("chart", 0.4, (300, 1100, 500, 1300), 5),  # a chart inside a chart: preserved
        det("text", 0.93, (150, 1550, 1090, 1650), 6),
    ]),
    "a formula": ((1240, 1754), [
        det("text", 0.94, (120, 100, 1120, 300), 0),
        det("display_formula", 0.92, (300, 330, 940, 420), 1),
        det("formula_number", 0.83, (1050, 350, 1120, 400), 2),
        det("text", 0.9, (120, 450, 1120, 700), 3),
        det("display_formula", 0.35, (300, 720, 940, 800), 4),
        det("algorithm", 0.77, (120, 850, 1120, 1300), 5),
        det("vision_footnote", 0.31, (120, 1320, 700, 1360), 6),
    ]),
    "header and footer": ((1240, 1754), [
        det("header", 0.9, (120, 30, 1120, 70), 0),
        det("header_image", 0.7, (1000, 20, 1120, 80), 1),
        det("abstract", 0.95, (120, 120, 1120, 500), 2),
        det("aside_text", 0.6, (20, 300, 60, 1400), 3),
        det("text", 0.97, (120, 540, 1120, 1500), 4),
        det("footnote", 0.8, (120, 1550, 1120, 1620), 5),
        det("footer", 0.85, (120, 1680, 900, 1720), 6),
        det("footer_image", 0.5, (1000, 1670, 1120, 1730), 7),
        det("number", 0.9, (600, 1720, 640, 1745), 8),
    ]),
    "overlapping boxes": ((1240, 1754), [
        det("image", 0.9, (0, 0, 1240, 1700), 0),  # the page itself: the page-sized-image filter
        det("reference", 0.9, (100, 100, 1140, 900), 1),
        det("reference_content", 0.85, (110, 110, 1130, 300), 2),
        det("reference", 0.7, (110, 320, 1130, 500), 3),  # contained: its container goes ("small")
        det("text", 0.8, (-40, 950, 700, 1100), 4),  # past the left edge: clamped
        det("seal", 0.6, (800, 950, 1300, 1300), 5),  # past the right edge, a preserved class
        det("text", 0.7, (1250, 1200, 1300, 1300), 6),  # wholly off the page: dropped
        det("image", 0.75, (100, 1150, 600, 1600), 7),
        det("text", 0.74, (150, 1200, 550, 1550), 8),  # inside the image: dropped
        det("vertical_text", 0.66, (1180, 100, 1230, 1600), 9),
    ]),
    "landscape with equal scores": ((1754, 1240), [
        det("image", 0.8, (0, 0, 1700, 1200), 0),  # 94% of a landscape page (limit 82%): dropped
        det("text", 0.8, (100, 100, 800, 600), 1),
        det("text", 0.8, (900, 100, 1600, 600), 2),
        det("table", 0.8, (100, 650, 1600, 1150), 3),
        det("inline_formula", 0.8, (200, 200, 300, 230), 4),
    ]),
}

# Per-class thresholds for the pages (label names): the SDK takes them by name as well.
THRESHOLDS = {"inline_formula": 0.5, "chart": 0.2, "display_formula": 0.4}


class Recorded:
    """The model and PPDocLayoutV3ImageProcessor, replaced by a page's recorded detections:
    post_process_object_detection keeps those scoring at least `threshold`, as the processor's does."""

    def __init__(self, detections: list[Detection]):
        self.detections = detections

    def __call__(self, images, return_tensors=None):
        return {}

    def post_process_object_detection(self, outputs, threshold, target_sizes):
        kept = [d for d in self.detections if d.score >= threshold]
        return [{
            "scores": torch.tensor([d.score for d in kept], dtype=torch.float32),
            "labels": torch.tensor([d.class_id for d in kept], dtype=torch.long),
            "boxes": torch.tensor([d.box for d in kept], dtype=torch.float32).reshape(-1, 4),
            "order_seq": torch.tensor([d.order for d in kept], dtype=torch.long),
        }]


@pytest.fixture(scope="module")
def sdk():
    """The SDK's detector and formatter modules, with its shipped config (glmocr/config.yaml)."""
    import transformers

    patch = pytest.MonkeyPatch()
    patch.setitem(sys.modules, "cv2", types.ModuleType("cv2"))
    patch.setattr(transformers, "PPDocLayoutV3ImageProcessor", None, raising=False)
    for name in ("glmocr.layout", "glmocr.layout.layout_detector"):
        sys.modules.pop(name, None)
    from glmocr.config import GlmOcrConfig
    from glmocr.layout.layout_detector import PPDocLayoutDetector
    from glmocr.postprocess import result_formatter

    config = GlmOcrConfig.from_yaml()
    yield types.SimpleNamespace(detector=PPDocLayoutDetector, layout=config.pipeline.layout,
                                formatter=result_formatter, formatter_config=config.pipeline.result_formatter)
    patch.undo()
    for name in ("glmocr.layout", "glmocr.layout.layout_detector"):
        sys.modules.pop(name, None)


def sdk_regions(sdk, size, detections, threshold_by_class=None):
    layout = sdk.layout.model_copy(update={"model_dir": "recorded", "threshold_by_class": threshold_by_class})
    detector = sdk.detector(layout)
    detector._model, detector._image_processor, detector._device = (lambda **kw: None), Recorded(detections), "cpu"
    results, _ = detector.process([Image.new("RGB", size, "white")])
    return results[0]


def test_the_sdks_shipped_settings_are_ours(sdk):
    ours = LayoutSettings()
    layout = sdk.layout
    assert layout.threshold == ours.threshold and not layout.threshold_by_class and layout.layout_nms
    assert tuple(layout.layout_unclip_ratio) == ours.unclip_ratio
    assert {int(k): v for k, v in layout.id2label.items()} == ID2LABEL
    assert {task: tuple(labels) for task, labels in layout.label_task_mapping.items()} == ours.label_tasks
    modes = {ID2LABEL[int(k)]: v for k, v in layout.layout_merge_bboxes_mode.items()}
    assert modes == {label: ours.merge_modes.get(label, "large") for label in ID2LABEL.values()}


@pytest.mark.parametrize("thresholds", [None, THRESHOLDS], ids=["default", "per-class"])
@pytest.mark.parametrize("name", list(PAGES))
def test_regions_equal_the_sdks(sdk, name, thresholds):
    size, detections = PAGES[name]
    settings = LayoutSettings(threshold_by_class=dict(thresholds or {}))
    theirs = sdk_regions(sdk, size, [d for d in detections if d.score >= settings.lowest_threshold()], thresholds)
    ours = find_regions(detections, size, ID2LABEL, settings)
    assert ours, "every page keeps something"
    assert [(r.index, r.label, r.task, list(r.bbox_2d)) for r in ours] == \
           [(t["index"], t["label"], t["task_type"], t["bbox_2d"]) for t in theirs]
    assert [r.score for r in ours] == pytest.approx([t["score"] for t in theirs], abs=0)


def test_the_pages_exercise_every_rule(sdk):
    """What the recorded pages are for: each rule changes at least one page's result."""
    dropped = {name: {ID2LABEL[d.class_id] for d in dets} - {r.label for r in find_regions(dets, size, ID2LABEL)}
               for name, (size, dets) in PAGES.items()}
    assert {"number"} <= dropped["two columns"] and "inline_formula" in dropped["two columns"]
    assert "header" in dropped["header and footer"] and "footer" in dropped["header and footer"]
    assert "reference" in dropped["overlapping boxes"]
    size, dets = PAGES["a table"]
    assert [r.label for r in find_regions(dets, size, ID2LABEL)].count("chart") == 2  # preserved inside another
    size, dets = PAGES["overlapping boxes"]
    assert all(0 <= v <= 1000 for r in find_regions(dets, size, ID2LABEL) for v in r.bbox_2d)


# Texts the regions were "read" as: titles, hyphenated lines, list items, numbered formulas,
# inline formulas, a table, runs of dots, a long repeated tail.
TEXTS = {
    "doc_title": "## Reading Documents Whole",
    "paragraph_title": "- 2. Method",
    "figure_title": "Table 1: Results....... per page",
    "table": "<table><tr><td>a</td><td>b</td></tr></table>",
    "display_formula": "\\[ E = mc^2 \\]",
    "formula_number": "(1)",
    "abstract": "We read pages by regions, as GLM-OCR's trans-",
    "algorithm": "1.read the layout\n2.read each region",
    "vision_footnote": "• a footnote item",
    "reference_content": "(a)first reference",
    "vertical_text": "\\t\\tvertical____________ text\\t",
    "seal": "SEAL $ x+1 $seal",
    "content": "content",
}


def texts_for(regions, page_index: int, name: str) -> list[str]:
    out = []
    for r in regions:
        if r.label == "text" and out and out[-1] == TEXTS["abstract"]:
            out.append("formers are read in order.")  # the hyphenated word's second half
        elif r.label == "text":
            out.append(["formers are read in order.", "* an item", "a line\nbelow", "- next item",
                        "again " * 400][(r.index + page_index) % 5])
        else:
            out.append(TEXTS.get(r.label, f"{name} {r.label}"))
    return out


def test_markdown_equals_the_sdks(sdk, monkeypatch):
    """Every page's regions, read as TEXTS, through our markdown_pages and the SDK's
    ResultFormatter.process (its wordfreq check off: the SDK does not install wordfreq)."""
    monkeypatch.setattr(sdk.formatter, "zipf_frequency", None)
    pages, grouped, crops, figures = [], [], {}, 0
    for page_index, (name, (size, detections)) in enumerate(PAGES.items()):
        regions = find_regions(detections, size, ID2LABEL)
        texts = texts_for(regions, page_index, name)
        read = []
        for r, text in zip(regions, texts):
            crop = None
            if r.task == "skip":
                crop = f"imgs/cropped_page{page_index}_idx{figures}.jpg"
                figures += 1
                crops[(page_index, *r.bbox_2d)] = Image.new("RGB", (4, 4))
            read.append(ReadRegion(page_index + 1, r, "" if r.task == "skip" else text, crop=crop))
        pages.append(read)
        grouped.append([{"index": r.index, "label": r.label, "score": r.score, "bbox_2d": list(r.bbox_2d),
                         "polygon": [], "task_type": r.task, "content": None if r.task == "skip" else text}
                        for r, text in zip(regions, texts)])
    _json, theirs, _images = sdk.formatter.ResultFormatter(sdk.formatter_config).process(grouped, crops)
    ours = "\n\n".join(markdown_pages(pages))
    assert ours == theirs
    for expected in ("# Reading Documents Whole", "## 2. Method", "E = mc^2 \\tag{1}", "transformers are",
                     "![Image 1-0](imgs/cropped_page1_idx0.jpg)", "<table>", "$x+1$"):
        assert expected in ours, expected
