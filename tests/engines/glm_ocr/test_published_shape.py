"""Slow: GLM-OCR at the published shapes (tests/engines/glm_ocr/published_shape.py: the
published config.json and preprocessor_config.json as they are, random bfloat16 weights under
the published names, sharded with an index; about 2.6 GB, built once per machine), read in
float32 by the fast runtime, the Core ML twin and transformers' own generate: the same tokens,
plain and with MTP at steps 1..7 (the random MTP layer is hardly ever accepted; the runs show
that speculation at every depth leaves the tokens unchanged at full size). Peak memory: about
10 GB (one model at a time), a few minutes on two cores."""

import gc

import pytest
import torch
from PIL import Image

from engines.types import Request, SpecConfig
from engines.glm_ocr.engine import OcrEngine
from tests.engines.glm_ocr.checkpoints import cache_root, hf_greedy, reference_prompt
from tests.engines.glm_ocr.published_shape import fixture_page, make_published_shape_glm_ocr

pytestmark = pytest.mark.slow
TOKENS = 12


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = cache_root() / "glm-ocr-published-shape"
    return make_published_shape_glm_ocr(root), fixture_page(tmp_path_factory.mktemp("page") / "page.png")


@pytest.fixture(scope="module")
def expected(published):
    path, page = published
    from transformers import GlmOcrForConditionalGeneration

    model = GlmOcrForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        tokens = hf_greedy(model, reference_prompt(path, Image.open(page).convert("RGB")), TOKENS, stop_at_eos=False)
    del model
    gc.collect()
    return tokens


@pytest.mark.parametrize("runtime", ["torch", "coreml-twin"])
def test_published_shapes_plain_and_mtp_equal_transformers(published, expected, runtime):
    path, page = published
    engine = OcrEngine.load(path, runtime=runtime, dtype="float32", cache_length=2048)
    engine.config.eos_token_ids = []  # random weights: compare a fixed number of tokens, as generate does
    engine.repetition = None
    assert engine.runtime.mtp_unavailable is None
    for steps in range(8):
        spec = SpecConfig(method="mtp" if steps else "off", steps=steps)
        rounds = list(engine.generate(Request(kind="ocr", image=str(page), max_tokens=TOKENS, spec=spec)))
        assert [t for r in rounds for t in r.tokens] == expected, (runtime, steps)
        if steps:
            assert sum(r.proposed for r in rounds) > 0
