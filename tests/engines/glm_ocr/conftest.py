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
def trained_glm_ocr(tmp_path_factory):
    """A tiny checkpoint whose MTP layer was trained on the target's own greedy outputs for
    the images `train_images` (saved under the real names): accepted often, not always.
    Returns (model dir, image paths)."""
    from tests.engines.glm_ocr.checkpoints import test_images, train_mtp_on_target

    root = tmp_path_factory.mktemp("glm_ocr_trained")
    path = make_tiny_glm_ocr(root / "tiny")
    images = test_images(4)
    accuracy = train_mtp_on_target(path, images, steps=150)
    assert accuracy > 0.8, accuracy
    paths = []
    for i, image in enumerate(images):
        paths.append(root / f"image{i}.png")
        image.save(paths[-1])
    return path, paths
