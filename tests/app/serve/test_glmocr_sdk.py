"""GLM-OCR's official SDK (glmocr 0.1.5, a test dependency) in self-hosted mode against a real
`specscope serve` on loopback: its start-up check, its region requests with GLM-OCR's task
prompts, and a document back. The models are tiny random checkpoints in the real formats: GLM-OCR
served by the torch runtime, and PP-DocLayoutV3 given to the SDK through its own
`layout_detector` argument (its default detector builds transformers' image processor, which
needs torchvision, and imports OpenCV; neither installs here), as a detector over the product's
layout stage, whose post-processing test_layout_sdk.py holds equal to the SDK's own."""

from __future__ import annotations

from urllib.parse import urlsplit
from urllib.request import urlopen

import pytest

pytest.importorskip("torch")
pytest.importorskip("glmocr")

from app.serve.protocol import ServedModel  # noqa: E402
from app.serve.server import ServeConfig, Served, build_app, start_in_thread  # noqa: E402
from engines.types import SpecConfig  # noqa: E402
from tests.engines.glm_ocr import checkpoints  # noqa: E402
from tests.engines.glm_ocr.layout_checkpoints import layout_page, make_tiny_layout  # noqa: E402


def sdk_detector(layout_dir):
    """A glmocr BaseLayoutDetector that finds regions with the product's LayoutModel and hands
    them over in the SDK's own format (index, label, score, 0-1000 bbox_2d, polygon, task_type)."""
    from glmocr.layout.base import BaseLayoutDetector

    from engines.glm_ocr.layout import LayoutModel

    class Detector(BaseLayoutDetector):
        batch_size = 1

        def start(self):
            self.model = LayoutModel.load(layout_dir)

        def stop(self):
            self.model = None

        def process(self, images, save_visualization=False, global_start_idx=0, use_polygon=False):
            pages = [[{"index": r.index, "label": r.label, "score": r.score, "bbox_2d": list(r.bbox_2d),
                       "polygon": [], "task_type": r.task} for r in self.model.regions(image.convert("RGB"))]
                     for image in images]
            return pages, {}

    return Detector(None)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from engines.glm_ocr.engine import OcrEngine

    root = tmp_path_factory.mktemp("glmocr_sdk")
    engine = OcrEngine.load(checkpoints.make_tiny_glm_ocr(root / "tiny"), runtime="torch", cache_length=2048)
    engine.repetition = None  # a random tiny model loops; that guard has its own tests
    running = start_in_thread(build_app(ServeConfig(), [
        Served(ServedModel("glm-ocr", "ocr", SpecConfig(method="mtp", steps=2)), engine)]))
    yield running, root
    running.stop()


@pytest.mark.slow  # about 10 s; test_serve_ocr.py checks the start-up answer and the task prompts quickly
def test_the_sdk_reads_a_document_through_serve(server):
    from glmocr.config import load_config
    from glmocr.pipeline import Pipeline

    running, root = server
    url = urlsplit(running.url)
    config = load_config(mode="selfhosted", ocr_api_host=url.hostname, ocr_api_port=url.port, model="glm-ocr")
    pipeline_config = config.pipeline
    pipeline_config.ocr_api.connect_timeout = 20  # the check answers at once; a 400 would time out
    pipeline_config.page_loader.max_tokens = 8  # random weights: a few tokens a region are enough
    pipeline_config.page_loader.max_pixels = 112 * 112 * 4  # the tiny model's image tokens stay few
    page = root / "page.png"
    layout_page(page)
    pipeline = Pipeline(pipeline_config, layout_detector=sdk_detector(make_tiny_layout(root / "layout")))
    pipeline.start()
    try:
        request = {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                              "image_url": {"url": f"file://{page}"}}]}]}
        (result,) = list(pipeline.process(request, save_layout_visualization=False))
    finally:
        pipeline.stop()
    regions = result.json_result[0]
    assert [(r["native_label"], r["label"]) for r in regions] == [("doc_title", "text"), ("display_formula", "formula")]
    assert all(r["content"] for r in regions), regions
    assert result.markdown_result.startswith("# ") and "\n$$\n" in result.markdown_result
    # what serve answered: the start-up check without the model, then each region read
    with urlopen(f"{running.url}/metrics") as metrics:
        answered = {line.split()[0]: float(line.split()[1]) for line in metrics.read().decode().splitlines()
                    if line.startswith("specscope:requests_total{")}
    assert answered == {'specscope:requests_total{outcome="stop"}': 1.0,
                        'specscope:requests_total{outcome="length"}': 2.0}, answered
