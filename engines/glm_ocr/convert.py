"""Convert a GLM-OCR Hugging Face checkpoint into Core ML packages.

    convert_glm_ocr(hf_dir, out_dir, seq_len=8, cache_length=2048, progress=None) -> manifest

writes to out_dir the packages vision, decoder, lm_head and mtp (modules.py's VisionEncoder,
TextDecoder, LMHead, MtpLayer; no mtp when the checkpoint has no MTP layer: the manifest says
why), embeddings.npy (the token embedding table, float16, looked up on the host), the files the
engine reads besides (SUPPORT_SUFFIXES), and manifest.json -- written last, so its presence
means "complete".

The modules converted are the very channels-first modules the PyTorch runtime executes
(modules.py), with one kind of conversion patch: every norm becomes a single layer_norm op
(RMSNorm as a LayerNorm over [x, -x], equal in exact arithmetic; see RMSNormAsLayerNorm), so
no float16 graph squares activations itself. Every module is traced, checked against the
unpatched transformers module on random inputs (max abs error into the manifest), then
converted with coremltools (ML program, float16, macOS 15 for stateful models).

Core ML *prediction* cannot run off macOS: the parity measured here is traced-torch vs
transformers; Core ML vs torch parity is a macOS-only test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from engines.types import EngineError

try:  # conversion needs the `convert` extra; this module still imports without it
    import torch
    import torch.nn as nn

    _Module = nn.Module
except ImportError:  # pragma: no cover - exercised only where torch is absent
    torch = nn = None
    _Module = object

Progress = Callable[[str, float], None]

MANIFEST_FORMAT = "specscope-glm-ocr-coreml"
MANIFEST_VERSION = 1
PACKAGES = ("vision", "decoder", "lm_head", "mtp")

# Parity tolerance in float32 (differences are summation order only), relative to the
# reference output's largest magnitude.
PARITY_RTOL = 1e-4

# Files copied next to the packages: what the engine reads besides the packages (config,
# tokenizer, chat template, image processor). Weights are not copied.
SUPPORT_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")
NOT_COPIED = ("model.safetensors.index.json",)


@dataclass
class ParityReport:
    module: str
    reference: str  # which transformers module the output was compared with
    max_abs_error: float
    reference_max_abs: float  # scale of the reference output
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_error <= self.tolerance

    def to_dict(self) -> dict:
        return {
            "reference": self.reference,
            "max_abs_error": self.max_abs_error,
            "reference_max_abs": self.reference_max_abs,
            "tolerance": self.tolerance,
            "ok": self.ok,
            "checked": "traced torch module vs unpatched transformers module, float32, random inputs",
        }


def _report(module: str, reference: str, got, expected) -> ParityReport:
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        raise EngineError(f"parity check of {module}: shape {got.shape} != reference {expected.shape}")
    scale = float(np.abs(expected).max())
    return ParityReport(module, reference, float(np.abs(got - expected).max()), scale,
                        PARITY_RTOL * max(1.0, scale))


# ---------------------------------------------------------------------------------------
# The entry point


def convert_glm_ocr(
    hf_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    seq_len: int = 8,
    cache_length: int = 2048,
    progress: Progress | None = None,
) -> dict:
    """Convert the checkpoint in `hf_dir` into `out_dir`; returns the manifest (also written
    to out_dir/manifest.json). Raises EngineError with one line for user errors."""
    if torch is None:
        raise EngineError("conversion needs torch and transformers: pip install 'specscope[convert]'")
    from engines.glm_ocr.config import GlmOcrConfig
    from engines.glm_ocr.weights import load_reference, modules_from_reference, safetensors_files

    report = progress or (lambda message, fraction: None)
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    _check_arguments(hf_dir, out_dir, seq_len, cache_length)
    config = GlmOcrConfig.load(hf_dir)
    if not safetensors_files(hf_dir):
        raise EngineError(f"{hf_dir} has no safetensors weights")
    _prepare_out_dir(out_dir)
    torch.manual_seed(0)

    report("hashing the source checkpoint", 0.0)
    source_hash = checkpoint_hash(hf_dir)
    report("loading the checkpoint with transformers", 0.03)
    with torch.no_grad():
        ref = load_reference(hf_dir)
        modules = modules_from_reference(ref, config, cache_length, hf_dir)
    patch_rms_norms(modules)

    packages: dict[str, dict] = {}
    steps = [
        ("vision", 0.08, 0.35, lambda: _convert_vision(modules, ref, hf_dir, out_dir, cache_length)),
        ("decoder", 0.35, 0.65, lambda: _convert_decoder(modules, ref, seq_len, out_dir)),
        ("lm_head", 0.65, 0.75, lambda: _convert_lm_head(modules, ref, seq_len, out_dir)),
    ]
    if modules.mtp is not None:
        steps.append(("mtp", 0.75, 0.9, lambda: _convert_mtp(modules, ref, out_dir)))
    for name, start, end, convert in steps:
        report(f"converting {name} (trace, parity check, coremltools)", start)
        t0 = time.perf_counter()
        packages[name] = convert()
        packages[name]["conversion_seconds"] = round(time.perf_counter() - t0, 2)
        parity = packages[name]["parity"]
        report(f"{name}: max abs error {parity['max_abs_error']:.2e} vs {parity['reference']}", end)
        if not parity["ok"]:
            raise EngineError(
                f"parity check failed for {name}: max abs error {parity['max_abs_error']:.3g} > "
                f"{parity['tolerance']:.3g}; the conversion is not trustworthy"
            )

    report("writing embeddings.npy and copying tokenizer/processor files", 0.9)
    embeddings = modules.embeddings.astype(np.float16)
    np.save(out_dir / "embeddings.npy", embeddings)
    copied = copy_support_files(hf_dir, out_dir)

    manifest = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": {"path": str(hf_dir.resolve()), "sha256": source_hash,
                   "files": [p.name for p in _hashed_files(hf_dir)]},
        "converters": converter_versions(),
        "seq_len": seq_len,
        "cache_length": cache_length,
        "compute_precision": "float16",
        "minimum_deployment_target": "macOS15",
        "model": {
            "hidden_size": config.text.hidden_size, "vocab_size": config.text.vocab_size,
            "num_hidden_layers": config.text.num_hidden_layers,
            "num_key_value_heads": config.text.num_key_value_heads, "head_dim": config.text.head_dim,
            "rotary_dim": config.text.rotary_dim,
        },
        "packages": packages,
        "parity": {name: entry["parity"]["max_abs_error"] for name, entry in packages.items()},
        "embeddings": {"path": "embeddings.npy", "shape": list(embeddings.shape), "dtype": "float16"},
        "mtp": {"available": modules.mtp is not None, "reason": modules.mtp_missing_reason},
        "copied_files": copied,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    report("done", 1.0)
    return manifest


def _check_arguments(hf_dir: Path, out_dir: Path, seq_len: int, cache_length: int) -> None:
    if not hf_dir.is_dir():
        raise EngineError(f"checkpoint directory not found: {hf_dir}")
    if not 1 <= seq_len <= 64:
        raise EngineError(f"--seq-len must be between 1 and 64, got {seq_len}")
    if cache_length < 2 * seq_len:
        raise EngineError(f"--cache-length must be at least twice --seq-len, got {cache_length}")
    if hf_dir.resolve() == out_dir.resolve():
        raise EngineError("--out must differ from --from (the checkpoint is not overwritten)")


def _prepare_out_dir(out_dir: Path) -> None:
    """An empty or new directory, or one holding an earlier conversion (replaced)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise EngineError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not _is_our_manifest(out_dir / "manifest.json"):
            raise EngineError(f"{out_dir} is not empty and holds no earlier conversion; choose another --out")
        (out_dir / "manifest.json").unlink()  # from here on the directory is incomplete
        for name in PACKAGES:
            shutil.rmtree(out_dir / f"{name}.mlpackage", ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)


