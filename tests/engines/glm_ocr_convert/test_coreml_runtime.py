"""The Core ML runtime.

Everywhere: it imports without coremltools being used, refuses a directory that is not a
conversion with one clear line, and off macOS says that Core ML needs macOS 15.
On macOS 15+ only (skipped elsewhere, so UNCHECKED on Linux): Core ML prediction of every
converted package equals the PyTorch runtime running the same channels-first modules, within
float16 tolerance, including the stateful caches over several calls."""

from __future__ import annotations

import json
import platform
import sys

import numpy as np
import pytest

from engines import EngineError
from engines.glm_ocr import runtime_coreml
from engines.glm_ocr.runtime_coreml import CoreMLRuntime, read_manifest
from tests.engines.glm_ocr_convert.conftest import CACHE_LENGTH, SEQ_LEN


def _is_macos_15() -> bool:
    if sys.platform != "darwin":
        return False
    version = platform.mac_ver()[0]
    return bool(version) and int(version.split(".")[0]) >= 15


needs_macos = pytest.mark.skipif(
    not _is_macos_15(),
    reason="Core ML prediction needs macOS 15+ (coremltools cannot run models on Linux/Windows); "
    "Core ML parity is unchecked on this machine",
)


def _one_line(excinfo, *words):
    message = str(excinfo.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_a_checkpoint_directory_is_not_a_conversion(tmp_path):
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"")
    with pytest.raises(EngineError) as excinfo:
        CoreMLRuntime.load(checkpoint)
    _one_line(excinfo, "not a converted GLM-OCR directory", "--runtime torch")
    with pytest.raises(EngineError) as excinfo:
        CoreMLRuntime.load(tmp_path / "missing")
    _one_line(excinfo, "not found")


def test_an_incomplete_conversion_is_refused(converted, tmp_path):
    import shutil

    out, manifest, _ = converted
    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    shutil.rmtree(partial / "mtp.mlpackage")
    with pytest.raises(EngineError) as excinfo:
        read_manifest(partial)
    _one_line(excinfo, "incomplete", "mtp.mlpackage")
    (partial / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(EngineError) as excinfo:
        read_manifest(partial)
    _one_line(excinfo, "not a Specscope GLM-OCR manifest")


def test_unknown_compute_units_are_refused(converted):
    with pytest.raises(EngineError) as excinfo:
        CoreMLRuntime.load(converted[0], compute_units="tpu")
    _one_line(excinfo, "compute units", "cpu_and_ne")


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the message shown off macOS")
def test_off_macos_the_runtime_says_it_needs_macos(converted):
    with pytest.raises(EngineError) as excinfo:
        CoreMLRuntime.load(converted[0])
    _one_line(excinfo, "needs macOS 15", "--runtime torch")


def test_compiled_models_are_cached_in_the_user_cache_dir():
    import platformdirs

    assert str(runtime_coreml.compiled_cache_dir()).startswith(
        platformdirs.user_cache_dir("Specscope", appauthor=False))


# --------------------------------------------------------------------------- macOS only


@pytest.fixture(scope="module")
def runtimes(converted, tiny_checkpoint):
    from engines.glm_ocr.runtime_torch import TorchRuntime

    coreml = CoreMLRuntime.load(converted[0], compute_units="cpu_only")
    torch_rt = TorchRuntime.load(tiny_checkpoint, seq_len=SEQ_LEN, cache_length=CACHE_LENGTH)
    return coreml, torch_rt


def _close(got, expected, what):
    scale = max(1.0, float(np.abs(expected).max()))
    error = float(np.abs(got - expected).max())
    assert error <= 2e-2 * scale, f"{what}: max abs error {error:.3g} (scale {scale:.3g})"


@needs_macos
def test_coreml_prediction_matches_the_torch_runtime(runtimes):
    from engines.glm_ocr.positions import text_positions, text_rope

    coreml, torch_rt = runtimes
    rng = np.random.default_rng(0)
    cfg = torch_rt.config
    # vision at a size other than the traced one
    grid = (1, 6, 10)
    pixels = rng.standard_normal((60, 6 * 14 * 14)).astype(np.float32)
    _close(coreml.encode_image(pixels, grid), torch_rt.encode_image(pixels, grid), "vision")
    # decoder: three chunks through the stateful cache, the last one partly padded
    coreml.reset()
    torch_rt.reset()
    for start, n in ((0, SEQ_LEN), (SEQ_LEN, SEQ_LEN), (2 * SEQ_LEN, 3)):
        embeds = rng.standard_normal((n, cfg.text.hidden_size)).astype(np.float32)
        cos, sin = text_rope(text_positions(start, n, 0), cfg.text)
        expected = torch_rt.decode(embeds, start, cos, sin)
        _close(coreml.decode(embeds, start, cos, sin), expected, f"decoder chunk at {start}")
        _close(coreml.logits(expected), torch_rt.logits(expected), "lm_head")
    # MTP: several rows (one call per row inside the package) through its own cache
    prev = rng.standard_normal((5, cfg.text.hidden_size)).astype(np.float32)
    embeds = rng.standard_normal((5, cfg.text.hidden_size)).astype(np.float32)
    cos, sin = text_rope(text_positions(0, 5, 0), cfg.text)
    got_raw, got_head = coreml.mtp(prev, embeds, 0, cos, sin)
    exp_raw, exp_head = torch_rt.mtp(prev, embeds, 0, cos, sin)
    _close(got_raw, exp_raw, "mtp raw")
    _close(got_head, exp_head, "mtp normed")


@needs_macos
def test_coreml_runtime_loads_again_from_the_compiled_cache(converted):
    CoreMLRuntime.load(converted[0], compute_units="cpu_only")
    cached = list(runtime_coreml.compiled_cache_dir().glob("decoder-*.mlmodelc"))
    assert cached
    again = CoreMLRuntime.load(converted[0], compute_units="cpu_only")
    assert again.mtp_unavailable is None and again.seq_len == SEQ_LEN


def test_the_default_runtime_follows_the_directory(converted, tiny_checkpoint):
    """`specscope ocr --model DIR` without --runtime: a converted directory means Core ML
    (off macOS: the clear "needs macOS" line), a Hugging Face checkpoint means torch."""
    from engines.glm_ocr.engine import OcrEngine
    from engines.glm_ocr.runtime_coreml import default_runtime

    assert default_runtime(converted[0]) == "coreml"
    assert default_runtime(tiny_checkpoint) == "torch"
    engine = OcrEngine.load(tiny_checkpoint, runtime=None, cache_length=CACHE_LENGTH)
    assert engine.runtime.name == "torch"
    if not _is_macos_15():
        with pytest.raises(EngineError) as excinfo:
            OcrEngine.load(converted[0], runtime=None)
        _one_line(excinfo, "needs macOS 15")
