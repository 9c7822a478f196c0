"""Autosave and recovery in the window: whether runs are autosaved (the folder checked as the
window opens, and again as each run starts), the status bar's word and the message when they
are not or stop mid-run, and the offer to reopen a run a crash cut short. The files themselves
are app/records/sessions.py's; the workers write them (app/gui/worker.py, page_worker.py)."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QLabel

from app.gui.views.notice import Notice
from app.records.sessions import autosave_problem, crashed_sessions, mark_interrupted, new_autosave_path, sessions_dir


class Autosaving(QObject):
    """The window's autosave state. `label` (the status bar's) and `recovery` (the notice above
    the pane) are placed by the window; `show_failed` is a slot for the workers' autosave_failed,
    delivered on the GUI thread (this object lives there)."""

    def __init__(self, window, on: bool):
        super().__init__(window)
        self.window = window
        self.on = on
        self.message: str | None = None  # why runs are not (or no longer) being saved
        self.label = QLabel(objectName="muted")  # says when runs are not being saved
        self.recovery = Notice()  # offers a run a crash cut short

    def check_at_start(self) -> None:
        """At start: runs are autosaved only where they can be; a run a crash cut short is offered."""
        if not self.on:
            return
        problem = autosave_problem()
        if problem is not None:
            self.turn_off(f"Autosave is off: {problem}. Runs still work; File \u203a Export keeps one.")
            return
        crashed = crashed_sessions()
        if crashed:
            last = crashed[0]
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(last.started_at))
            self.recovery.offer(f"A {last.kind} run of {when} did not finish (the app quit mid-run); "
                                f"its {last.rounds} rounds were saved.", "Reopen")
            self.recovery.accepted.connect(lambda: self._answer_recovery(crashed, reopen=True))
            self.recovery.dismissed.connect(lambda: self._answer_recovery(crashed, reopen=False))

    def _answer_recovery(self, crashed: list, reopen: bool) -> None:
        for entry in crashed:  # offered once: the files get the "end" line their runs never wrote
            try:
                mark_interrupted(entry.path)
            except OSError:
                pass
        if reopen:
            self.window.session_files.open_session(crashed[0].path)

    def turn_off(self, message: str, show: bool = True) -> None:
        self.on = False
        self.message = message
        self.label.setText("Autosave off")
        self.label.setToolTip(message)
        if show:
            self.window.transcript.show_message(message, "warning")

    def path_for(self, kind: str) -> Path | None:
        """A new autosave file for a run of `kind`, or None when runs are not saved (and, when the
        folder failed just now, autosave turned off, said with the run)."""
        if not self.on:
            return None
        try:
            return new_autosave_path(kind)
        except OSError as e:  # the folder went away or became read-only since the start
            self.turn_off(f"Autosave is off: cannot write to {sessions_dir()} ({e.strerror or e}). "
                          f"This run goes on unsaved; File \u203a Export keeps it.", show=False)
            return None

    def show_failed(self, message: str) -> None:
        """The autosave stopped mid-run (full disk); the run goes on, and the window says so."""
        self.label.setText("Autosave stopped")
        self.label.setToolTip(message)
        self.message = f"Autosave stopped: {message}. The run goes on; File \u203a Export keeps it."
        self.window.transcript.show_message(self.message, "warning")
