"""The Core ML conversion as the app runs it after a download on macOS (app/models/convert_job.py),
for GLM-OCR and for its layout model PP-DocLayoutV3: progress per package, cancel, the parity
check before a conversion counts as ready, nothing left behind by a cancel or a failure. The
models are a tiny GLM-OCR in the published layout and a tiny random PP-DocLayoutV3 in the real
format (tests/engines/glm_ocr/layout_checkpoints.py), fetched from the loopback hub. Conversion
runs on Linux too; Core ML prediction of the result only on macOS (tests/engines/glm_ocr/convert).
The macOS rule (what needs converting) is checked as logic with sys.platform set to darwin."""

from __future__ import annotations

import json
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


# --- the layout model (role "layout": one package) -----------------------------------------------

@pytest.fixture(scope="module")
def layout_repo(tmp_path_factory):
    from tests.engines.glm_ocr.layout_checkpoints import make_tiny_layout

    return make_tiny_layout(tmp_path_factory.mktemp("convert_job_layout") / "PP-DocLayoutV3")


@pytest.fixture
def layout_downloaded(hub, hub_env, layout_repo):
    entry = catalog.find("pp-doclayout-v3")
    hub.serve_repo(entry.repo_id, layout_repo)
    dl.download("pp-doclayout-v3")
    return entry


def test_on_macos_the_layout_model_is_converted_after_its_download(layout_downloaded, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert not convert_job.conversion_needed(layout_downloaded)  # elsewhere PyTorch reads the download
    monkeypatch.setattr(sys, "platform", "darwin")
    assert convert_job.conversion_needed(layout_downloaded)
    assert store.status(layout_downloaded).missing == [
        "downloaded, not converted for Core ML (the layout stage runs on PyTorch until then)"]
    assert store.resolve("pp-doclayout-v3", "layout") == store.status(layout_downloaded).path


def test_the_layout_model_converts_into_place_with_its_manifest(layout_downloaded, monkeypatch):
    from engines.glm_ocr.layout import LayoutModel
    from engines.glm_ocr.layout_coreml import MANIFEST_FORMAT, OUTPUTS, PACKAGE

    snapshot = store.status(layout_downloaded).path
    events: list[convert_job.ConversionProgress] = []
    folder = convert_job.convert(layout_downloaded, on_progress=events.append)
    assert folder == store.coreml_dir(layout_downloaded) and convert_job.is_converted(layout_downloaded)
    assert leftovers(layout_downloaded) == [folder]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == MANIFEST_FORMAT and (folder / PACKAGE).is_dir()
    assert sorted(manifest["parity"]) == sorted(OUTPUTS) and all(r["ok"] for r in manifest["parity"].values())
    assert manifest["source"]["path"] == str(snapshot.resolve())
    # one package, under way from the first report to the last; the fraction only grows
    assert {e.packages_total for e in events} == {1}
    assert [e.package for e in events[:-1]] == ["layout"] * (len(events) - 1)
    assert (events[-1].package, events[-1].packages_done, events[-1].message) == (None, 1, "done")
    assert [e.fraction for e in events] == sorted(e.fraction for e in events)
    assert any(e.message.startswith("converting with coremltools") for e in events)
    # on macOS runs resolve to it, and nothing is missing any more
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not convert_job.conversion_needed(layout_downloaded) and store.status(layout_downloaded).missing == []
    assert store.resolve("pp-doclayout-v3", "layout") == folder
    monkeypatch.setattr(sys, "platform", "linux")
    layout = LayoutModel.load(folder)  # here Core ML does not load it: PyTorch from the download, said
    assert layout.runtime == "torch" and layout.path == str(snapshot.resolve())
    assert layout.note.startswith("the layout model runs on PyTorch: the Core ML runtime needs macOS")


def test_cancelling_the_layout_conversion_leaves_nothing(layout_downloaded):
    events: list[convert_job.ConversionProgress] = []
    final = store.coreml_dir(layout_downloaded)
    staging_seen = []

    def cancel_before_coremltools() -> bool:
        if events and events[-1].message.startswith("converting with coremltools"):
            staging_seen.append((final.parent / (final.name + ".converting")).is_dir())
            return True
        return False

    with pytest.raises(convert_job.ConversionCancelled):
        convert_job.convert(layout_downloaded, on_progress=events.append, should_cancel=cancel_before_coremltools)
    assert staging_seen == [True]  # the job had written its staging folder; it is gone
    assert (events[-1].package, events[-1].packages_done, events[-1].packages_total) == ("layout", 0, 1)
    assert leftovers(layout_downloaded) == [] and not convert_job.is_converted(layout_downloaded)
    assert store.status(layout_downloaded).installed  # the download itself is untouched


def test_a_layout_conversion_that_fails_its_parity_check_leaves_nothing_and_says_so(layout_downloaded, monkeypatch):
    from engines.glm_ocr import layout_convert

    monkeypatch.setattr(layout_convert, "PARITY_RTOL", -1.0)  # a tolerance no conversion meets
    with pytest.raises(EngineError) as excinfo:
        convert_job.convert(layout_downloaded)
    message = str(excinfo.value)
    assert "parity check failed for the layout model" in message and "runs on PyTorch instead" in message
    assert "\n" not in message
    assert leftovers(layout_downloaded) == [] and not convert_job.is_converted(layout_downloaded)
    assert store.status(layout_downloaded).installed


def test_a_layout_manifest_whose_parity_failed_is_refused():
    from engines.glm_ocr.layout_coreml import MANIFEST_FORMAT

    good = {"ok": True, "max_abs_error": 0.0}
    convert_job.check_parity({"format": MANIFEST_FORMAT, "parity": {"logits": good, "pred_boxes": good}})
    with pytest.raises(EngineError, match="layout package failed its parity check on pred_boxes"):
        convert_job.check_parity({"format": MANIFEST_FORMAT,
                                  "parity": {"logits": good, "pred_boxes": {"ok": False, "max_abs_error": 0.4}}})
    with pytest.raises(EngineError, match="no parity report"):
        convert_job.check_parity({"format": MANIFEST_FORMAT, "parity": {}})


def test_on_macos_the_ocr_pane_offers_the_layout_model_s_conversion(downloaded, layout_downloaded, monkeypatch):
    """For a layout model downloaded before (or whose conversion did not finish): once GLM-OCR is
    ready, the pane's one button converts the layout model, which runs on PyTorch meanwhile."""
    from app.gui.views.models_dialog import missing_model

    monkeypatch.setattr(sys, "platform", "darwin")
    assert missing_model("ocr", "", "mtp", "").button == "Convert GLM-OCR for Core ML"  # GLM-OCR's own comes first
    glm = store.coreml_dir(downloaded)
    glm.mkdir(parents=True)
    (glm / "manifest.json").write_text("{}")  # GLM-OCR counts as converted (as tests/app/models/test_catalog_store.py)
    offer = missing_model("ocr", "", "mtp", "")
    assert (offer.button, offer.model_id) == ("Convert PP-DocLayoutV3 for Core ML", "pp-doclayout-v3")
    assert "runs on PyTorch meanwhile" in offer.text
    assert missing_model("ocr", "", "mtp", "", layout=False) is None  # Layout off: nothing to offer
    monkeypatch.setattr(sys, "platform", "linux")
    assert missing_model("ocr", "", "mtp", "") is None
