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

from engines.types import EngineError
from engines.glm_ocr import runtime_coreml
from engines.glm_ocr.runtime_coreml import CoreMLRuntime, read_manifest
from tests.engines.glm_ocr.convert.conftest import CACHE_LENGTH, SEQ_LEN


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


@pytest.fixture(scope="module")
def trained_conversion(tmp_path_factory):
    """The tests' tiny checkpoint whose MTP layer is trained for chains (cached per machine),
    converted; plus two of its images. Only built on macOS (the tests using it skip elsewhere)."""
    from engines.glm_ocr.convert import convert_glm_ocr
    from tests.engines.glm_ocr.checkpoints import trained_glm_ocr

    checkpoint, paths = trained_glm_ocr()
    paths = paths[:2]
    out = tmp_path_factory.mktemp("glm_ocr_trained_coreml") / "converted"
    convert_glm_ocr(checkpoint, out, seq_len=SEQ_LEN, cache_length=CACHE_LENGTH)
    return checkpoint, out, paths


@needs_macos
@pytest.mark.parametrize("steps", [1, 3, 7])
def test_coreml_engine_mtp_is_lossless_and_agrees_with_torch(trained_conversion, steps):
    """On Core ML (CPU compute units, so float32 compute): MTP speculation emits exactly the
    tokens of plain decoding, drafts are accepted, and plain decoding equals the Core ML twin's
    (the same modules, run in PyTorch)."""
    from engines.types import Request, SpecConfig
    from engines.glm_ocr.engine import OcrEngine

    checkpoint, out, images = trained_conversion
    coreml = OcrEngine.load(out, runtime="coreml", compute_units="cpu_only")
    torch_engine = OcrEngine.load(checkpoint, runtime="coreml-twin", cache_length=CACHE_LENGTH)
    coreml.repetition = torch_engine.repetition = None

    def tokens(engine, image, k):
        request = Request(kind="ocr", image=str(image), max_tokens=32,
                          spec=SpecConfig(method="mtp" if k else "off", steps=k))
        rounds = list(engine.generate(request))
        return [t for r in rounds for t in r.tokens], sum(r.accepted for r in rounds)

    for image in images:
        plain, _ = tokens(coreml, image, 0)
        assert plain == tokens(torch_engine, image, 0)[0]
        speculative, accepted = tokens(coreml, image, steps)
        assert speculative == plain and accepted > 0


# ------------------------------------------- the runtime's glue, on Linux too (not Core ML)


@pytest.fixture(scope="module")
def glue_runtime(converted, tiny_checkpoint):
    """CoreMLRuntime over PackageRunners: the converted packages' source modules, each call
    checked against the package's spec. Built through the runtime's own constructor."""
    from engines.glm_ocr.convert import patch_rms_norms
    from engines.glm_ocr.weights import load_modules
    from tests.engines.glm_ocr.convert.package_runner import PackageRunner

    out, manifest, _ = converted
    modules = load_modules(tiny_checkpoint, CACHE_LENGTH)
    patch_rms_norms(modules)  # as converted
    sources = {"vision": modules.vision, "decoder": modules.decoder, "lm_head": modules.lm_head, "mtp": modules.mtp}
    runners = {name: PackageRunner(out / entry["path"], sources[name]) for name, entry in manifest["packages"].items()}
    return CoreMLRuntime(out, manifest, runners, "cpu_only")


