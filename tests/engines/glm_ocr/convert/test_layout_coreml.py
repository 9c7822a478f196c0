"""The layout model (PP-DocLayoutV3) converted to Core ML: `specscope convert pp-doclayout-v3` on
a tiny checkpoint in the real format (transformers' own model saved as safetensors, the
published labels and preprocessor values; tests/engines/glm_ocr/layout_checkpoints.py).

Checked here (Linux): the conversion completes; the package is an ML program taking the
preprocessor's 800 x 800 page and giving the three outputs the decoding reads; the manifest's
parity (the traced module vs transformers' eager model on another page) is within tolerance and
its provenance true; the mask-box patch equals transformers' function; the Core ML layout
runtime's glue (input name, shape and dtype as the saved package declares them, outputs by name)
gives the torch model's regions with the module the package was traced from standing in for
Core ML; off macOS a converted directory runs on PyTorch from its source checkpoint, saying why.
NOT checked here: Core ML's own prediction of the package (float16), which needs macOS 15+
(the last test, skipped elsewhere)."""

from __future__ import annotations

import json
import platform
import sys

import numpy as np
import pytest
import torch

from engines.glm_ocr.layout import LayoutModel
from engines.glm_ocr.layout_convert import conversion_patches, mask_boxes_finite
from engines.glm_ocr.layout_coreml import OUTPUTS, CoreMLLayout, read_manifest
from engines.types import EngineError
from tests.engines.glm_ocr.layout_checkpoints import ID2LABEL, layout_page, make_tiny_layout

FLOAT32 = 65568  # Core ML ArrayDataType code


def _is_macos_15() -> bool:
    if sys.platform != "darwin":
        return False
    version = platform.mac_ver()[0]
    return bool(version) and int(version.split(".")[0]) >= 15


@pytest.fixture(scope="module")
def tiny_layout(tmp_path_factory):
    return make_tiny_layout(tmp_path_factory.mktemp("layout-coreml") / "tiny", "regions")


@pytest.fixture(scope="module")
def converted(tiny_layout, tmp_path_factory):
    """(out_dir, manifest, what the command printed) of `specscope convert pp-doclayout-v3`."""
    import contextlib
    import io

    from app.cli.convert import cmd_convert

    out = tmp_path_factory.mktemp("layout-converted") / "pp-doclayout-v3"
    printed, said = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(said):
        assert cmd_convert(["pp-doclayout-v3", "--from", str(tiny_layout), "--out", str(out)]) == 0
    return out, json.loads((out / "manifest.json").read_text()), printed.getvalue(), said.getvalue()


def test_the_conversion_completes_within_its_parity_tolerance(converted, tiny_layout):
    from engines.glm_ocr.convert import checkpoint_hash

    out, manifest, printed, said = converted
    assert sorted(manifest["parity"]) == sorted(OUTPUTS)
    for name, report in manifest["parity"].items():
        assert report["ok"] and report["max_abs_error"] <= report["tolerance"], (name, report)
        print(f"{name}: max abs error {report['max_abs_error']:.3g} (scale {report['reference_max_abs']:.3g})")
    assert json.loads(printed) == {name: r["max_abs_error"] for name, r in manifest["parity"].items()}
    assert "[100.0%] done" in said and f"converted into {out}" in said
    assert manifest["source"] == {"path": str(tiny_layout.resolve()), "sha256": checkpoint_hash(tiny_layout)}
    assert manifest["id2label"] == {str(k): v for k, v in ID2LABEL.items()}
    assert manifest["copied_files"] == ["config.json", "preprocessor_config.json"]
    assert read_manifest(out) == manifest


def test_the_package_takes_the_preprocessed_page_and_gives_the_decoded_outputs(converted):
    import coremltools as ct

    out, manifest, _, _ = converted
    spec = ct.models.MLModel(str(out / "layout.mlpackage"), skip_model_load=True).get_spec()
    assert spec.WhichOneof("Type") == "mlProgram" and spec.specificationVersion >= 9
    inputs = {f.name: (list(f.type.multiArrayType.shape), f.type.multiArrayType.dataType) for f in spec.description.input}
    assert inputs == {"pixel_values": ([1, 3, 800, 800], FLOAT32)}
    assert [f.name for f in spec.description.output] == list(OUTPUTS)
    assert manifest["outputs"] == {"logits": {"shape": [1, 30, 25], "dtype": "float32"},
                                   "pred_boxes": {"shape": [1, 30, 4], "dtype": "float32"},
                                   "order_logits": {"shape": [1, 30, 30], "dtype": "float32"}}
    ops = {op.type for f in spec.mlProgram.functions.values() for block in f.block_specializations.values()
           for op in block.operations}
    assert {"resample", "topk", "conv"} <= ops  # deformable attention's grid_sample, the query choice


