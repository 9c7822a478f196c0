"""Getting a model from the window: app.models' download (and, for GLM-OCR and its layout model
on macOS, their Core ML conversion) on a worker QThread, reported as Qt signals (past-tense
events, as app.gui.worker's). Training a drafter for a chat model (DrafterJob: engines/training)
runs the same way.

`ModelJobs` is the window's one place for them: at most one job at a time, started from the
Models dialog or from a pane's "Download …" offer, watched by both. Cancel is cooperative:
app.models polls `should_cancel` at every progress point (every 10 MiB inside a file, between
files, between Core ML packages or the layout model's conversion steps) and leaves nothing
half-installed."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.models import catalog, store
from app.models.download import clock
from app.models.convert_job import ConversionCancelled, ConversionProgress, conversion_needed, convert
from app.models.download import DownloadCancelled, DownloadProgress, download
from engines.types import EngineError


@dataclass(frozen=True)
class JobProgress:
    """What the progress bar shows: one fraction of the current phase and one line of text."""

    model_id: str
    phase: str  # "download" | "convert"
    fraction: float
    text: str


def download_text(p: DownloadProgress) -> str:
    """`1.2 GB of 3.9 GB · 41.0 MB/s · ETA 01:06 · model.safetensors`"""
    return (f"{store.human_size(p.bytes_done)} of {store.human_size(p.bytes_total)} \u00b7 "
            f"{store.human_size(p.rate_bytes_s)}/s \u00b7 ETA {clock(p.eta_s)} \u00b7 {p.file}")


def conversion_text(p: ConversionProgress) -> str:
    """`Core ML: converting decoder (1 of 4 packages)`; a job of one package (the layout model)
    names its step instead: `Core ML: tracing the model (0 of 1 packages)`."""
    where = f"converting {p.package}" if p.package and p.packages_total > 1 else p.message
    return f"Core ML: {where} ({p.packages_done} of {p.packages_total} packages)"


class Job(QObject):
    """One model job on a worker thread, as ModelJobs runs it: the signals (past-tense events,
    `done` always last), the cooperative cancel flag, and run(), which turns the outcome of
    `work()` into those signals. A subclass writes `work()` -- it returns the local path to
    report, or None when it stopped at a cancel -- and names the exceptions that mean
    "cancelled" in `cancellations`."""

    progressed = Signal(object)  # JobProgress
    finished = Signal(str, str)  # model id, local path
    cancelled = Signal(str)  # model id
    errored = Signal(str, str)  # model id, one line for the user
    done = Signal()  # always last

    cancellations: tuple[type[BaseException], ...] = ()
    kind = "download"  # what the job does, for the views that watch it: "download" | "train" | "tune"

    def __init__(self, model_id: str):
        super().__init__()
        self.model_id = model_id
        self._cancel = False

    def request_cancel(self) -> None:
        """From the GUI thread: a plain flag, read at the next progress point."""
        self._cancel = True

    def cancel_requested(self) -> bool:
        return self._cancel

    def work(self) -> str | None:
        raise NotImplementedError

    @Slot()
    def run(self) -> None:
        try:
            path = self.work()
        except self.cancellations:
            self.cancelled.emit(self.model_id)
        except EngineError as e:
            self.errored.emit(self.model_id, str(e))
        except Exception as e:  # a bug must not take the window down
            traceback.print_exc()
            self.errored.emit(self.model_id, f"{type(e).__name__}: {e}")
        else:
            if path is None:
                self.cancelled.emit(self.model_id)
            else:
                self.finished.emit(self.model_id, path)
        finally:
            self.done.emit()

    def _progress(self, phase: str, fraction: float, text: str) -> None:
        self.progressed.emit(JobProgress(self.model_id, phase, fraction, text))


class ModelJob(Job):
    """Downloads one catalog entry (or hub repo id) and, where needed, converts it."""

    cancellations = (DownloadCancelled, ConversionCancelled)

    def work(self) -> str:
        entry = catalog.find(self.model_id)
        st = store.status(entry) if entry is not None else None
        if st is not None and st.installed and st.path is not None:
            path = st.path  # only its conversion is missing
        else:
            path = download(self.model_id, on_progress=self._downloaded, should_cancel=self.cancel_requested)
            entry = catalog.find(self.model_id)  # an arbitrary repo id is a user entry now
        if entry is not None and conversion_needed(entry):
            path = convert(entry, on_progress=self._converted, should_cancel=self.cancel_requested)
        return str(path)

    def _downloaded(self, p: DownloadProgress) -> None:
        self._progress("download", p.bytes_done / p.bytes_total if p.bytes_total else 0.0, download_text(p))

    def _converted(self, p: ConversionProgress) -> None:
        self._progress("convert", p.fraction, conversion_text(p))


def training_text(p) -> str:
    """`step 120 · 3.2 min · loss 2.41 · held-out acceptance d1 41% d2 18% … · ETA 11:48`"""
    if p.phase in ("prompts", "answers", "features"):
        return p.note
    acc = " ".join(f"d{i + 1} {a:.0%}" for i, a in enumerate(p.acceptance)) if p.acceptance else "not measured yet"
    eta = f" \u00b7 ETA {clock(p.eta_s)}" if p.eta_s is not None else ""
    return f"step {p.step} \u00b7 {p.elapsed_s / 60:.1f} min \u00b7 loss {p.loss:.2f} \u00b7 held-out acceptance {acc}{eta}"


class DrafterJob(Job):
    """Trains an MTP drafter for one chat model (engines/training, as `specscope drafter
    train`), then pairs it with the model in the user's catalog. Cancel stops at the next step
    with a checkpoint: training the same model again resumes. Same signals as ModelJob
    (`finished` with the drafter's directory)."""

    cancellations = (KeyboardInterrupt,)  # cancelled before the first step: nothing to resume
    kind = "train"

    def __init__(self, model_id: str, out: str, minutes: float | None = 15.0, **settings):
        super().__init__(model_id)
        self.out, self.minutes, self.settings = out, minutes, settings

    def work(self) -> str | None:
        from pathlib import Path

        from app.models.lookup import model_path, register_drafter
        from engines.mlx_chat.loading import load_model
        from engines.training.config import TrainConfig
        from engines.training.train import train

        target = model_path(self.model_id, "chat")
        loaded = load_model(target)
        config = TrainConfig(out=Path(self.out), minutes=self.minutes, **self.settings)
        result = train(loaded.model, loaded.tokenizer, target, config, self._trained, self.cancel_requested)
        if not result.finished:
            return None  # cancelled at a step, with a checkpoint to resume from
        register_drafter(self.model_id, Path(self.out))
        return str(self.out)

    def _trained(self, p) -> None:
        if p.steps:
            fraction = p.step / p.steps
        elif self.minutes:
            fraction = p.elapsed_s / (60 * self.minutes)
        else:
            fraction = 0.0
        self._progress("train", min(1.0, fraction), training_text(p))


class ModelJobs(QObject):
    """The window's model jobs: one at a time; its signals repeat the running job's."""

    started = Signal(str)  # model id
    progressed = Signal(object)  # JobProgress
    finished = Signal(str, str)  # model id, local path
    cancelled = Signal(str)
    errored = Signal(str, str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.job: Job | None = None
        self.thread: QThread | None = None
        self.threads: list[tuple[QThread, Job]] = []  # kept alive until each thread ends
        self.kind = "download"  # of the job running or last run: Job.kind

    @property
    def running_id(self) -> str | None:
        return self.job.model_id if self.job is not None else None

    def start(self, model_id: str, job: Job | None = None) -> bool:
        """Starts getting `model_id` (or `job`); False if another job runs (one at a time)."""
        if self.job is not None:
            return False
        job = job or ModelJob(model_id)
        self.kind = job.kind
        thread = QThread()
        thread.setObjectName("specscope-model-job")
        job.moveToThread(thread)
        thread.started.connect(job.run)
        # bound methods of this object (GUI thread), never lambdas: a lambda runs on the worker
        job.progressed.connect(self.progressed)
        job.finished.connect(self._on_finished)
        job.cancelled.connect(self._on_cancelled)
        job.errored.connect(self._on_errored)
        job.done.connect(thread.quit)
        thread.finished.connect(self._on_thread_finished)
        self.job, self.thread = job, thread
        self.threads.append((thread, job))
        thread.start()
        self.started.emit(model_id)
        return True

    def train_drafter(self, model_id: str, out: str | None = None, minutes: float | None = 15.0, **settings) -> bool:
        """Starts training a drafter for the chat model `model_id` (into the models folder's
        drafters/ unless `out`); False if another job runs."""
        out = out or str(store.models_dir() / "drafters" / store.safe_name(model_id))
        return self.start(model_id, DrafterJob(model_id, out, minutes, **settings))

    def cancel(self) -> None:
        if self.job is not None:
            self.job.request_cancel()

    def _on_finished(self, model_id: str, path: str) -> None:
        self.job = None
        self.finished.emit(model_id, path)

    def _on_cancelled(self, model_id: str) -> None:
        self.job = None
        self.cancelled.emit(model_id)

    def _on_errored(self, model_id: str, message: str) -> None:
        self.job = None
        self.errored.emit(model_id, message)

    def _on_thread_finished(self) -> None:
        self.threads = [(t, j) for t, j in self.threads if t.isRunning()]

    def shutdown(self, timeout_ms: int = 10000) -> None:
        """Cancels a job and joins its thread (threads must not outlive the window)."""
        self.cancel()
        for thread, _job in list(self.threads):
            thread.quit()
            thread.wait(timeout_ms)
        self.threads = []
