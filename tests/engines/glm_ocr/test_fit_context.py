"""A page too large for the context is read at a lower resolution, said in the first Round,
instead of being refused (a real page is ~6000 image tokens; the default context is 2048)."""

import numpy as np
import pytest
from PIL import Image

from engines.types import EngineError, Request, SpecConfig
from engines.glm_ocr.image import ImageProcessorConfig, load_image, num_image_tokens, preprocess


@pytest.fixture(scope="module")
def small_context_engine(tiny_glm_ocr):
    from engines.glm_ocr.engine import OcrEngine

    engine = OcrEngine.load(tiny_glm_ocr, runtime="torch", cache_length=72)
    engine.repetition = None
    return engine


def test_large_page_is_downscaled_to_fit_and_says_so(small_context_engine, tmp_path):
    path = tmp_path / "page.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (1400, 1000, 3), dtype=np.uint8)).save(path)
    full = num_image_tokens(preprocess(load_image(path), ImageProcessorConfig.from_dir(small_context_engine.model_path))[1])
    assert full + 25 + 8 > 72  # image + prompt text + answer would not fit as it is

    rounds = list(small_context_engine.generate(
        Request(kind="ocr", image=str(path), max_tokens=8, spec=SpecConfig(method="mtp", steps=3))))
    assert rounds[0].prefill and "image read at" in rounds[0].note and "instead of" in rounds[0].note
    assert sum(len(r.tokens) for r in rounds) == 8  # room was left to answer
    assert rounds[-1].finish == "length"


def test_small_page_is_untouched(small_context_engine, tmp_path):
    path = tmp_path / "small.png"
    Image.new("RGB", (112, 112), "white").save(path)
    rounds = list(small_context_engine.generate(Request(kind="ocr", image=str(path), max_tokens=2)))
    assert rounds[0].note is None or "image read at" not in rounds[0].note


def test_no_room_for_any_image_is_a_clear_error(tiny_glm_ocr, tmp_path):
    from engines.glm_ocr.engine import OcrEngine

    engine = OcrEngine.load(tiny_glm_ocr, runtime="torch", seq_len=8, cache_length=32)
    path = tmp_path / "page.png"
    Image.new("RGB", (600, 800), "white").save(path)
    with pytest.raises(EngineError, match="context"):
        list(engine.generate(Request(kind="ocr", image=str(path), max_tokens=4)))
