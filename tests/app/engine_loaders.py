"""Engine loaders for the window's engine process in tests (MainWindow(engine_loader=...)).

The loader runs in the engine process (app/gui/engine_process.py), so each one is a top-level
function of this module, which imports no Qt (the engine process must not load it). A fault or
a fixed price a test needs is set up there, where the engine runs, on the real components,
then the product's own loader loads the real engine (no mocks)."""

from __future__ import annotations

import sys

import pytest

from engines.factory import load_engine
from engines.types import EngineError

_patches = pytest.MonkeyPatch()  # the engine process's lifetime is the window's: never undone
_patched: set[str] = set()


def _once(name: str, patch) -> None:
    if name not in _patched:
        _patched.add(name)
        patch()


def load_refusing_qt(kind: str, path: str, **options):
    """The real loader, after checking that the engine process has not loaded Qt."""
    qt = sorted(m for m in sys.modules if m.split(".")[0] in ("PySide6", "shiboken6", "pyqtgraph"))
    if qt:
        raise EngineError(f"the engine process has loaded Qt: {', '.join(qt[:3])}")
    return load_engine(kind, path, **options)


def load_with_an_ngram_drafter_that_breaks(kind: str, path: str, **options):
    """The n-gram drafter raises on its third proposal in this process (tests/faults.py)."""
    from tests.faults import break_ngram_drafter_on_third_call

    _once("ngram", lambda: break_ngram_drafter_on_third_call(_patches))
    return load_engine(kind, path, **options)


def load_with_flat_compose_prices(kind: str, path: str, **options):
    """Composed drafting chooses its forms by acceptance alone (no clock): the same every run."""
    from engines.speculative import composed

    _once("compose", lambda: _patches.setattr(composed, "MEASURED", False))
    return load_engine(kind, path, **options)


def cheap(width: int) -> float:
    """A machine on which verifying 8 tokens costs little more than 1."""
    return 0.01 * (1 + 0.05 * width)


def load_with_cheap_rounds(kind: str, path: str, **options):
    """Auto's rounds cost what `cheap` says, whatever this machine's clock says: its choices
    then follow what the runs show at T=0, the same on every machine."""
    from engines.speculative.tuning import AutoSteps

    record = AutoSteps.record

    def priced(self, proposed, accepted, verify_s=None, draft_s=None, *rest):
        return record(self, proposed, accepted, cheap(1 + proposed), 0.0, *rest)

    _once("cheap", lambda: _patches.setattr(AutoSteps, "record", priced))
    return load_engine(kind, path, **options)


def load_dying_mid_page(kind: str, path: str, **options):
    """The engine process is killed (SIGKILL, as the OOM killer does) at a page's fifth batch
    step, while its regions are being read together."""
    import os
    import signal

    from engines.glm_ocr.batch import OcrBatch

    step = OcrBatch.step
    calls = []

    def dying(self):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return step(self)

    _once("dying", lambda: _patches.setattr(OcrBatch, "step", dying))
    return load_engine(kind, path, **options)


def load_with_a_stop_after_a_pages_last_step(kind: str, path: str, **options):
    """The window's Stop lands after every region of the first page has ended and before the
    page's end: there (the batch found empty, every region's events sent) the engine process
    waits, up to a minute, for the Stop the test asks for once it has seen each region end."""
    import time

    from engines.glm_ocr.batch import OcrBatch

    submit, busy = OcrBatch.submit, OcrBatch.busy
    waited: list[bool] = []

    def submitting(self, request, should_stop=None, **kwargs):
        self.stop_asked = should_stop
        return submit(self, request, should_stop, **kwargs)

    def waiting(self) -> bool:
        if busy.fget(self) or waited or getattr(self, "stop_asked", None) is None:
            return busy.fget(self)
        waited.append(True)
        deadline = time.monotonic() + 60
        while not self.stop_asked() and time.monotonic() < deadline:
            time.sleep(0.01)
        return False

    def patch() -> None:
        _patches.setattr(OcrBatch, "submit", submitting)
        _patches.setattr(OcrBatch, "busy", property(waiting))

    _once("late stop", patch)
    return load_engine(kind, path, **options)
