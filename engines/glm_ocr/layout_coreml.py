"""The layout model (PP-DocLayoutV3) on Core ML: the package layout_convert.py writes, run.

LayoutModel.load (layout.py) picks CoreMLLayout for a converted directory where Core ML loads
(macOS 15+) and falls back to PyTorch on the checkpoint it was converted from elsewhere.
UNCHECKED: CoreMLLayout is written to the saved package's interface and has never predicted
here: coremltools predicts on macOS only (its glue is exercised on Linux with the module the
package was traced from standing in for Core ML: tests/engines/glm_ocr/convert/test_layout_coreml.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from engines.types import EngineError

MANIFEST_FORMAT = "specscope-pp-doclayout-v3-coreml"
PACKAGE = "layout.mlpackage"
OUTPUTS = ("logits", "pred_boxes", "order_logits")


def is_conversion(model_dir: Path) -> bool:
    """Whether `model_dir` holds our layout manifest (complete or not)."""
    try:
        return json.loads((Path(model_dir) / "manifest.json").read_text()).get("format") == MANIFEST_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_manifest(model_dir: str | os.PathLike) -> dict:
    """A converted layout directory's manifest, or EngineError saying what is wrong with it."""
    from engines.glm_ocr.runtime_coreml import inside

    model_dir = Path(model_dir)
    path = model_dir / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise EngineError(f"{path} is not a Specscope PP-DocLayoutV3 manifest")
    package = manifest.get("package", {}).get("path")
    if not (inside(model_dir, package)).exists():
        raise EngineError(f"{model_dir} is incomplete: {package} is missing; convert again")
    return manifest


class CoreMLLayout:
    """layout.mlpackage behind LayoutModel: one page's (logits, pred_boxes, order_logits).
    UNCHECKED: written to the package's saved interface, never run (Core ML predicts on macOS
    15+ only; tests/engines/glm_ocr/convert/test_layout_coreml.py's macOS test compares it with
    the torch model there)."""

    name = "coreml"

    def __init__(self, compiled, manifest: dict, compute_units: str):
        self.compiled = compiled
        self.manifest = manifest
        self.compute_units = compute_units

    @classmethod
    def load(cls, model_dir: str | os.PathLike, compute_units: str = "all") -> "CoreMLLayout":
        from engines.glm_ocr.runtime_coreml import check_platform, load_compiled

        model_dir = Path(model_dir)
        manifest = read_manifest(model_dir)
        try:
            check_platform()
        except EngineError as e:  # its advice (--runtime torch) is the OCR model's
            raise EngineError(str(e).split(";")[0]) from None
        try:
            compiled = load_compiled(model_dir, manifest["package"]["path"], "layout", compute_units)
        except Exception as exc:  # noqa: BLE001 -- Core ML's errors become one line
            raise EngineError(f"cannot load {model_dir / PACKAGE}: {str(exc).splitlines()[0]}") from exc
        return cls(compiled, manifest, compute_units)

    def outputs(self, pixel_values):
        """(1, 3, H, W) float32 pixels (torch) -> one page's three outputs, batch dimension
        dropped, as torch tensors (what layout.decode_detections takes)."""
        import torch

        expected = self.manifest["input"]["pixel_values"]["shape"]
        if list(pixel_values.shape) != expected:
            raise EngineError(f"the page's pixels are {list(pixel_values.shape)}; the Core ML layout model takes {expected}")
        out = self.compiled.predict({"pixel_values": np.ascontiguousarray(pixel_values.numpy(), dtype=np.float32)})
        return tuple(torch.from_numpy(np.asarray(out[name], dtype=np.float32)[0]) for name in OUTPUTS)
