"""Conversion of a tiny GLM-OCR checkpoint (transformers' classes, real tensor names, MTP layer
under layers.{N}.*) into Core ML packages.

Checked here (Linux): the packages exist with the expected inputs, outputs, dtypes and states
(read from the saved ML program spec), the manifest describes them and its provenance is true,
each module's parity report (traced torch module vs the unpatched transformers module) is
within tolerance and the check can fail. NOT checked here: Core ML prediction, which needs
macOS (see test_coreml_runtime.py, skipped elsewhere)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engines.types import EngineError
from engines.glm_ocr.convert import (
    PACKAGES,
    RMSNormAsLayerNorm,
    checkpoint_hash,
    convert_glm_ocr,
    converter_versions,
)
from tests.engines.glm_ocr.convert.conftest import CACHE_LENGTH, SEQ_LEN, SMALL_CACHE_LENGTH

FLOAT16, FLOAT32, INT32 = 65552, 65568, 131104  # Core ML ArrayDataType codes


def _spec(path):
    import coremltools as ct

    return ct.models.MLModel(str(path), skip_model_load=True).get_spec()


def _io(spec):
    def arrays(features):
        return {f.name: (list(f.type.multiArrayType.shape), f.type.multiArrayType.dataType) for f in features}

    states = {s.name: (list(s.type.stateType.arrayType.shape), s.type.stateType.arrayType.dataType)
              for s in spec.description.state}
    return arrays(spec.description.input), arrays(spec.description.output), states


def _ops(spec) -> set[str]:
    return {op.type for f in spec.mlProgram.functions.values()
            for block in f.block_specializations.values() for op in block.operations}


def test_all_packages_exist_as_ml_programs(converted):
    out, manifest, _ = converted
    assert sorted(manifest["packages"]) == sorted(PACKAGES)
    for name in PACKAGES:
        spec = _spec(out / f"{name}.mlpackage")
        assert spec.WhichOneof("Type") == "mlProgram"
        assert spec.specificationVersion >= 9  # macOS 15: needed for state


def test_decoder_package_io_and_kv_state(converted, tiny_checkpoint):
    from engines.glm_ocr.config import GlmOcrConfig

    t = GlmOcrConfig.load(tiny_checkpoint).text
    inputs, outputs, states = _io(_spec(converted[0] / "decoder.mlpackage"))
    assert inputs == {
        "inputs_embeds": ([1, t.hidden_size, 1, SEQ_LEN], FLOAT16),
        "position_cos": ([SEQ_LEN, t.rotary_dim], FLOAT16),
        "position_sin": ([SEQ_LEN, t.rotary_dim], FLOAT16),
        "cache_position": ([1], INT32),
    }
    assert outputs == {"hidden": ([1, t.hidden_size, 1, SEQ_LEN], FLOAT16)}
    cache = [t.num_hidden_layers, t.num_key_value_heads, CACHE_LENGTH, t.head_dim]
    assert states == {"key_cache": (cache, FLOAT16), "value_cache": (cache, FLOAT16)}
    ops = _ops(_spec(converted[0] / "decoder.mlpackage"))
    assert {"read_state", "write_state", "slice_update"} <= ops  # the cache is written in place
    assert "layer_norm" in ops and "pow" not in ops  # RMSNorm patched (no float16 x^2)


def test_mtp_package_io_and_own_state(converted, tiny_checkpoint):
    from engines.glm_ocr.config import GlmOcrConfig

    t = GlmOcrConfig.load(tiny_checkpoint).text
    inputs, outputs, states = _io(_spec(converted[0] / "mtp.mlpackage"))
    row = [1, t.hidden_size, 1, 1]
    assert inputs == {
        "previous_hidden": (row, FLOAT16), "input_embeds": (row, FLOAT16),
        "position_cos": ([1, t.rotary_dim], FLOAT16), "position_sin": ([1, t.rotary_dim], FLOAT16),
        "cache_position": ([1], INT32),
    }
    assert outputs == {"mtp_hidden": (row, FLOAT16), "mtp_hidden_for_head": (row, FLOAT16)}
    cache = [1, t.num_key_value_heads, CACHE_LENGTH, t.head_dim]
    assert states == {"key_cache": (cache, FLOAT16), "value_cache": (cache, FLOAT16)}
    assert "not_equal" in _ops(_spec(converted[0] / "mtp.mlpackage"))  # position-0 mask is a graph op


def test_lm_head_package_covers_the_vocabulary(converted, tiny_checkpoint):
    from engines.glm_ocr.config import GlmOcrConfig

    t = GlmOcrConfig.load(tiny_checkpoint).text
    inputs, outputs, states = _io(_spec(converted[0] / "lm_head.mlpackage"))
    assert inputs == {"hidden": ([1, t.hidden_size, 1, SEQ_LEN], FLOAT16)}
    assert outputs == {"logits": ([1, t.vocab_size, 1, SEQ_LEN], FLOAT16)}
    assert states == {}
    assert sum(converted[1]["packages"]["lm_head"]["vocab_chunks"]) == t.vocab_size


def test_vision_package_takes_any_patch_count_up_to_the_processor_maximum(converted, tiny_checkpoint):
    from engines.glm_ocr.image import ImageProcessorConfig

    spec = _spec(converted[0] / "vision.mlpackage")
    features = {f.name: f.type.multiArrayType for f in spec.description.input}
    assert set(features) == {"pixel_patches", "position_cos", "position_sin", "attention_bias"}
    ranges = [(r.lowerBound, r.upperBound) for r in features["pixel_patches"].shapeRange.sizeRanges]
    image = ImageProcessorConfig.from_dir(tiny_checkpoint)
    max_patches = min(image.max_pixels // (2 * 14 * 14), 4 * CACHE_LENGTH)  # no more tokens than the context
    assert ranges == [(4, max_patches), (6, 6), (14, 14), (14, 14)]  # Conv3d folded: 3 x T=2 channels
    assert [o.name for o in spec.description.output] == ["image_embeds"]
    ops = _ops(spec)
    assert "layer_norm" in ops and "pow" not in ops  # RMSNorms incl. the q/k head norms patched
    limits = converted[1]["packages"]["vision"]["num_patches"]
    assert (limits["min"], limits["max"]) == (4, max_patches)


def test_manifest_matches_the_packages(converted):
    out, manifest, _ = converted
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert (manifest["seq_len"], manifest["cache_length"]) == (SEQ_LEN, CACHE_LENGTH)
    for name, entry in manifest["packages"].items():
        inputs, outputs, states = _io(_spec(out / entry["path"]))
        for kind, actual in (("inputs", inputs), ("outputs", outputs), ("states", states)):
            assert set(entry[kind]) == set(actual), (name, kind)
            for feature, described in entry[kind].items():
                shape, _ = actual[feature]
                if shape:  # the flexible vision output has no default shape
                    assert [d if d != -1 else s for d, s in zip(described["shape"], shape)] == shape


def test_manifest_provenance_is_true(converted, tiny_checkpoint):
    out, manifest, _ = converted
    assert manifest["source"]["sha256"] == checkpoint_hash(tiny_checkpoint)
    assert manifest["converters"] == converter_versions()
    assert {"coremltools", "torch", "transformers"} <= set(manifest["converters"])
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "preprocessor_config.json"):
        assert name in manifest["copied_files"] and (out / name).read_bytes() == (tiny_checkpoint / name).read_bytes()
    assert not list(out.glob("*.safetensors"))


def test_checkpoint_hash_changes_with_the_weights(tiny_checkpoint, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    assert checkpoint_hash(copy) == checkpoint_hash(tiny_checkpoint)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert checkpoint_hash(copy) != checkpoint_hash(tiny_checkpoint)


def test_embeddings_are_the_checkpoint_table(converted, tiny_checkpoint):
    from safetensors import safe_open

    out, manifest, _ = converted
    table = np.load(out / "embeddings.npy")
    with safe_open(tiny_checkpoint / "model.safetensors", "pt") as f:
        expected = f.get_tensor("model.language_model.embed_tokens.weight").float().numpy()
    assert table.dtype == np.float16 and list(table.shape) == manifest["embeddings"]["shape"]
    np.testing.assert_array_equal(table, expected.astype(np.float16))


def test_every_parity_report_is_within_tolerance(converted):
    _, manifest, _ = converted
    assert manifest["parity"] == {name: entry["parity"]["max_abs_error"] for name, entry in manifest["packages"].items()}
    for name, entry in manifest["packages"].items():
        parity = entry["parity"]
        assert parity["ok"], (name, parity)
        assert "transformers" in parity["reference"]
        assert parity["reference_max_abs"] > 0.1  # the reference output is not trivially zero
        assert parity["max_abs_error"] <= 1e-4 * max(1.0, parity["reference_max_abs"]), (name, parity)


def test_progress_is_reported_in_order_up_to_done(converted):
    _, _, events = converted
    fractions = [fraction for _, fraction in events]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    text = " ".join(message for message, _ in events)
    for name in PACKAGES:
        assert f"converting {name}" in text and f"{name}: max abs error" in text


def test_parity_check_fails_for_a_wrong_module(tiny_checkpoint, tmp_path):
    """The check compares against transformers, not against the converted module itself: a
    perturbed LM head is caught."""
    from engines.glm_ocr.config import GlmOcrConfig
    from engines.glm_ocr.convert import _convert_lm_head
    from engines.glm_ocr.weights import load_reference, modules_from_reference

    config = GlmOcrConfig.load(tiny_checkpoint)
    ref = load_reference(tiny_checkpoint)
    modules = modules_from_reference(ref, config, CACHE_LENGTH)
    with torch.no_grad():
        modules.lm_head.chunks[0].weight[3] += 0.05
    entry = _convert_lm_head(modules, ref, SEQ_LEN, tmp_path)
    assert not entry["parity"]["ok"] and entry["parity"]["max_abs_error"] > entry["parity"]["tolerance"]


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_layer_norm_patch_equals_the_original(scale):
    from engines.glm_ocr.convert import ChannelLayerNorm
    from engines.glm_ocr.modules import LayerNormCF

    norm = torch.nn.LayerNorm(32)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(32))
        norm.bias.copy_(0.1 * torch.randn(32))
    x = scale * torch.randn(5, 32) + 3 * scale
    cf = x.T[None, :, None, :]
    torch.testing.assert_close(ChannelLayerNorm(LayerNormCF(norm))(cf)[0, :, 0, :].T, norm(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_head_norm_patch_equals_the_original(scale):
    from engines.glm_ocr import modules
    from engines.glm_ocr.convert import rms_norm_last_as_layer_norm, stable_head_norms

    x, weight = scale * torch.randn(3, 7, 16), 1 + 0.1 * torch.randn(16)
    expected = modules.rms_norm_last(x, weight, 1e-5)
    torch.testing.assert_close(rms_norm_last_as_layer_norm(x, weight, 1e-5), expected, rtol=1e-5, atol=1e-5)
    with stable_head_norms():
        assert modules.rms_norm_last is rms_norm_last_as_layer_norm
    assert modules.rms_norm_last is not rms_norm_last_as_layer_norm  # restored after tracing


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_rms_norm_patch_equals_the_original_even_at_large_magnitudes(tiny_checkpoint, scale):
    """The conversion patch (RMSNorm as LayerNorm over [x, -x]) equals transformers' RMSNorm,
    including activations whose square overflows float16 (|x| > 256)."""
    from transformers.models.glm_ocr.modeling_glm_ocr import GlmOcrRMSNorm

    from engines.glm_ocr.modules import RMSNormCF

    norm = GlmOcrRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(64))
    x = scale * torch.randn(5, 64)
    patched = RMSNormAsLayerNorm(RMSNormCF.from_hf(norm))
    got = patched(x.T[None, :, None, :])[0, :, 0, :].T
    torch.testing.assert_close(got, norm(x), rtol=1e-5, atol=1e-5)


def test_converting_a_checkpoint_without_mtp_says_so(converted_without_mtp):
    out, manifest = converted_without_mtp
    assert "mtp" not in manifest["packages"] and not (out / "mtp.mlpackage").exists()
    assert manifest["mtp"]["available"] is False
    assert manifest["mtp"]["reason"].startswith("MTP unavailable:")
    assert {"vision", "decoder", "lm_head"} == set(manifest["packages"])
    assert manifest["cache_length"] == SMALL_CACHE_LENGTH
    assert manifest["packages"]["vision"]["num_patches"]["max"] == 4 * SMALL_CACHE_LENGTH  # capped by the context


def test_an_earlier_conversion_is_cleared_before_converting_again(tmp_path):
    """Converting into a directory holding an earlier conversion replaces it; the stale
    manifest goes first, so an interrupted run never looks complete."""
    from engines.glm_ocr.convert import _prepare_out_dir

    out = tmp_path / "earlier"
    (out / "decoder.mlpackage").mkdir(parents=True)
    (out / "decoder.mlpackage" / "Manifest.json").write_text("{}")
    (out / "manifest.json").write_text(json.dumps({"format": "specscope-glm-ocr-coreml"}))
    _prepare_out_dir(out)
    assert not (out / "manifest.json").exists() and not (out / "decoder.mlpackage").exists()


def test_a_foreign_manifest_is_not_taken_for_an_earlier_conversion(tmp_path):
    """A directory with someone else's manifest.json (a web app, say) is left alone."""
    from engines.glm_ocr.convert import _prepare_out_dir

    out = tmp_path / "webapp"
    (out / "decoder.mlpackage").mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"name": "my app"}))
    with pytest.raises(EngineError, match="not empty"):
        _prepare_out_dir(out)
    assert (out / "manifest.json").exists() and (out / "decoder.mlpackage").exists()


def _one_line_error(call, *words):
    with pytest.raises(EngineError) as excinfo:
        call()
    message = str(excinfo.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_user_errors_are_one_line(tiny_checkpoint, tmp_path):
    _one_line_error(lambda: convert_glm_ocr(tmp_path / "nowhere", tmp_path / "out"), "not found")
    not_glm = tmp_path / "not-glm"
    not_glm.mkdir()
    (not_glm / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _one_line_error(lambda: convert_glm_ocr(not_glm, tmp_path / "out"), "not a GLM-OCR checkpoint")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    _one_line_error(lambda: convert_glm_ocr(tiny_checkpoint, occupied), "not empty")
    assert (occupied / "notes.txt").read_text() == "mine"
    _one_line_error(lambda: convert_glm_ocr(tiny_checkpoint, tmp_path / "o", seq_len=0), "--seq-len")
    _one_line_error(lambda: convert_glm_ocr(tiny_checkpoint, tmp_path / "o", seq_len=8, cache_length=8),
                    "--cache-length")
