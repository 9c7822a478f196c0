"""Tiny GLM-OCR checkpoints converted once per session (conversion of the tiny modules takes
seconds, but it is the slowest step of these tests)."""

import pytest

from tests.engines.glm_ocr.checkpoints import make_tiny_glm_ocr

SEQ_LEN = 8
CACHE_LENGTH = 128
SMALL_CACHE_LENGTH = 48


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_glm_ocr(tmp_path_factory.mktemp("glm_ocr_convert") / "tiny")


@pytest.fixture(scope="session")
def converted(tiny_checkpoint, tmp_path_factory):
    """(out_dir, manifest, progress events) of one conversion of the tiny checkpoint."""
    from engines.glm_ocr.convert import convert_glm_ocr

    out = tmp_path_factory.mktemp("glm_ocr_converted") / "tiny-coreml"
    events = []
    manifest = convert_glm_ocr(tiny_checkpoint, out, seq_len=SEQ_LEN, cache_length=CACHE_LENGTH,
                               progress=lambda message, fraction: events.append((message, fraction)))
    return out, manifest, events


@pytest.fixture(scope="session")
def converted_without_mtp(tmp_path_factory):
    from engines.glm_ocr.convert import convert_glm_ocr

    base = tmp_path_factory.mktemp("glm_ocr_no_mtp")
    checkpoint = make_tiny_glm_ocr(base / "tiny-no-mtp", with_mtp=False)
    out = base / "converted"
    # A context of 48 rows holds fewer image tokens than the tiny processor's largest image
    # (64), so the vision package's patch range is capped by the context.
    return out, convert_glm_ocr(checkpoint, out, seq_len=SEQ_LEN, cache_length=SMALL_CACHE_LENGTH)
