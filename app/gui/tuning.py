"""Tune… in the window: the measurement `specscope tune` makes (engines/batch/tuning.measure:
the target's forward latency by width, then the acceptance by draft position on the
calibration set) for the chat model and method the sidebar shows, as a Job (app.gui.model_jobs)
on its own worker thread, with progress, cooperative cancel and a one-line error. The
measurement runs in the window's engine process (app.gui.engine_process), on the engine the
runs use: a crash in it is a message, and the model is loaded once for both. The profile it
writes (here, in the window's process) is the one the next Auto run reads (the same folder and
file name as the CLI's).

`Tuner` is the window's one place for it: the job (one at a time, on a ModelJobs runner of its
own so that the Models dialog does not show it as a download), the progress dialog, the offer
"no tuning profile ... [Tune…]" above the conversation when an Auto run starts without a usable
profile (the engine's first Round says why), and the profile a run's telemetry draws its
break-even line from."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from app.gui.model_jobs import Job, JobProgress, ModelJobs
from app.gui.views.notice import Notice
from app.gui.engine_process import EngineProcess, StopFlag, TuneProgressed
from app.settings import profiles_dir
from engines.types import Request, SpecConfig
from engines.profiles import Profile, ProfileError, profile_file

# Of the progress bar, where each stage starts: the latency passes (one sequence, then the batch
# sizes) are quick beside the calibration runs.
STAGE_STARTS = {"latency": 0.0, "batch": 0.15, "acceptance": 0.3}


def calibration_prompts() -> list[str]:
    """The CLI's default calibration set (resources/prompts/copy_heavy.json)."""
    import resources

    doc = json.loads(resources.path("prompts", "copy_heavy.json").read_text(encoding="utf-8"))
    return [p["prompt"] for p in doc["prompts"]]


@dataclass
class TuneSettings:
    """`specscope tune`'s defaults; tests make it smaller."""

    max_tokens: int = 256
    context: int = 256
    reps: int = 9
    prompts: list[str] = field(default_factory=list)  # empty: calibration_prompts()


class TuneJob(Job):
    """Measures one (model, method, drafter) and saves its profile; `finished` carries the
    profile's path. Loading the model is not interruptible; everything after it stops at the
    next forward pass or round, and a stopped run saves nothing (`work` returns None)."""

    kind = "tune"

    def __init__(self, label: str, engines: EngineProcess, model: str, options: dict, spec: SpecConfig,
                 settings: TuneSettings):
        super().__init__(label)
        self.engines, self.model, self.options, self.spec, self.settings = engines, model, options, spec, settings
        self.stop = StopFlag()

    def request_cancel(self) -> None:
        super().request_cancel()
        self.engines.request_stop(self.stop)

    def work(self) -> str | None:
        self._progress("load", 0.0, "loading the model\u2026")
        s = self.settings
        tuned = self.engines.tune(self.model, self.options, self.spec, s.prompts or calibration_prompts(),
                                  s.max_tokens, s.context, s.reps, self.stop, on_progress=self._measured)
        if tuned is None:
            return None  # cancelled: nothing measured is kept
        profile, model_path = tuned
        path = profile_file(profiles_dir(), model_path, self.spec.method, self.spec.draft_model or "")
        profile.save(path)
        return str(path)

    def _measured(self, p: TuneProgressed) -> None:
        start = STAGE_STARTS[p.stage]
        end = min([v for v in STAGE_STARTS.values() if v > start], default=1.0)
        self._progress(p.stage, start + (end - start) * p.done / max(p.total, 1), p.text)


def read_profile(path: str) -> Profile:
    """A profile just written (by whichever machine and model: it is shown, not used)."""
    return Profile.read(path)


def describe(profile: Profile) -> str:
    """One line: the best draft length here, what it is expected to gain, and its break-even."""
    from engines.speculative.tuning import best_k, break_even, rates

    latency = profile.latency().at
    k = best_k(latency, profile.draft_s, profile.acceptance, len(profile.acceptance))
    if k == 0:
        return "Speculation does not pay on this machine for this model and set: Auto decodes plainly until the run shows otherwise."
    expected = rates(latency, profile.draft_s, profile.acceptance, k)
    even = break_even(latency, profile.draft_s, k)
    line = f"Best here: {k} draft{'s' * (k > 1)} per round, {expected[k] / expected[0]:.2f}\u00d7 plain decoding expected"
    return line + (f"; below {100 * even:.0f}% acceptance per position it would lose." if even is not None else ".")


def profile_problem(note: str | None) -> str | None:
    """The first Round's note when it says the tuning profile was not used (the engine's
    ProfileError line, engines/speculative/schedule.DraftSchedule.of)."""
    return note if note and "tuning profile" in note else None


# What each ProfileError means, said without the CLI's wording (the whole note is the tooltip)
PROBLEMS = [("no tuning profile", "this model is not tuned on this machine yet"),
            ("unreadable", "its tuning profile is unreadable"),
            ("another machine", "its tuning profile is from another machine"),
            (" is for ", "its tuning profile is for another model")]


def offer_text(note: str) -> str:
    """One line: why Auto has no profile, and what it does instead (Tune… is the button)."""
    reason = next((said for key, said in PROBLEMS if key in note), "its tuning profile could not be used")
    return f"Auto: {reason} \u2014 this run measures its own costs."


