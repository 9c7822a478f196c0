"""Saved sessions and exports in the window: a past run reopened from its autosave file (File ›
Sessions…, a crashed run's Reopen) on the page it read; the shown run exported as JSON, CSV or
a PNG of the plots; the document as Markdown, plain text or per-page JSON, through the CLI's
formatter (app.records.documents.export_document). The files' formats are app/records'."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox

from app import APP_NAME
from app.gui.views.sessions_dialog import SessionsDialog
from app.records.documents import LayoutPage, PageResult, export_document
from app.records.sessions import (
    SavedSession, export_csv, export_json, export_png, export_text_file, input_label, load_session,
)
from app.settings import data_dir
from engines.types import EngineError


class SessionFiles(QObject):
    """What the window reads from and writes to files, for the File and Edit menus."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window

    # --- saved sessions -------------------------------------------------------------------
    def show_saved(self, saved: SavedSession) -> None:
        """Shows a past session (from its autosave file) in the panes."""
        if self.window.running:
            return
        self.window.ab.cancel()
        req = saved.session.request
        mode = "chat" if req.get("kind") == "chat" else "ocr"
        if self.window.mode != mode:  # a session shows where runs of its kind show
            self.window.controls.set_engine(mode)
        self._show_saved_page(saved)  # first: a page shown shows its own run, which the session replaces
        self.window.transcript.clear()
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(saved.session.started_at))
        if req.get("kind") == "chat":
            for turn in req.get("history", []):
                self.window.transcript.add_turn(turn.get("role", "user"), turn.get("content", ""))
            self.window.transcript.add_turn("user", req.get("prompt", ""))
            self.window.transcript.begin_response(f"Assistant \u00b7 session of {when}")
        else:
            self.window.transcript.begin_response(f"Session of {when} \u00b7 {input_label(req, saved.page)}")
        telemetry = self.window.ensure_telemetry()
        telemetry.clear()
        for burst in saved.bursts:
            self.window.transcript.append_burst(burst)
            telemetry.append(burst.round)
        telemetry.refresh(force=True)
        self.window.session, self.window.session_settings = saved.session, saved.settings
        outcome = saved.outcome or "interrupted (recovered from the autosave file)"
        self.window.status.setText(f"Session {saved.path.name}: {len(saved.bursts)} rounds, {outcome}")

    def _show_saved_page(self, saved: SavedSession) -> None:
        """The document page a saved OCR run read, shown: its file opened again (every page of a
        PDF) when it is not open. A file that names no page adds its image, unless that is a
        region's crop, which is no page of the document."""
        page, image = saved.page, saved.session.request.get("image")
        if page is None:
            if (image and Path(image).exists() and image not in self.window.document.page_images()
                    and not Path(image).is_relative_to(data_dir() / "regions")):
                self.window.document.add_files([image])
            return

        def index() -> int | None:
            return next((i for i, p in enumerate(self.window.document.pages)
                         if p.source == page.get("source") and p.number == page.get("number")), None)

        if index() is None and Path(str(page.get("source") or "")).exists():
            self.window.document.add_files([page["source"]])
        if index() is not None:
            self.window.document.show_page(index())

    def open_session(self, path: str | Path) -> SavedSession:
        saved = load_session(path)
        self.show_saved(saved)
        return saved

    def open_sessions_dialog(self) -> None:
        dialog = SessionsDialog(self.window)
        if dialog.exec() and dialog.chosen_path():
            self.open_session(dialog.chosen_path())

    def export(self, kind: str, path: str | Path) -> None:
        if self.window.session is None:
            raise EngineError("nothing to export yet: run something first")
        if kind == "json":
            export_json(self.window.session, path, self.window.session_settings)
        elif kind == "csv":
            export_csv(self.window.session, path)
        elif kind == "png":
            telemetry = self.window.ensure_telemetry()
            telemetry.refresh(force=True)
            export_png(telemetry, path)
        else:
            raise ValueError(kind)

    # --- text exports -------------------------------------------------------------------------
    def document_results(self) -> list[PageResult | LayoutPage]:
        """What the text exports hold: the pages read, whole or by region (OCR), or the last reply
        as one page (chat)."""
        return self.window.pane.document_results()

    def export_text(self, fmt: str) -> str:
        """The document as `specscope ocr --format` prints it (the same formatter)."""
        results = self.document_results()
        if not results:
            raise EngineError("nothing to export yet: run something first")
        return export_document(results, fmt)

    def copy_markdown(self) -> None:
        try:
            QApplication.clipboard().setText(self.export_text("md"))
        except EngineError as e:
            self.window.transcript.show_message(str(e), "info")

    def save_text(self, fmt: str, path: str | Path) -> None:
        export_text_file(self.export_text(fmt), path)

    def save_text_dialog(self, fmt: str) -> None:
        if not self.document_results():
            self.window.transcript.show_message("Nothing to save yet: run something first", "info")
            return
        names = {"md": "Markdown (*.md)", "txt": "Plain text (*.txt)", "json": "JSON (*.json)"}
        source = self.window.ocr.suggested_name() if self.window.mode == "ocr" else "specscope"
        suggested = f"{Path(source).stem}.{fmt}"
        path, _ = QFileDialog.getSaveFileName(self.window, "Save Text As", suggested, names[fmt])
        if path:
            try:
                self.save_text(fmt, path)
            except OSError as e:
                QMessageBox.warning(self.window, APP_NAME, f"Saving failed: {e}")

    def export_dialog(self, kind: str) -> None:
        if self.window.session is None:
            self.window.transcript.show_message("Nothing to export yet: run something first", "info")
            return
        name = f"specscope-session.{kind}"
        path, _ = QFileDialog.getSaveFileName(self.window, f"Export {kind.upper()}", name, f"{kind.upper()} (*.{kind})")
        if path:
            try:
                self.export(kind, path)
            except OSError as e:
                QMessageBox.warning(self.window, APP_NAME, f"Export failed: {e}")
