"""The Core ML runtime: runs the packages written by convert.py (macOS 15+).

Implements the Runtime protocol of runtime.py (NumPy rows in, NumPy rows out, float32); the
packages take channels-first float16 tensors and keep both KV caches as Core ML state.
Compiled models (.mlmodelc) are cached in the user cache directory, keyed by the
conversion's manifest, so only the first load of a converted directory pays compilation.

This module imports everywhere (coremltools is imported on use); off macOS `load` raises
EngineError saying so: Core ML prediction exists only on Apple platforms.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from engines.types import EngineError, one_line
from engines.glm_ocr.config import GlmOcrConfig
from engines.glm_ocr.runtime import pad_rows

MANIFEST_FORMAT = "specscope-glm-ocr-coreml"  # equals convert.MANIFEST_FORMAT
CACHE_APP_NAME = "Specscope"
MIN_MACOS = 15  # stateful models (KV cache as Core ML state)

# --compute-units choices -> coremltools.ComputeUnit member names
COMPUTE_UNITS = {
    "all": "ALL",
    "cpu_and_ne": "CPU_AND_NE",
    "cpu_and_gpu": "CPU_AND_GPU",
    "cpu_only": "CPU_ONLY",
}


def read_manifest(model_dir: str | os.PathLike) -> dict:
    """The converted directory's manifest, or EngineError saying what the directory is not."""
    model_dir = Path(model_dir)
    path = model_dir / "manifest.json"
    if not model_dir.is_dir():
        raise EngineError(f"model directory not found: {model_dir}")
    if not path.is_file():
        hint = ("it is a Hugging Face checkpoint: use --runtime torch, or convert it with "
                "`specscope convert glm-ocr --from DIR --out OUT`"
                if any(model_dir.glob("*.safetensors")) else "convert a checkpoint with `specscope convert glm-ocr`")
        raise EngineError(f"{model_dir} is not a converted GLM-OCR directory (no manifest.json); {hint}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read {path}: {exc}") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise EngineError(f"{path} is not a Specscope GLM-OCR manifest (format {manifest.get('format')!r})")
    entries = list(manifest.get("packages", {}).values()) + [manifest.get("embeddings", {})]
    for entry in entries:
        if "path" in entry:
            inside(model_dir, entry["path"])
    for name, entry in manifest.get("packages", {}).items():
        if not (model_dir / entry["path"]).exists():
            raise EngineError(f"{model_dir} is incomplete: {entry['path']} is missing; convert again")
    return manifest


def inside(model_dir: Path, relative: str) -> Path:
    """A path the manifest names, confined to the model folder: an absolute path or `..` would
    make loading the model read (np.load) a file it does not own. Checked on the path's text,
    not its resolved target: a hub cache's snapshot folder is symlinks into its blob store."""
    if (not isinstance(relative, str) or not relative or Path(relative).is_absolute()
            or Path(os.path.normpath(relative)).parts[0] == ".."):
        raise EngineError(f"{model_dir}/manifest.json names a file outside the model folder: {relative!r}")
    return model_dir / relative


def default_runtime(model_dir: str | os.PathLike) -> str:
    """"coreml" for a converted directory (it has our manifest), else "torch" (a Hugging
    Face checkpoint). Off macOS a converted directory still maps to "coreml", whose loader
    then says that Core ML needs macOS: clearer than the torch runtime's complaint."""
    return "coreml" if (Path(model_dir) / "manifest.json").is_file() else "torch"


def check_platform() -> None:
    if sys.platform != "darwin":
        raise EngineError(
            f"the Core ML runtime needs macOS {MIN_MACOS} or later (this is {platform.system()}); "
            "use --runtime torch with a Hugging Face checkpoint"
        )
    version = platform.mac_ver()[0]
    major = int(version.split(".")[0]) if version else 0
    if major < MIN_MACOS:
        raise EngineError(f"the Core ML runtime needs macOS {MIN_MACOS} or later (this is macOS {version})")


def compiled_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir(CACHE_APP_NAME, appauthor=False)) / "coreml"


def _cache_key(model_dir: Path, name: str) -> str:
    """Changes whenever the directory is converted again (the manifest records the source
    hash, converter versions and creation time) or coremltools changes."""
    import coremltools as ct

    digest = hashlib.sha256((model_dir / "manifest.json").read_bytes())
    digest.update(f"{name}\0{ct.__version__}".encode())
    return digest.hexdigest()[:20]


def load_compiled(model_dir: Path, package: str, name: str, compute_units: str):
    """A CompiledMLModel for model_dir/package, compiling into the cache on first use."""
    import coremltools as ct

    target = compiled_cache_dir() / f"{name}-{_cache_key(model_dir, name)}.mlmodelc"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = ct.utils.compile_model(str(model_dir / package), str(Path(scratch) / target.name))
            try:
                os.replace(built, target)  # atomic: a concurrent loader sees all or nothing
            except OSError:
                if not target.exists():
                    raise
                shutil.rmtree(built, ignore_errors=True)
    units = getattr(ct.ComputeUnit, COMPUTE_UNITS[compute_units])
    return ct.models.CompiledMLModel(str(target), compute_units=units)


def _cf(rows: np.ndarray) -> np.ndarray:
    """(S, C) -> (1, C, 1, S) float16."""
    return np.ascontiguousarray(np.asarray(rows, dtype=np.float16).T[None, :, None, :])


def _rows(cf: np.ndarray) -> np.ndarray:
    """(1, C, 1, S) -> (S, C) float32."""
    return np.ascontiguousarray(np.asarray(cf)[0, :, 0, :].T, dtype=np.float32)


