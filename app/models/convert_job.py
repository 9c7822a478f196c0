"""Core ML conversion as a job of the model manager (no Qt), for the catalog's models that run on
Core ML on macOS, by their role: GLM-OCR ("ocr": its packages, engines.glm_ocr.convert) and its
layout model PP-DocLayoutV3 ("layout": one package, engines.glm_ocr.layout_convert). The app
runs it after their download on macOS; elsewhere PyTorch runs the downloaded checkpoints
directly and nothing is converted (`conversion_needed` says which).

    convert(entry, on_progress=None, should_cancel=None) -> Path   blocking; run it on a worker
        converts into a staging folder next to `store.coreml_dir(entry)` with the role's
        converter, checks the manifest's parity reports, then moves the folder into place: a
        conversion is only ever "ready" (its manifest.json in coreml_dir, which is what
        `store.status` and `store.resolve` look for) once its parity was checked.
        on_progress(ConversionProgress) at every report of the converter; should_cancel() is
        asked at each of them (GLM-OCR: the start and end of each package; the layout model:
        each step of its one package -- coremltools cannot be interrupted inside a call) and
        raises ConversionCancelled, leaving nothing behind. A failure leaves nothing either.

Core ML prediction itself only runs on macOS; converting works on Linux too (the tests do).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.models import store
from app.models.store import CONVERTED_ROLES
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
    """On macOS a downloaded GLM-OCR is converted before OCR uses it (Core ML runtime), and its
    layout model before the layout stage runs on Core ML (until then it runs on PyTorch); on
    other systems PyTorch reads the checkpoints as downloaded."""
    return (sys.platform == "darwin" and entry.role in CONVERTED_ROLES and entry.source == "hub"
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
    """Every parity report must be within its tolerance: GLM-OCR's, one per package; the layout
    model's, one per output of its one package (the converters stop at the first that is not;
    this is checked again on the manifest that will be installed)."""
    from engines.glm_ocr.layout_coreml import MANIFEST_FORMAT as LAYOUT_FORMAT

    if manifest.get("format") == LAYOUT_FORMAT:
        reports = manifest.get("parity") or {}
        for output, parity in reports.items():
            if not parity.get("ok"):
                raise EngineError(f"the Core ML conversion's layout package failed its parity check on {output} "
                                  f"(max abs error {parity.get('max_abs_error')}); it is not used")
        if not reports:
            raise EngineError("the Core ML conversion of the layout model has no parity report")
        return
    for name, package in manifest.get("packages", {}).items():
        parity = package.get("parity") or {}
        if not parity.get("ok"):
            raise EngineError(f"the Core ML conversion's {name} package failed its parity check "
                              f"(max abs error {parity.get('max_abs_error')}); it is not used")
    if not manifest.get("packages"):
        raise EngineError("the Core ML conversion wrote no packages")


@dataclass(frozen=True)
class _Conversion:
    """What one role's conversion is: its packages, how it runs into a folder, and which of its
    reports start or end a package (`step`: message -> (package, ended) or None)."""

    packages: tuple[str, ...]
    run: Callable[[Path, Callable[[str, float], None]], dict]  # (folder, progress) -> manifest
    step: Callable[[str], tuple[str, bool] | None]


def _glm_ocr_conversion(source: Path, cache_length: int) -> _Conversion:
    """convert_glm_ocr's messages start "converting <package>" when a package starts and
    "<package>: max abs error" when its parity was measured."""
    from engines.glm_ocr.convert import convert_glm_ocr

    packages = packages_of(source)

    def step(message: str) -> tuple[str, bool] | None:
        for name in packages:
            if message.startswith(f"converting {name} "):
                return name, False
            if message.startswith(f"{name}: "):
                return name, True
        return None

    return _Conversion(packages, lambda out, progress: convert_glm_ocr(source, out, cache_length=cache_length,
                                                                       progress=progress), step)


def _layout_conversion(source: Path) -> _Conversion:
    """convert_layout writes one package: it is under way from its first report (loading the
    checkpoint) to its last ("done"), which comes after its parity check and coremltools."""
    from engines.glm_ocr.layout_convert import convert_layout

    return _Conversion(("layout",), lambda out, progress: convert_layout(source, out, progress=progress),
                       lambda message: ("layout", message == "done"))


class _Tracker:
    """A converter's (message, fraction) reports -> ConversionProgress, per package; asks
    should_cancel after each."""

    def __init__(self, conversion: _Conversion, on_progress: ProgressCallback | None,
                 should_cancel: Callable[[], bool] | None):
        self.conversion, self.on_progress, self.should_cancel = conversion, on_progress, should_cancel
        self.current: str | None = None
        self.done = 0

    def __call__(self, message: str, fraction: float) -> None:
        step = self.conversion.step(message)
        if step is not None:
            name, ended = step
            if ended:
                self.done += 1
                self.current = None
            else:
                self.current = name
        if self.on_progress is not None:
            total = len(self.conversion.packages)
            self.on_progress(ConversionProgress(self.current, self.done, total, fraction, message))
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
    """Convert an installed GLM-OCR or layout model (catalog entry or id) into its Core ML
    folder; return it. `cache_length` is GLM-OCR's KV cache length."""
    import filelock

    entry = find(entry_or_id) if isinstance(entry_or_id, str) else entry_or_id
    if entry is None or entry.role not in CONVERTED_ROLES:
        raise EngineError(f"{entry_or_id} is not an OCR or layout model in the catalog")
    source = store.resolve(entry.id, entry.role)
    if source == store.coreml_dir(entry):  # macOS resolves a converted model to its conversion
        source = store.status(entry).path
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
        conversion = (_layout_conversion(source) if entry.role == "layout"
                      else _glm_ocr_conversion(source, cache_length))
        tracker = _Tracker(conversion, on_progress, should_cancel)
        try:
            with store.lease(source):  # `models rm` refuses while the checkpoint is read
                manifest = conversion.run(staging, tracker)
            check_parity(manifest)
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)  # only now does coreml_dir hold a manifest: ready
        except ConversionCancelled:
            raise
        except EngineError as e:
            if entry.role == "layout":  # not a dead end: the checkpoint runs on PyTorch
                raise EngineError(f"{e}; the layout model runs on PyTorch instead") from e
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        lock.release()
    return final
