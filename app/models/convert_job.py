"""GLM-OCR's Core ML conversion as a job of the model manager (no Qt): run after a download on
macOS, where OCR runs on Core ML; elsewhere the torch runtime runs the downloaded checkpoint
directly and nothing is converted (`conversion_needed` says which).

    convert(entry, on_progress=None, should_cancel=None) -> Path   blocking; run it on a worker
        converts into a staging folder next to `store.coreml_dir(entry)` with
        engines.glm_ocr.convert.convert_glm_ocr, checks every package's parity report, then
        moves the folder into place: a conversion is only ever "ready" (its manifest.json in
        coreml_dir, which is what `store.status` looks for) once its parity was checked.
        on_progress(ConversionProgress) per package; should_cancel() is asked at every
        progress point (the start and end of each package: coremltools cannot be interrupted
        inside one) and raises ConversionCancelled, leaving nothing behind.

Core ML prediction itself only runs on macOS; converting works on Linux too (the tests do).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.models import store
from app.models.catalog import CatalogEntry, find
from engines.types import EngineError


class ConversionCancelled(EngineError):
    """The user cancelled; the staging folder is gone and nothing was marked ready."""


@dataclass(frozen=True)
class ConversionProgress:
    package: str | None  # the package being converted ("vision", ...), None before and after
    packages_done: int
    packages_total: int
    fraction: float  # of the whole job, 0..1
    message: str


ProgressCallback = Callable[[ConversionProgress], None]


def conversion_needed(entry: CatalogEntry) -> bool:
    """On macOS a downloaded GLM-OCR is converted before OCR uses it (Core ML runtime); on
    other systems the torch runtime reads the checkpoint as downloaded."""
    return (sys.platform == "darwin" and entry.role == "ocr" and entry.source == "hub"
            and not is_converted(entry))


def is_converted(entry: CatalogEntry) -> bool:
    return (store.coreml_dir(entry) / "manifest.json").is_file()


def ocr_model_dir(entry: CatalogEntry, downloaded: Path, runtime: str | None = None) -> Path:
    """What OCR runs: the Core ML conversion for the coreml runtime (and, runtime not given, on
    macOS once there is one), the download itself for the torch runtime."""
    if runtime == "coreml" or (runtime is None and sys.platform == "darwin"):
        if is_converted(entry):
            return store.coreml_dir(entry)
        if runtime == "coreml":
            raise EngineError(f"{entry.id} is not converted for Core ML yet: use Convert GLM-OCR for Core ML "
                              "above the text pane, or choose the PyTorch runtime")
    return downloaded


def check_parity(manifest: dict) -> None:
    """Every package's parity report must be within its tolerance (convert_glm_ocr stops at the
    first that is not; this is checked again on the manifest that will be installed)."""
    for name, package in manifest.get("packages", {}).items():
        parity = package.get("parity") or {}
        if not parity.get("ok"):
            raise EngineError(f"the Core ML conversion's {name} package failed its parity check "
                              f"(max abs error {parity.get('max_abs_error')}); it is not used")
    if not manifest.get("packages"):
        raise EngineError("the Core ML conversion wrote no packages")


class _Tracker:
    """convert_glm_ocr's (message, fraction) reports -> ConversionProgress, per package. Its
    messages start "converting <package>" when a package starts and "<package>: max abs error"
    when its parity was measured."""

    def __init__(self, packages: tuple[str, ...], on_progress: ProgressCallback | None,
                 should_cancel: Callable[[], bool] | None):
        self.packages, self.on_progress, self.should_cancel = packages, on_progress, should_cancel
        self.current: str | None = None
        self.done = 0

    def __call__(self, message: str, fraction: float) -> None:
        for name in self.packages:
            if message.startswith(f"converting {name} "):
                self.current = name
            elif message.startswith(f"{name}: "):
                self.done += 1
                self.current = None
        if self.on_progress is not None:
            self.on_progress(ConversionProgress(self.current, self.done, len(self.packages), fraction, message))
        if self.should_cancel is not None and self.should_cancel():  # after the report: a cancel
            raise ConversionCancelled("conversion cancelled; nothing was kept")  # asked meanwhile counts


def packages_of(source: Path) -> tuple[str, ...]:
    """The packages a conversion of `source` writes (mtp only with an MTP layer)."""
    from engines.glm_ocr.config import GlmOcrConfig
    from engines.glm_ocr.convert import PACKAGES

    has_mtp = GlmOcrConfig.load(source).text.num_nextn_predict_layers > 0
    return tuple(p for p in PACKAGES if p != "mtp" or has_mtp)


def convert(entry_or_id: CatalogEntry | str, *, on_progress: ProgressCallback | None = None,
            should_cancel: Callable[[], bool] | None = None, cache_length: int = 2048) -> Path:
    """Convert an installed GLM-OCR (catalog entry or id) into its Core ML folder; return it."""
    import filelock

    from engines.glm_ocr.convert import convert_glm_ocr

    entry = find(entry_or_id) if isinstance(entry_or_id, str) else entry_or_id
    if entry is None or entry.role != "ocr":
        raise EngineError(f"{entry_or_id} is not an OCR model in the catalog")
    source = store.resolve(entry.id, "ocr")
    final = store.coreml_dir(entry)
    staging = final.with_name(final.name + ".converting")
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(staging) + ".lock", timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise EngineError(f"{entry.id} is being converted already") from None
    try:
        shutil.rmtree(staging, ignore_errors=True)  # left by a conversion that crashed
        tracker = _Tracker(packages_of(source), on_progress, should_cancel)
        try:
            with store.lease(source):  # `models rm` refuses while the checkpoint is read
                manifest = convert_glm_ocr(source, staging, cache_length=cache_length, progress=tracker)
            check_parity(manifest)
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)  # only now does coreml_dir hold a manifest: ready
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        lock.release()
    return final