class CoreMLRuntime:
    name = "coreml"

    def __init__(self, model_dir: Path, manifest: dict, models: dict, compute_units: str):
        self.model_dir = model_dir
        self.manifest = manifest
        self.compute_units = compute_units
        self.config = GlmOcrConfig.load(model_dir)
        self.seq_len = int(manifest["seq_len"])
        self.prefill_len = self.seq_len  # the converted decoder takes seq_len rows per call
        self.cache_length = int(manifest["cache_length"])
        self.embeddings = np.load(model_dir / manifest["embeddings"]["path"], allow_pickle=False).astype(np.float32)
        self.models = models
        self.mtp_unavailable = None if "mtp" in models else (
            manifest.get("mtp", {}).get("reason") or f"MTP unavailable: {model_dir} has no mtp.mlpackage")
        self._decoder_state = None
        self._mtp_state = None
        self.reset()

    @classmethod
    def load(cls, model_dir: str | os.PathLike, compute_units: str = "all", **_ignored) -> "CoreMLRuntime":
        """`compute_units`: all | cpu_and_ne | cpu_and_gpu | cpu_only."""
        model_dir = Path(model_dir)
        manifest = read_manifest(model_dir)
        if compute_units not in COMPUTE_UNITS:
            raise EngineError(f"unknown compute units {compute_units!r} (expected {', '.join(COMPUTE_UNITS)})")
        check_platform()
        try:
            models = {name: load_compiled(model_dir, entry["path"], name, compute_units)
                      for name, entry in manifest["packages"].items()}
        except EngineError:
            raise
        except Exception as exc:  # noqa: BLE001 -- Core ML's errors become one line
            raise EngineError(f"cannot load the Core ML packages in {model_dir}: {one_line(exc)}") from exc
        return cls(model_dir, manifest, models, compute_units)

    def reset(self) -> None:
        """Fresh KV caches: new Core ML states start zeroed."""
        self._decoder_state = self.models["decoder"].make_state()
        self._mtp_state = self.models["mtp"].make_state() if "mtp" in self.models else None

    def encode_image(self, pixel_values: np.ndarray, grid_thw) -> np.ndarray:
        from engines.glm_ocr.positions import vision_rope

        v = self.config.vision
        grid = tuple(int(x) for x in grid_thw)
        patches = np.asarray(pixel_values, dtype=np.float16).reshape(
            -1, v.in_channels * v.temporal_patch_size, v.patch_size, v.patch_size)
        limits = self.manifest["packages"]["vision"]["num_patches"]
        if not limits["min"] <= patches.shape[0] <= limits["max"]:
            raise EngineError(f"the image has {patches.shape[0]} patches; the converted vision encoder takes "
                              f"{limits['min']}..{limits['max']} (use a smaller image)")
        cos, sin = vision_rope(grid, v)
        out = self.models["vision"].predict({
            "pixel_patches": patches,
            "position_cos": cos.astype(np.float16),
            "position_sin": sin.astype(np.float16),
            "attention_bias": np.zeros((1, 1, patches.shape[0]), dtype=np.float16),
        })
        return _rows(out["image_embeds"])

    def decode(self, embeds: np.ndarray, cache_position: int, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        n = embeds.shape[0]
        if not (1 <= n <= self.seq_len and cache_position + self.seq_len <= self.cache_length):
            raise EngineError(f"decoder call out of range: {n} rows at {cache_position} "
                              f"(seq_len {self.seq_len}, cache {self.cache_length})")
        out = self.models["decoder"].predict({
            "inputs_embeds": _cf(pad_rows(embeds, self.seq_len)),
            "position_cos": pad_rows(cos, self.seq_len).astype(np.float16),
            "position_sin": pad_rows(sin, self.seq_len).astype(np.float16),
            "cache_position": np.array([cache_position], dtype=np.int32),
        }, state=self._decoder_state)
        return _rows(out["hidden"])[:n]

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """The LM head package takes seq_len rows; longer inputs go in pieces, shorter are padded."""
        parts = []
        for start in range(0, hidden.shape[0], self.seq_len):
            rows = hidden[start : start + self.seq_len]
            out = self.models["lm_head"].predict({"hidden": _cf(pad_rows(rows, self.seq_len))})
            parts.append(_rows(out["logits"])[: rows.shape[0]])
        return np.concatenate(parts)

    def new_mtp_cache(self) -> None:
        """One MTP state (the stateful package's): sequences are read one at a time here (the
        batch, batch.py, is a batch of one on Core ML)."""
        return None

    def mtp(self, previous_hidden: np.ndarray, embeds: np.ndarray, cache_position: int,
            cos: np.ndarray, sin: np.ndarray, cache=None) -> tuple[np.ndarray, np.ndarray]:
        """The MTP package takes one row per call (the drafting hot path); several rows go
        one by one, which is exact: row i only attends to cache rows <= its own. `cache`: always
        None here (the one state)."""
        assert cache is None, "Core ML holds one MTP state"
        if self._mtp_state is None:
            raise EngineError(self.mtp_unavailable or "MTP unavailable")
        n = embeds.shape[0]
        if cache_position + n > self.cache_length:
            raise EngineError(f"MTP call out of range: {n} rows at {cache_position} (cache {self.cache_length})")
        raw, head = [], []
        for i in range(n):
            out = self.models["mtp"].predict({
                "previous_hidden": _cf(previous_hidden[i : i + 1]),
                "input_embeds": _cf(embeds[i : i + 1]),
                "position_cos": cos[i : i + 1].astype(np.float16),
                "position_sin": sin[i : i + 1].astype(np.float16),
                "cache_position": np.array([cache_position + i], dtype=np.int32),
            }, state=self._mtp_state)
            raw.append(_rows(out["mtp_hidden"]))
            head.append(_rows(out["mtp_hidden_for_head"]))
        return np.concatenate(raw), np.concatenate(head)
