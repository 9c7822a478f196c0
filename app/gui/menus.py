"""The window's menu bar and its Models toolbar: every command the window has, with its shortcut.
The actions whose text or state follows the mode come back to the window (MenuActions)."""

from __future__ import annotations

from typing import NamedTuple

from PySide6.QtGui import QAction, QKeySequence

from app import APP_NAME


class MenuActions(NamedTuple):
    run: QAction  # "Send" in chat, "Read" in OCR
    stop: QAction
    clear: QAction  # chat only
    models: QAction


def build_menus(window) -> MenuActions:
    """`window` is the MainWindow; the actions call its public methods."""

    def action(menu, text, slot, shortcut=None):
        a = QAction(text, window)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
        a.triggered.connect(slot)
        menu.addAction(a)
        return a

    file = window.menuBar().addMenu("&File")
    action(file, "Open Images or PDFs\u2026", window.document.open_dialog, QKeySequence.StandardKey.Open)
    action(file, "Paste Image", window.paste, QKeySequence.StandardKey.Paste)
    file.addSeparator()
    action(file, "Sessions\u2026", window.session_files.open_sessions_dialog, "Ctrl+Shift+O")
    action(file, "Connect to Server\u2026", window.connect_to_server)
    text = file.addMenu("Save Text As")
    action(text, "Markdown\u2026", lambda: window.session_files.save_text_dialog("md"), "Ctrl+Shift+S")
    action(text, "Plain Text\u2026", lambda: window.session_files.save_text_dialog("txt"))
    action(text, "JSON (per page)\u2026", lambda: window.session_files.save_text_dialog("json"))
    export = file.addMenu("Export Session")
    action(export, "JSON\u2026", lambda: window.session_files.export_dialog("json"))
    action(export, "CSV\u2026", lambda: window.session_files.export_dialog("csv"))
    action(export, "PNG of the Plots\u2026", lambda: window.session_files.export_dialog("png"))
    file.addSeparator()
    action(file, "Quit", window.close, QKeySequence.StandardKey.Quit)
    edit = window.menuBar().addMenu("&Edit")
    action(edit, "Copy Output", lambda: window.transcript.copy_output(), "Ctrl+Shift+C")
    action(edit, "Copy as Markdown", window.session_files.copy_markdown, "Ctrl+Alt+C")
    edit.addSeparator()
    clear = action(edit, "Clear Conversation", window.clear_conversation, "Ctrl+L")
    view = window.menuBar().addMenu("&View")
    action(view, "Zoom In", lambda: window.document.view.zoom_by(1.25), QKeySequence.StandardKey.ZoomIn)
    action(view, "Zoom Out", lambda: window.document.view.zoom_by(0.8), QKeySequence.StandardKey.ZoomOut)
    action(view, "Fit Page", window.document.view.fit, "Ctrl+0")
    run = window.menuBar().addMenu("&Run")
    run_action = action(run, "Send", window.run, "Ctrl+R")
    stop = action(run, "Stop", window.stop, "Esc")
    action(run, "A/B Compare", window.ab.start, "Ctrl+Shift+R")
    run.addSeparator()
    action(run, "Tune Speculation\u2026", window.tune)
    models = window.menuBar().addMenu("&Models")
    models_action = action(models, "Models\u2026", window.open_models_dialog, "Ctrl+Shift+M")
    toolbar = window.addToolBar("Models")
    toolbar.setObjectName("modelsToolbar")
    toolbar.setMovable(False)
    toolbar.addAction(models_action)
    help_menu = window.menuBar().addMenu("&Help")
    action(help_menu, f"About {APP_NAME}", window.show_about)
    action(help_menu, "README", window.open_readme)
    return MenuActions(run_action, stop, clear, models_action)