class Tuner(QObject):
    started = Signal(str)  # what is being tuned ("model · method")
    progressed = Signal(object)  # JobProgress
    finished = Signal(str)  # the profile's path
    cancelled = Signal()
    errored = Signal(str)  # one line
    tune_requested = Signal()  # the offer's Tune… button

    def __init__(self, engines: EngineProcess, parent: QWidget | None = None):
        super().__init__(parent)
        self.engines = engines
        self.settings = TuneSettings()
        self.jobs = ModelJobs(self)
        self.jobs.progressed.connect(self.progressed)
        self.jobs.finished.connect(self._on_finished)
        self.jobs.cancelled.connect(self._on_cancelled)
        self.jobs.errored.connect(self._on_errored)
        self.dialog = None  # TuneDialog, made on the first Tune…
        self.offer = Notice()  # "Auto: no tuning profile … [Tune…] [Dismiss]", above the conversation
        self.offer.accepted.connect(self.tune_requested)
        self.parent_widget = parent

    @property
    def running(self) -> bool:
        return self.jobs.running_id is not None

    def show_dialog(self):
        """The progress dialog (not modal: the window stays usable while it measures)."""
        from app.gui.views.tune_dialog import TuneDialog

        if self.dialog is None:
            self.dialog = TuneDialog(self.parent_widget)
            self.dialog.cancel_requested.connect(self.cancel)
            self.progressed.connect(self.dialog.show_progress)
            self.cancelled.connect(self.dialog.show_cancelled)
            self.errored.connect(self.dialog.show_failed)
        self.dialog.show()
        self.dialog.raise_()
        return self.dialog

    def start(self, model: str, options: dict, spec: SpecConfig, label: str) -> bool:
        """Starts tuning `model` (a path or catalog id, "" = the embedded model) with `spec`'s
        method and drafter; False if a tuning job runs already (its dialog comes forward)."""
        dialog = self.show_dialog()
        if self.running:
            return False
        self.offer.hide()
        dialog.show_started(label)
        self.jobs.start(label, TuneJob(label, self.engines, model, options, spec, self.settings))
        self.started.emit(label)
        return True

    def tune(self, controls, running: bool, pick_drafter) -> bool:
        """Tune… for the sidebar's (ControlsPanel) chat model, method and drafter; with a run
        going on, OCR or a server's model, the dialog says why not. `pick_drafter`: the window's
        pairing of an MTP target with its assistant, so the key is the run's."""
        from engines.remote.engine import is_server_url

        c = controls
        if self.running:
            self.show_dialog()
            return False
        problem = ("Tune measures chat models: switch to Chat (OCR's Auto adapts the draft length to acceptance)"
                   if c.engine != "chat" else
                   "A run is going on: Tune\u2026 measures once it has ended" if running else
                   "A server's model is tuned where it runs (specscope tune there)" if is_server_url(c.model_path())
                   else None)
        if problem is not None:
            self.refuse(problem)
            return False
        request = Request(kind="chat", spec=c.tune_spec())
        pick_drafter(request)
        label = f"{c.model_combo.currentText()} \u00b7 {c.method_combo.currentText()}"
        return self.start(c.model_path(), c.engine_options(), request.spec, label)

    def refuse(self, message: str) -> None:
        """Tune… cannot run (OCR, a server's model, a run going on): the dialog says why."""
        if not self.running:
            self.show_dialog().show_failed(message)

    def cancel(self) -> None:
        self.jobs.cancel()

    def shutdown(self, timeout_ms: int = 10000) -> None:
        self.jobs.shutdown(timeout_ms)

    def _on_finished(self, _label: str, path: str) -> None:
        if self.dialog is not None:
            self.dialog.show_finished(path, describe(read_profile(path)))
        self.finished.emit(path)

    def _on_cancelled(self, _label: str) -> None:
        self.cancelled.emit()

    def _on_errored(self, _label: str, message: str) -> None:
        self.errored.emit(message)

    # --- the runs' side -------------------------------------------------------------------
    def round_shown(self, burst) -> None:
        """An Auto run that started without a usable profile: offer Tune… (not modal)."""
        note = profile_problem(burst.round.note)
        if note is not None:
            self.offer.offer(offer_text(note), "Tune\u2026")
            self.offer.label.setToolTip(note)

    def show_in(self, telemetry, session) -> None:
        """The telemetry of `session` (None: no run shown): its profile's break-even line and
        whether Auto chose its draft lengths."""
        spec = (session.request.get("spec") or {}) if session is not None else {}
        # OCR's Auto adapts to acceptance (its engine says so); only chat's chooses from costs
        auto = bool(spec.get("auto")) and session.request.get("kind") == "chat"
        profile = self.profile_of(session) if session is not None else None
        telemetry.set_tuning(profile, auto)
        if profile is not None and auto:
            self.offer.hide()  # an offer a profile has since answered

    @staticmethod
    def profile_of(session) -> Profile | None:
        """The profile this machine has for a session's chat model, method and drafter (what
        an Auto run of it reads), or None."""
        request, model = session.request, session.model
        spec = request.get("spec") or {}
        if request.get("kind") != "chat" or spec.get("method", "off") == "off" or not model.get("path"):
            return None
        drafter = spec.get("draft_model") or ""
        try:
            path = profile_file(profiles_dir(), model["path"], spec["method"], drafter)
            return Profile.load(path, model["path"], spec["method"], drafter)
        except ProfileError:
            return None