def _is_our_manifest(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("format") == MANIFEST_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


# ---------------------------------------------------------------------------------------
# Provenance


def _hashed_files(hf_dir: Path) -> list[Path]:
    from engines.glm_ocr.weights import safetensors_files

    return [hf_dir / "config.json"] + safetensors_files(hf_dir)


def checkpoint_hash(hf_dir: str | os.PathLike) -> str:
    """sha256 over config.json and the safetensors files (names and bytes, in order)."""
    digest = hashlib.sha256()
    for path in _hashed_files(Path(hf_dir)):
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def converter_versions() -> dict:
    import coremltools
    import torch
    import transformers

    return {"coremltools": coremltools.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__}


def copy_support_files(hf_dir: Path, out_dir: Path) -> list[str]:
    copied = []
    for path in sorted(hf_dir.iterdir()):
        if path.is_file() and path.suffix in SUPPORT_SUFFIXES and path.name not in NOT_COPIED:
            shutil.copy2(path, out_dir / path.name)
            copied.append(path.name)
    return copied


# ---------------------------------------------------------------------------------------
# The conversion patch


def patch_rms_norms(modules) -> None:
    """Replace every RMSNormCF by RMSNormAsLayerNorm and every LayerNormCF (written out as
    mean / pow / mean) by ChannelLayerNorm, in place: Core ML gets layer_norm ops only."""
    from engines.glm_ocr.modules import LayerNormCF, RMSNormCF

    def patch(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if isinstance(child, RMSNormCF):
                setattr(parent, name, RMSNormAsLayerNorm(child))
            elif isinstance(child, LayerNormCF):
                setattr(parent, name, ChannelLayerNorm(child))
            else:
                patch(child)

    for module in (modules.vision, modules.decoder, modules.mtp):
        if module is not None:
            patch(module)


class RMSNormAsLayerNorm(_Module):
    """RMSNorm over channels of (1, C, 1, S) written as LayerNorm over [x, -x].

    Why: in float16, x.pow(2) overflows once |x| > 256 (GLM's residual stream gets there);
    the doubled vector has mean exactly 0, so its LayerNorm variance is mean(x^2), and
    Core ML runs layer_norm as one op with a stable float16 kernel."""

    def __init__(self, norm):
        super().__init__()
        self.weight = nn.Parameter(norm.weight.detach().clone())
        self.eps = norm.eps
        self.channels = norm.weight.shape[0]

    def forward(self, x):
        doubled = torch.cat([x, -x], dim=1).permute(0, 2, 3, 1)  # (1, 1, S, 2C)
        normed = torch.nn.functional.layer_norm(doubled, (2 * self.channels,), eps=self.eps)
        return normed.permute(0, 3, 1, 2)[:, : self.channels] * self.weight.view(1, -1, 1, 1)


class ChannelLayerNorm(_Module):
    """LayerNorm over channels of (1, C, 1, S) as one layer_norm op (no float16 x^2)."""

    def __init__(self, norm):
        super().__init__()
        self.weight = nn.Parameter(norm.weight.detach().clone())
        self.bias = nn.Parameter(norm.bias.detach().clone())
        self.eps = norm.eps

    def forward(self, x):
        normed = torch.nn.functional.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), self.weight, self.bias, self.eps)
        return normed.permute(0, 3, 1, 2)


