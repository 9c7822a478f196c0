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


@pytest.fixture(scope="session")
def trained_glm_ocr():
    """A tiny checkpoint whose MTP layer was trained for chained drafting on the target's own
    greedy outputs for four test images (saved under the real names): accepted often, not
    always. Returns (model dir, image paths). Built once per machine and cached outside the
    repository (checkpoints.trained_glm_ocr): the first run on a machine pays about 15 s of
    CPU for the training; treat the files as read-only."""
    from tests.engines.glm_ocr.checkpoints import trained_glm_ocr as build

    return build()


@pytest.fixture(scope="session")
def layouts(tmp_path_factory):
    """Tiny PP-DocLayoutV3 checkpoints in the real format, by what they find on layout_page():
    "regions" (a title and a formula), "nothing", "slivers" (regions thinner than 28 px)."""
    from tests.engines.glm_ocr.layout_checkpoints import make_tiny_layout

    root = tmp_path_factory.mktemp("layout")
    return {kind: make_tiny_layout(root / kind, kind) for kind in ("nothing", "regions", "slivers")}
