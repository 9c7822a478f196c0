"""GLM-OCR's Core ML conversion as the app runs it after a download (app/models/convert_job.py):
progress per package, cancel, the parity check before a conversion counts as ready. The model
is a tiny GLM-OCR in the published layout, fetched from the loopback hub. Conversion runs on
Linux too; Core ML prediction of the result only on macOS (tests/engines/glm_ocr_convert)."""

from __future__ import annotations

import sys

import pytest

from app.models import catalog, convert_job, download as dl, store
from engines.types import EngineError
from tests.hub.fixtures import hub, hub_env  # noqa: F401  (pytest fixtures)

pytest.importorskip("coremltools")


@pytest.fixture(scope="module")
def glm_ocr_repo(tmp_path_factory):
    from tests.engines.glm_ocr.checkpoints import make_published_glm_ocr

    return make_published_glm_ocr(tmp_path_factory.mktemp("convert_job") / "GLM-OCR")


@pytest.fixture
def downloaded(hub, hub_env, glm_ocr_repo):
    hub.serve_repo("zai-org/GLM-OCR", glm_ocr_repo, revision=catalog.find("glm-ocr").revision)  # its pin
    dl.download("glm-ocr")
    return catalog.find("glm-ocr")


def leftovers(entry) -> list:
    folder = store.coreml_dir(entry)
    return [p for p in folder.parent.glob(folder.name + "*") if not p.name.endswith(".lock")]


def test_only_macos_converts_after_download(downloaded):
    assert convert_job.conversion_needed(downloaded) == (sys.platform == "darwin")


def test_the_runtime_decides_which_folder_ocr_reads(downloaded):
    checkpoint = store.resolve("glm-ocr", "ocr")
    assert convert_job.ocr_model_dir(downloaded, checkpoint, "torch") == checkpoint
    with pytest.raises(EngineError, match="not converted for Core ML yet"):
        convert_job.ocr_model_dir(downloaded, checkpoint, "coreml")


def test_cancel_leaves_nothing_and_marks_nothing_ready(downloaded):
    events: list[convert_job.ConversionProgress] = []

    def cancel_once_a_package_started() -> bool:
        return any(e.package is not None for e in events)

    with pytest.raises(convert_job.ConversionCancelled):
        convert_job.convert(downloaded, on_progress=events.append, should_cancel=cancel_once_a_package_started,
                            cache_length=128)
    assert events[-1].package == "vision" and events[-1].packages_done == 0
    assert events[-1].packages_total == 4  # vision, decoder, lm_head and the MTP layer
    assert leftovers(downloaded) == [] and not convert_job.is_converted(downloaded)
    assert store.status(downloaded).installed  # the download itself is untouched


def test_a_package_that_failed_its_parity_check_is_refused():
    good = {"parity": {"ok": True, "max_abs_error": 1e-6}}
    convert_job.check_parity({"packages": {"vision": good, "decoder": good}})
    with pytest.raises(EngineError, match="decoder package failed its parity check"):
        convert_job.check_parity({"packages": {"vision": good, "decoder": {"parity": {"ok": False, "max_abs_error": 0.3}}}})
    with pytest.raises(EngineError, match="no packages"):
        convert_job.check_parity({"packages": {}})


@pytest.mark.slow
def test_conversion_reports_each_package_then_is_ready(downloaded):
    """A full conversion (about a minute here): one start and one end per package, in order,
    then the folder is in place with its manifest; status no longer asks for it on macOS."""
    events: list[convert_job.ConversionProgress] = []
    folder = convert_job.convert(downloaded, on_progress=events.append, cache_length=128)
    started = [e.package for e in events if e.package is not None and e.message.startswith("converting")]
    assert started == ["vision", "decoder", "lm_head", "mtp"]
    assert [e.packages_done for e in events][-1] == 4
    assert [e.fraction for e in events] == sorted(e.fraction for e in events)
    assert folder == store.coreml_dir(downloaded) and convert_job.is_converted(downloaded)
    assert convert_job.ocr_model_dir(downloaded, store.resolve("glm-ocr", "ocr"), "coreml") == folder
    assert leftovers(downloaded) == [folder]
    assert not any("not converted" in m for m in store.status(downloaded).missing)