@pytest.mark.parametrize("size", [(8, 8), (13, 21)])
def test_the_conversion_patch_equals_transformers_mask_boxes(size):
    from transformers.models.pp_doclayout_v3 import modeling_pp_doclayout_v3 as modeling

    gen = torch.Generator().manual_seed(0)
    masks = torch.randn((2, 7, *size), generator=gen) > 1.0
    masks[0, 0] = False  # an empty mask: its box is all zeros
    masks[1, 3] = True
    expected = modeling.mask_to_box_coordinate(masks, torch.float32)
    assert torch.equal(mask_boxes_finite(masks, torch.float32), expected)
    assert torch.equal(expected[0, 0], torch.zeros(4))
    with conversion_patches():
        assert modeling.mask_to_box_coordinate is mask_boxes_finite and modeling.torch_int is int
    assert modeling.mask_to_box_coordinate is not mask_boxes_finite and modeling.torch_int is not int


class TracedAsCompiled:
    """Stands in for Core ML's compiled model behind CoreMLLayout: checks each call against the
    saved package's declared input and runs the module the package was traced from (with its
    conversion patches), naming the outputs as the package does."""

    def __init__(self, package, model):
        import coremltools as ct

        from engines.glm_ocr.layout_convert import Detector

        spec = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
        [feature] = spec.description.input
        self.input = (feature.name, list(feature.type.multiArrayType.shape))
        self.outputs = [f.name for f in spec.description.output]
        self.module = Detector(model).eval()
        self.calls = 0

    def predict(self, data: dict) -> dict:
        [(name, value)] = data.items()
        assert (name, list(value.shape)) == self.input and value.dtype == np.float32
        self.calls += 1
        with torch.no_grad(), conversion_patches():
            got = self.module(torch.from_numpy(value))
        return {name: x.numpy() for name, x in zip(self.outputs, got)}


def test_the_core_ml_runtime_glue_gives_the_torch_model_s_regions(converted, tiny_layout):
    out, manifest, _, _ = converted
    torch_layout = LayoutModel.load(tiny_layout)
    compiled = TracedAsCompiled(out / "layout.mlpackage", torch_layout.model)
    coreml_layout = LayoutModel(CoreMLLayout(compiled, manifest, "all"), {int(k): v for k, v in manifest["id2label"].items()},
                                torch_layout.prep, str(out), runtime="coreml")
    page = layout_page()
    regions = coreml_layout.regions(page)
    assert compiled.calls == 1 and len(regions) == 2
    assert regions == torch_layout.regions(page)


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the fallback off macOS")
def test_off_macos_a_conversion_runs_on_torch_from_its_checkpoint_and_says_why(converted, tiny_layout):
    from app.models.catalog import role_of_dir

    out = converted[0]
    assert role_of_dir(out) == "layout"
    layout = LayoutModel.load(out)
    assert layout.runtime == "torch" and layout.path == str(tiny_layout.resolve())
    assert layout.note.startswith("the layout model runs on PyTorch: the Core ML runtime needs macOS 15")
    assert "--runtime" not in layout.note
    page = layout_page()
    assert layout.regions(page) == LayoutModel.load(tiny_layout).regions(page)


def test_a_conversion_whose_checkpoint_is_gone_is_one_line(converted, tmp_path):
    import shutil

    copy = tmp_path / "moved"
    shutil.copytree(converted[0], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["source"]["path"] = str(tmp_path / "gone")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    if _is_macos_15():
        pytest.skip("on macOS the package itself loads")
    with pytest.raises(EngineError) as excinfo:
        LayoutModel.load(copy)
    assert "\n" not in str(excinfo.value) and "is gone" in str(excinfo.value)
    shutil.rmtree(copy / "layout.mlpackage")
    with pytest.raises(EngineError, match="incomplete"):
        LayoutModel.load(copy)


def test_user_errors_are_one_line(converted, tiny_layout, tmp_path):
    from engines.glm_ocr.layout_convert import convert_layout

    cases = [(tmp_path / "missing", tmp_path / "a", "not found"),
             (tiny_layout, tiny_layout, "must differ"),
             (converted[0], tmp_path / "b", "Core ML conversion already")]
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    cases.append((tiny_layout, occupied, "not empty"))
    for source, out, words in cases:
        with pytest.raises(EngineError) as excinfo:
            convert_layout(source, out)
        assert "\n" not in str(excinfo.value) and words in str(excinfo.value), str(excinfo.value)
    assert (occupied / "notes.txt").read_text() == "mine"


@pytest.mark.skipif(not _is_macos_15(), reason="Core ML prediction needs macOS 15+ (coremltools cannot run models on "
                    "Linux/Windows): the converted layout model's Core ML prediction is unchecked on this machine")
def test_core_ml_prediction_finds_the_torch_model_s_regions(converted, tiny_layout):
    out = converted[0]
    layout = LayoutModel.load(out)
    assert layout.runtime == "coreml" and layout.note is None
    reference = LayoutModel.load(tiny_layout)
    page = layout_page()
    from engines.glm_ocr.layout import pixel_values

    x = pixel_values(page, reference.prep)
    for got, expected in zip(layout.outputs(x), reference.outputs(x)):
        assert got.shape == expected.shape and torch.isfinite(got).all()
        assert float((got - expected).abs().max()) <= 0.05 * max(1.0, float(expected.abs().max()))
    assert [(r.label, r.task) for r in layout.regions(page)] == [(r.label, r.task) for r in reference.regions(page)]