def test_runtime_glue_matches_the_package_specs_and_the_torch_runtime(glue_runtime, tiny_checkpoint):
    """Every call the Core ML runtime makes fits the packages' specs (names, shapes, dtypes,
    states), and its results equal the torch runtime's up to the float16 I/O rounding."""
    from engines.glm_ocr.positions import text_positions, text_rope
    from engines.glm_ocr.runtime_torch import TorchRuntime

    torch_rt = TorchRuntime.load(tiny_checkpoint, seq_len=SEQ_LEN, cache_length=CACHE_LENGTH)
    rng = np.random.default_rng(5)
    cfg = torch_rt.config
    grid = (1, 6, 10)
    pixels = rng.standard_normal((60, 6 * 14 * 14)).astype(np.float32)
    _close(glue_runtime.encode_image(pixels, grid), torch_rt.encode_image(pixels, grid), "vision")
    glue_runtime.reset()
    torch_rt.reset()
    for start, n in ((0, SEQ_LEN), (SEQ_LEN, 5), (SEQ_LEN + 5, 1)):
        embeds = rng.standard_normal((n, cfg.text.hidden_size)).astype(np.float32)
        cos, sin = text_rope(text_positions(start, n, 0), cfg.text)
        expected = torch_rt.decode(embeds, start, cos, sin)
        got = glue_runtime.decode(embeds, start, cos, sin)
        assert got.shape == expected.shape == (n, cfg.text.hidden_size) and got.dtype == np.float32
        _close(got, expected, f"decoder at {start}")
        _close(glue_runtime.logits(expected), torch_rt.logits(expected), "lm_head")
    many = rng.standard_normal((SEQ_LEN + 3, cfg.text.hidden_size)).astype(np.float32)
    assert glue_runtime.logits(many).shape == (SEQ_LEN + 3, cfg.text.vocab_size)  # two LM head calls
    prev = rng.standard_normal((4, cfg.text.hidden_size)).astype(np.float32)
    embeds = rng.standard_normal((4, cfg.text.hidden_size)).astype(np.float32)
    cos, sin = text_rope(text_positions(0, 4, 0), cfg.text)
    calls = glue_runtime.models["mtp"].calls
    got = glue_runtime.mtp(prev, embeds, 0, cos, sin)
    assert glue_runtime.models["mtp"].calls == calls + 4  # one package call per row
    for g, e, what in zip(got, torch_rt.mtp(prev, embeds, 0, cos, sin), ("mtp raw", "mtp normed")):
        _close(g, e, what)


def test_runtime_glue_runs_the_ocr_engine_losslessly(glue_runtime, converted):
    """The OCR engine on the Core ML runtime's glue: MTP at 1, 3 and 7 steps emits exactly the
    tokens of plain decoding (within the same runtime)."""
    from PIL import Image

    from engines.types import Request, SpecConfig
    from engines.glm_ocr.engine import OcrEngine
    from engines.glm_ocr.image import ImageProcessorConfig
    from engines.glm_ocr.prompts import GlmTokenizer

    out = converted[0]
    engine = OcrEngine(glue_runtime, GlmTokenizer(out), str(out), ImageProcessorConfig.from_dir(out))
    engine.repetition = None
    image = out.parent / "page.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (70, 120, 3), dtype=np.uint8)).save(image)

    def run(steps):
        request = Request(kind="ocr", image=str(image), max_tokens=24,
                          spec=SpecConfig(method="mtp" if steps else "off", steps=steps))
        rounds = list(engine.generate(request))
        return [t for r in rounds for t in r.tokens], rounds

    plain, plain_rounds = run(0)
    assert len(plain) == 24 or plain_rounds[-1].finish == "stop"
    for steps in (1, 3, 7):
        tokens, rounds = run(steps)
        assert tokens == plain, steps
        assert sum(r.proposed for r in rounds) > 0  # the MTP package was really drafting


def test_a_conversion_without_mtp_decodes_plainly_and_says_why(converted_without_mtp, tmp_path):
    """A checkpoint without the MTP layer converts without mtp.mlpackage; the Core ML runtime
    reports "MTP unavailable: ..." from the manifest and the engine decodes plainly."""
    from PIL import Image

    from engines.types import Request, SpecConfig
    from engines.glm_ocr.convert import patch_rms_norms
    from engines.glm_ocr.engine import OcrEngine
    from engines.glm_ocr.image import ImageProcessorConfig
    from engines.glm_ocr.prompts import GlmTokenizer
    from engines.glm_ocr.weights import load_modules
    from tests.engines.glm_ocr.convert.package_runner import PackageRunner

    out, manifest = converted_without_mtp
    modules = load_modules(manifest["source"]["path"], manifest["cache_length"])
    assert modules.mtp is None
    patch_rms_norms(modules)
    sources = {"vision": modules.vision, "decoder": modules.decoder, "lm_head": modules.lm_head}
    runtime = CoreMLRuntime(out, manifest, {name: PackageRunner(out / entry["path"], sources[name])
                                            for name, entry in manifest["packages"].items()}, "cpu_only")
    assert runtime.mtp_unavailable.startswith("MTP unavailable:")
    engine = OcrEngine(runtime, GlmTokenizer(out), str(out), ImageProcessorConfig.from_dir(out))
    engine.repetition = None
    image = tmp_path / "small.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (28, 56, 3), dtype=np.uint8)).save(image)
    rounds = list(engine.generate(Request(kind="ocr", image=str(image), max_tokens=4,
                                          spec=SpecConfig(method="mtp", steps=3))))
    assert "MTP unavailable" in rounds[0].note
    assert all(r.proposed == 0 for r in rounds) and sum(len(r.tokens) for r in rounds) >= 1
