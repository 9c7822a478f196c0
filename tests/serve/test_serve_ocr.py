"""`specscope serve` reading a page: GLM-OCR (tiny random checkpoint in the real layout, torch
runtime) behind /v1/chat/completions, the image sent as an image_url content part, answered
with the same tokens and rounds as the local engine."""

from __future__ import annotations

import base64

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("torch")

from app.serve.protocol import ServedModel  # noqa: E402
from app.serve.server import ServeConfig, Served, build_app, start_in_thread  # noqa: E402
from engines.types import Request, SpecConfig  # noqa: E402
from tests.engines.glm_ocr import checkpoints  # noqa: E402

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def ocr(tmp_path_factory):
    from engines.glm_ocr.engine import OcrEngine

    root = tmp_path_factory.mktemp("serve_ocr")
    engine = OcrEngine.load(checkpoints.make_tiny_glm_ocr(root / "tiny"), runtime="torch", cache_length=320)
    engine.repetition = None  # a random tiny model loops; that guard has its own tests
    image = root / "page.png"
    checkpoints.test_images(1)[0].save(image)  # (imported as a module: pytest would collect test_images)
    running = start_in_thread(build_app(ServeConfig(), [
        Served(ServedModel("glm-ocr", "ocr", SpecConfig(method="mtp", steps=2)), engine)]))
    yield engine, image, running
    running.stop()


def test_an_image_content_part_is_read_like_the_local_engine_reads_it(ocr):
    engine, image, running = ocr
    local = list(engine.generate(Request(kind="ocr", image=str(image), task="table", max_tokens=MAX_TOKENS,
                                         spec=SpecConfig(method="mtp", steps=2))))
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    resp = client.chat.completions.create(model="glm-ocr", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "table"}]}])
    rounds = resp.model_extra["rounds"]
    assert [r["tokens"] for r in rounds] == [r.tokens for r in local]
    assert resp.choices[0].message.content == "".join(r.text for r in local)
    assert resp.model_extra["timings"]["draft_n"] == sum(r.proposed for r in local) > 0


def test_an_ocr_request_without_an_image_is_refused(ocr):
    _, _, running = ocr
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="glm-ocr", messages=[{"role": "user", "content": "read this"}])
    assert "image_url" in err.value.body["message"]
