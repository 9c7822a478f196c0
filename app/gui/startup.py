"""`specscope` with no subcommand: the window. The lead's CLI (app/__main__.py) calls
add_gui_arguments(parser) and run_gui(args).

`--screenshot PATH` with `--ocr FILE...` or `--chat PROMPT` performs the run, then saves a
screenshot of the window and exits; it works offscreen (QT_QPA_PLATFORM=offscreen). The flags
are the CLI's words with the CLI's defaults (--spec, --steps, --temp, --max-tokens, ...).
Files given on the command line (`specscope page.png scan.pdf`) and files the system asks the
app to open (macOS: Open With, a drop on the Dock icon, as QFileOpenEvents) open in OCR mode, in
the order given.
Nothing heavy is imported here: engines load on the worker thread, pyqtgraph after the window
is first shown."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QTimer, Signal

from app import APP_ID, APP_NAME, __version__

RESOURCES = Path(__file__).resolve().parents[2] / "resources"
METHODS = ["off", "ngram", "draft", "mtp"]


def add_gui_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("window (when no subcommand is given)")
    g.add_argument("gui_files", nargs="*", metavar="FILE", help="documents to open for OCR, in this order")
    g.add_argument("--screenshot", dest="gui_screenshot", metavar="PATH",
                   help="perform the run given by --ocr or --chat, save a PNG of the window to PATH, exit")
    g.add_argument("--ocr", dest="gui_ocr", metavar="FILE", nargs="+",
                   help="open images / PDFs (their pages in order) and read them")
    g.add_argument("--chat", dest="gui_chat", metavar="PROMPT", help="send PROMPT to the chat engine")
    g.add_argument("--model", dest="gui_model", metavar="PATH",
                   help="model file or folder (default for chat: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--runtime", dest="gui_runtime", choices=["torch", "coreml", "coreml-twin"], help="OCR runtime")
    g.add_argument("--task", dest="gui_task", choices=["text", "table", "formula"], help="OCR task")
    g.add_argument("--spec", dest="gui_method", choices=METHODS,
                   help="speculation method (default: ngram for chat, mtp for OCR)")
    g.add_argument("--draft-model", dest="gui_draft_model", metavar="PATH", help="draft / assistant model")
    g.add_argument("--steps", dest="gui_steps", type=int, metavar="N",
                   help="drafts per round, 0-7 (0 = off; default per method as in the CLI: ngram 5, draft 3, mtp 2)")
    g.add_argument("--preset", dest="gui_preset", choices=["throughput", "lift", "balanced", "quality"])
    g.add_argument("--temp", dest="gui_temperature", type=float, metavar="T", help="sampling temperature (0 = greedy)")
    g.add_argument("--max-tokens", dest="gui_max_tokens", type=int, metavar="N", help="default 256")
    g.add_argument("--max-repeat", dest="gui_max_repeat", type=int, metavar="N",
                   help="stop when the output repeats one block N times in a row (default 4; 0 = off)")
    g.add_argument("--system", dest="gui_system", metavar="TEXT", help="chat system prompt")
    g.add_argument("--compare", dest="gui_compare", action="store_true",
                   help="run an A/B compare (speculation off, then on) instead of a single run")
    g.add_argument("--window-size", dest="gui_window_size", default=None, metavar="WxH",
                   help="window size (default: 1480x920, or the screen if smaller)")


def _arg(args, name: str, default=None):
    return getattr(args, "gui_" + name, default)


def apply_arguments(settings, args) -> None:
    """Command-line options override the remembered settings for this launch."""
    from engines.speculative.schedule import DEFAULT_STEPS, PRESETS

    if _arg(args, "ocr") or _arg(args, "files"):
        settings.engine = "ocr"
    elif _arg(args, "chat"):
        settings.engine = "chat"
    if _arg(args, "model"):
        if settings.engine == "ocr":
            settings.ocr_model = str(Path(_arg(args, "model")).expanduser())
        else:
            settings.chat_model = str(Path(_arg(args, "model")).expanduser())
    for name in ("runtime", "task", "draft_model", "temperature", "max_tokens", "max_repeat"):
        value = _arg(args, name)
        if value is not None:
            setattr(settings, {"runtime": "ocr_runtime"}.get(name, name), value)
    if _arg(args, "system") is not None:
        settings.system_prompt = _arg(args, "system")
    method = _arg(args, "method")
    if method == "off":  # as in the CLI: plain decoding is 0 drafts
        settings.steps, settings.preset = 0, None
    elif method:
        if settings.engine == "ocr":
            settings.ocr_method = method
        else:
            settings.chat_method = method
        settings.steps, settings.preset = DEFAULT_STEPS[method], None
    if _arg(args, "preset"):
        settings.preset = _arg(args, "preset")
        settings.steps = PRESETS[settings.preset].steps
    if _arg(args, "steps") is not None:
        settings.steps = _arg(args, "steps")
        settings.preset = None


def apply_style(app) -> None:
    from PySide6.QtGui import QFont, QFontDatabase, QIcon

    if sys.platform != "darwin" and "DejaVu Sans" in QFontDatabase.families():
        app.setFont(QFont("DejaVu Sans", 10))  # offscreen and bare Linux have no good default
    qss = RESOURCES / "style.qss"
    if qss.exists():
        app.setStyleSheet(qss.read_text(encoding="utf-8").replace("@RESOURCES@", RESOURCES.as_posix()))
    icon = RESOURCES / "icons" / "specscope.svg"
    if icon.exists():
        app.setWindowIcon(QIcon(str(icon)))


class FileOpenEvents(QObject):
    """The system's requests to open files, as one signal. macOS sends a QFileOpenEvent to the
    application per file (Open With, a drop on the Dock icon, a double-click in Finder once the
    app is the handler), also before the window exists; a burst of them is delivered together,
    in arrival order, on the next turn of the event loop. Install with
    app.installEventFilter(FileOpenEvents(app))."""

    files_opened = Signal(list)  # [path, ...]

    def __init__(self, app):
        super().__init__(app)
        self.app = app
        self.waiting: list[str] = []

    def eventFilter(self, watched, event) -> bool:
        if watched is self.app and event.type() == QEvent.Type.FileOpen:
            path = event.file()
            if path:
                if not self.waiting:
                    QTimer.singleShot(0, self._deliver)
                self.waiting.append(path)
            return True
        return False

    def _deliver(self) -> None:
        paths, self.waiting = self.waiting, []
        self.files_opened.emit(paths)


class FirstPaint(QObject):
    """SPECSCOPE_FIRST_PAINT_EXIT=1: prints the wall-clock time of the window's first paint as
    `first-paint SECONDS` and quits. bench/app_cold_start.py measures cold start with it, the
    same way from the venv and from the built app."""

    def __init__(self, app):
        super().__init__(app)
        self.app = app

    def eventFilter(self, watched, event) -> bool:
        if event.type() == QEvent.Type.Paint:
            print(f"first-paint {time.time():.6f}", flush=True)
            watched.removeEventFilter(self)
            QTimer.singleShot(0, self.app.quit)
        return False


class ScreenshotRun:
    """Runs what the arguments ask for once the window is up, then saves the window as PNG."""

    def __init__(self, window, app, path: Path, compare: bool, has_input: bool):
        self.window, self.app, self.path = window, app, path
        self.compare, self.has_input = compare, has_input
        self.exit_code = 0

    def start(self) -> None:
        if not self.has_input:
            self.shoot()
            return
        self.window.run_ended.connect(self._on_run_ended)
        if self.compare:
            self.window.compare_finished.connect(lambda _r: self.shoot())
            started = self.window.ab.start()
        else:
            started = self.window.run()
        if not started:
            self.exit_code = 1
            self.shoot()

    def _on_run_ended(self, outcome: str) -> None:
        if outcome != "finished":
            self.exit_code = 1
            self.shoot()
        elif not self.compare:
            self.shoot()

    def shoot(self) -> None:
        telemetry = self.window.ensure_telemetry()
        telemetry.refresh(force=True)
        QTimer.singleShot(150, self._save)  # let layouts and the last plot update settle

    def _save(self) -> None:
        self.window.ensure_telemetry().refresh(force=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.window.grab().save(str(self.path), "PNG"):
            print(f"specscope: cannot write {self.path}", file=sys.stderr)
            self.exit_code = 1
        else:
            print(f"specscope: screenshot saved to {self.path}")
        message = self.window.transcript.message_text
        if message:
            print(f"specscope: {message}", file=sys.stderr)
        self.app.exit(self.exit_code)


def run_gui(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from PySide6.QtWidgets import QApplication

    from app.gui.main_window import MainWindow
    from app.settings import load_settings

    missing = [f for f in _arg(args, "files") or [] if not Path(f).is_file()]
    if missing:
        print(f"specscope: error: no such file: {missing[0]}", file=sys.stderr)
        return 2
    app = QApplication.instance() or QApplication(sys.argv[:1])
    file_events = FileOpenEvents(app)
    app.installEventFilter(file_events)
    app.setApplicationName(APP_NAME)
    app.setApplicationVersion(__version__)
    app.setDesktopFileName(APP_ID)
    apply_style(app)

    screenshot = _arg(args, "screenshot")
    settings = load_settings()
    apply_arguments(settings, args)
    window = MainWindow(settings, persist=not screenshot, preload=True)
    if window.autosaving.message:  # e.g. a read-only data folder: the run goes on unsaved
        print(f"specscope: {window.autosaving.message}", file=sys.stderr)
    if _arg(args, "ocr"):
        unreadable = []
        window.document.load_failed.connect(unreadable.append)
        if not window.open_documents(_arg(args, "ocr")) or unreadable:
            print(f"specscope: error: {unreadable[0] if unreadable else 'cannot read ' + _arg(args, 'ocr')[0]}",
                  file=sys.stderr)
            return 2
    if _arg(args, "files"):
        window.open_documents(_arg(args, "files"))
    file_events.files_opened.connect(window.open_documents)
    if _arg(args, "chat"):
        window.chat.prompt.setPlainText(_arg(args, "chat"))
    if _arg(args, "window_size"):
        w, _, h = _arg(args, "window_size").partition("x")
        if not (w.isdigit() and h.isdigit()):
            print("specscope: error: --window-size takes WIDTHxHEIGHT, e.g. 1280x800", file=sys.stderr)
            return 2
        window.resize(int(w), int(h))
    if os.environ.get("SPECSCOPE_FIRST_PAINT_EXIT"):
        window.installEventFilter(FirstPaint(app))
    window.show()

    shot = None
    if screenshot:
        shot = ScreenshotRun(window, app, Path(screenshot), bool(_arg(args, "compare")),
                             bool(_arg(args, "ocr") or _arg(args, "chat")))
        QTimer.singleShot(0, lambda: (window.ensure_telemetry(), shot.start()))
    elif _arg(args, "ocr") or _arg(args, "chat"):
        QTimer.singleShot(0, window.ab.start if _arg(args, "compare") else window.run)
    code = app.exec()
    app.removeEventFilter(file_events)
    window.shutdown()
    return shot.exit_code if shot else code


def main(argv: list[str] | None = None) -> int:
    """`python -m app.gui.startup`: the window alone, for when the CLI is not at hand."""
    parser = argparse.ArgumentParser(prog="specscope")
    add_gui_arguments(parser)
    return run_gui(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
