"""Session-scoped tiny GLM-OCR checkpoints (built once, in the real on-disk format)."""

import pytest

from tests.engines.glm_ocr.checkpoints import make_tiny_glm_ocr


@pytest.fixture(scope="session")
def tiny_glm_ocr(tmp_path_factory):
    """A tiny random GLM-OCR checkpoint with an (untrained) MTP layer."""
    return make_tiny_glm_ocr(tmp_path_factory.mktemp("glm_ocr") / "tiny")


@pytest.fixture(scope="session")
def tiny_glm_ocr_no_mtp(tmp_path_factory):
    return make_tiny_glm_ocr(tmp_path_factory.mktemp("glm_ocr") / "tiny-no-mtp", with_mtp=False)