def rms_norm_last_as_layer_norm(x, weight, eps: float):
    """modules.rms_norm_last (the vision q/k norms over head_dim) by the same [x, -x] trick."""
    doubled = torch.cat([x, -x], dim=-1)
    normed = torch.nn.functional.layer_norm(doubled, (doubled.shape[-1],), eps=eps)
    return weight * normed[..., : x.shape[-1]]


@contextmanager
def stable_head_norms():
    """While tracing, the vision attention's q/k RMSNorms (a function, not a module, in
    modules.py) run as rms_norm_last_as_layer_norm. Only the traced graph changes."""
    from engines.glm_ocr import modules

    original = modules.rms_norm_last
    modules.rms_norm_last = rms_norm_last_as_layer_norm
    try:
        yield
    finally:
        modules.rms_norm_last = original


# ---------------------------------------------------------------------------------------
# Tracing and coremltools


def _trace(module, example: tuple):
    # torch 2.13 deprecates jit.trace in favour of torch.export; coremltools 9 converts the
    # traced graph with states reliably, so we keep it (and keep its warning out of the CLI).
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.trace(module.eval(), example, check_trace=False)


def fix_coremltools_cast_for_numpy2() -> None:
    """coremltools 9.0 folds torch's `int(size)` with `int(np.array([n]))`, which NumPy >= 2.3
    refuses (only 0-d arrays convert to scalars). Fold size-1 constants via .item() instead;
    everything else goes to coremltools' own routine."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.frontend.torch import ops

    original = ops._cast
    if getattr(original, "specscope_fixed", False):
        return

    def cast(context, node, dtype, dtype_name):
        x = ops._get_inputs(context, node, expected=1)[0]
        value = x.val if x.can_be_folded_to_const() else None
        if isinstance(value, np.ndarray) and value.size == 1:
            context.add(mb.const(val=dtype(value.reshape(()).item()), name=node.name), node.name)
            return
        original(context, node, dtype, dtype_name)

    cast.specscope_fixed = True
    ops._cast = cast


def _convert(traced, path: Path, inputs: dict, outputs: dict, states: dict | None = None) -> dict:
    """Convert a traced module into the ML program at `path`; returns the package's manifest
    entry (path, inputs, outputs, states). Each of inputs, outputs, states maps a name to a
    float16 shape, or (an input only) to (shape, dtype); a ct.RangeDim in a shape is a flexible
    dimension, -1 in the manifest."""
    import coremltools as ct

    inputs = {k: v if isinstance(v[0], tuple) else (v, np.float16) for k, v in inputs.items()}
    outputs = {k: (v, np.float16) for k, v in outputs.items()}
    states = {k: (v, np.float16) for k, v in (states or {}).items()}
    fix_coremltools_cast_for_numpy2()
    mlmodel = ct.convert(
        traced,
        inputs=[ct.TensorType(name=k, shape=shape, dtype=dtype) for k, (shape, dtype) in inputs.items()],
        outputs=[ct.TensorType(name=k, dtype=dtype) for k, (_, dtype) in outputs.items()],
        states=[ct.StateType(wrapped_type=ct.TensorType(shape=shape, dtype=dtype), name=k)
                for k, (shape, dtype) in states.items()] or None,
        convert_to="mlprogram",
        compute_precision=ct.precision.FLOAT16,
        minimum_deployment_target=ct.target.macOS15,
        skip_model_load=True,  # loading compiles, which needs macOS; the runtime loads later
    )
    mlmodel.save(str(path))

    def describe(specs: dict) -> dict:
        return {k: {"shape": [-1 if isinstance(d, ct.RangeDim) else int(d) for d in shape],
                    "dtype": np.dtype(dtype).name} for k, (shape, dtype) in specs.items()}

    return {"path": path.name, "inputs": describe(inputs), "outputs": describe(outputs), "states": describe(states)}


def _cf(x):  # (S, C) -> (1, C, 1, S)
    return x.float().T[None, :, None, :].contiguous()


def _rows(x):  # (1, C, 1, S) -> (S, C)
    return x[0, :, 0, :].T


def _random_positions(rng: np.random.Generator, count: int, start: int) -> np.ndarray:
    """(3, count) multimodal positions whose three rows differ (as image tokens' do), so
    every mRoPE section is exercised."""
    base = np.arange(start, start + count)
    return np.stack([base, base + rng.integers(0, 5, count), base + rng.integers(0, 9, count)]).astype(np.int64)


def _fresh_caches(module) -> None:
    module.key_cache.zero_()
    module.value_cache.zero_()


# ---------------------------------------------------------------------------------------
# The four packages


def _convert_vision(modules, ref, hf_dir: Path, out_dir: Path, cache_length: int) -> dict:
    import coremltools as ct

    from engines.glm_ocr.image import ImageProcessorConfig
    from engines.glm_ocr.positions import vision_rope

    v = modules.config.vision
    channels = v.in_channels * v.temporal_patch_size
    window = v.spatial_merge_size**2
    image_config = ImageProcessorConfig.from_dir(hf_dir)
    # The processor's largest image, but no more image tokens (one per window) than the
    # context holds: a larger image could never be decoded, and attention over N patches
    # costs N^2 memory.
    max_patches = min(image_config.max_pixels // (v.temporal_patch_size * v.patch_size**2),
                      window * cache_length) // window * window
    rng = np.random.default_rng(0)

    def inputs_for(grid):
        n = grid[0] * grid[1] * grid[2]
        pixels = torch.from_numpy(rng.standard_normal((n, channels * v.patch_size**2)).astype(np.float32))
        cos, sin = vision_rope(grid, v)
        return pixels, (pixels.view(n, channels, v.patch_size, v.patch_size),
                        torch.from_numpy(cos), torch.from_numpy(sin), torch.zeros(1, 1, n))

    # Trace at one grid and check at another: the traced graph must follow N.
    _, example = inputs_for((1, 8, 8))
    with stable_head_norms():
        traced = _trace(modules.vision, example)
    check_grid = (1, 6, 10)
    pixels, check = inputs_for(check_grid)
    with torch.no_grad():
        got = _rows(traced(*check))
        expected = ref.model.model.visual(pixels, grid_thw=torch.tensor([check_grid])).pooler_output
    parity = _report("vision", "transformers GlmOcrVisionModel (pooler_output)", got, expected)

    n = ct.RangeDim(lower_bound=window, upper_bound=max(max_patches, 64), default=64, symbol="num_patches")
    p, head_dim = v.patch_size, v.head_dim
    io = _convert(traced, out_dir / "vision.mlpackage",
                  {"pixel_patches": (n, channels, p, p), "position_cos": (n, head_dim),
                   "position_sin": (n, head_dim), "attention_bias": (1, 1, n)},
                  {"image_embeds": (1, modules.config.text.hidden_size, 1, n)})
    return {
        **io,
        "num_patches": {"min": window, "max": max(max_patches, 64), "multiple_of": window},
        "notes": "num_patches is flexible; attention_bias (0 or -1e4 per key) hides padded patches",
        "parity": parity.to_dict(),
    }


def _convert_decoder(modules, ref, seq_len: int, out_dir: Path) -> dict:
    from engines.glm_ocr.positions import text_rope

    cfg = modules.config.text
    decoder = modules.decoder
    rng = np.random.default_rng(1)

    def chunk(positions, start):
        cos, sin = text_rope(positions, cfg)
        return (torch.from_numpy(cos), torch.from_numpy(sin), torch.tensor([start], dtype=torch.int32))

    # Two chunks: the second attends to the first through the cache (a real prefill).
    total = 2 * seq_len
    embeds = torch.from_numpy(rng.standard_normal((total, cfg.hidden_size)).astype(np.float32))
    positions = _random_positions(rng, total, 0)
    example = (_cf(embeds[:seq_len]), *chunk(positions[:, :seq_len], 0))
    _fresh_caches(decoder)
    traced = _trace(decoder, example)
    _fresh_caches(decoder)
    with torch.no_grad():
        got = torch.cat([
            _rows(traced(_cf(embeds[s : s + seq_len]), *chunk(positions[:, s : s + seq_len], s)))
            for s in (0, seq_len)
        ])
        expected = ref.model.model.language_model(
            inputs_embeds=embeds[None], position_ids=torch.from_numpy(positions)[:, None]
        ).last_hidden_state[0]
    _fresh_caches(decoder)
    parity = _report("decoder", "transformers GlmOcrTextModel (last_hidden_state, after the final norm)",
                     got, expected)

    h, r = cfg.hidden_size, cfg.rotary_dim
    cache_shape = tuple(decoder.key_cache.shape)
    io = _convert(traced, out_dir / "decoder.mlpackage",
                  {"inputs_embeds": (1, h, 1, seq_len), "position_cos": (seq_len, r),
                   "position_sin": (seq_len, r), "cache_position": ((1,), np.int32)},
                  {"hidden": (1, h, 1, seq_len)},
                  {"key_cache": cache_shape, "value_cache": cache_shape})
    return {
        **io,
        "parity": parity.to_dict(),
    }


def _convert_lm_head(modules, ref, seq_len: int, out_dir: Path) -> dict:
    cfg = modules.config.text
    rng = np.random.default_rng(2)
    hidden = torch.from_numpy(rng.standard_normal((seq_len, cfg.hidden_size)).astype(np.float32))
    traced = _trace(modules.lm_head, (_cf(hidden),))
    with torch.no_grad():
        got = _rows(traced(_cf(hidden)))
        expected = ref.model.lm_head(hidden)
    parity = _report("lm_head", "transformers GlmOcrForConditionalGeneration.lm_head", got, expected)
    h, vocab = cfg.hidden_size, cfg.vocab_size
    io = _convert(traced, out_dir / "lm_head.mlpackage",
                  {"hidden": (1, h, 1, seq_len)}, {"logits": (1, vocab, 1, seq_len)})
    return {
        **io,
        "vocab_chunks": [conv.out_channels for conv in modules.lm_head.chunks],
        "parity": parity.to_dict(),
    }


def _convert_mtp(modules, ref, out_dir: Path) -> dict:
    """One row per call: drafting runs the layer once per draft step, so a wider chunk would
    multiply the hot path's cost; prompt prefill and alignment call it row by row."""
    from engines.glm_ocr.positions import text_rope
    from engines.glm_ocr.weights import reference_mtp_forward

    cfg = modules.config.text
    mtp = modules.mtp
    rng = np.random.default_rng(3)
    steps = 6
    previous = torch.from_numpy(rng.standard_normal((steps, cfg.hidden_size)).astype(np.float32))
    embeds = torch.from_numpy(rng.standard_normal((steps, cfg.hidden_size)).astype(np.float32))
    positions = _random_positions(rng, steps, 0)
    cos, sin = (torch.from_numpy(t) for t in text_rope(positions, cfg))

    def row(i):
        return (_cf(previous[i : i + 1]), _cf(embeds[i : i + 1]), cos[i : i + 1], sin[i : i + 1],
                torch.tensor([i], dtype=torch.int32))

    _fresh_caches(mtp)
    traced = _trace(mtp, row(1))  # slot 1: the position-0 mask must stay a graph op, not fold
    _fresh_caches(mtp)
    with torch.no_grad():
        outs = [traced(*row(i)) for i in range(steps)]
        got_raw = torch.cat([_rows(o[0]) for o in outs])
        got_head = torch.cat([_rows(o[1]) for o in outs])
        exp_raw, exp_head = reference_mtp_forward(ref, previous[None], embeds[None],
                                                  torch.from_numpy(positions)[:, None])
    _fresh_caches(mtp)
    reports = [
        _report("mtp", "transformers GlmOcrTextDecoderLayer + enorm/hnorm/eh_proj: mtp_hidden", got_raw, exp_raw[0]),
        _report("mtp", "transformers GlmOcrTextDecoderLayer + enorm/hnorm/eh_proj + shared_head.norm: "
                "mtp_hidden_for_head", got_head, exp_head[0]),
    ]
    parity = max(reports, key=lambda r: r.max_abs_error / r.tolerance)  # the worse of the two outputs

    h, r = cfg.hidden_size, cfg.rotary_dim
    cache_shape = tuple(mtp.key_cache.shape)
    io = _convert(traced, out_dir / "mtp.mlpackage",
                  {"previous_hidden": (1, h, 1, 1), "input_embeds": (1, h, 1, 1), "position_cos": (1, r),
                   "position_sin": (1, r), "cache_position": ((1,), np.int32)},
                  {"mtp_hidden": (1, h, 1, 1), "mtp_hidden_for_head": (1, h, 1, 1)},
                  {"key_cache": cache_shape, "value_cache": cache_shape})
    return {
        **io,
        "consumes": "the main model's hidden state after its final norm (what the LM head sees)",
        "parity": parity.to_dict(),
    }
