"""Documents opened from outside the window: the QFileOpenEvents macOS sends for Open With and a
drop on the Dock icon (posted here to the application, as the system would), and file names on
the command line. Either way they land in OCR mode, in the order given. Finder actually sending
the events is only seen on a Mac."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from PySide6.QtGui import QFileOpenEvent
from PySide6.QtWidgets import QApplication

from app.gui.startup import FileOpenEvents
from app.gui.main_window import MainWindow
from app.settings import AppSettings

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def pages(tmp_path):
    """Three pages in distinct solid colours, so a screenshot tells which one is shown."""
    paths = []
    for name, colour in (("red", (220, 20, 20)), ("green", (20, 200, 20)), ("blue", (20, 20, 220))):
        paths.append(tmp_path / f"{name}.png")
        Image.new("RGB", (300, 400), colour).save(paths[-1])
    return [str(p) for p in paths]


@pytest.fixture
def window(qtbot, qapp):
    w = MainWindow(AppSettings(engine="chat"), persist=False)
    qtbot.addWidget(w)
    w.show()
    events = FileOpenEvents(qapp)
    qapp.installEventFilter(events)
    events.files_opened.connect(w.open_documents)
    yield w, events
    qapp.removeEventFilter(events)
    w.shutdown()


def test_file_open_events_land_in_ocr_mode_in_order(qtbot, qapp, window, pages):
    w, events = window
    assert w.controls.engine == "chat"
    with qtbot.waitSignal(events.files_opened, timeout=30_000) as opened:
        for path in pages:  # one event per file, as macOS sends them
            QApplication.postEvent(qapp, QFileOpenEvent(path))
    assert opened.args == [pages]  # delivered together, in arrival order
    assert w.controls.engine == "ocr" and w.document.isVisible()
    assert w.document.page_images() == pages
    assert w.document.current_image() == pages[0]
    assert w.transcript.message_text == ""

    # a later event adds to the document, after what is there
    more = str(Path(pages[0]).with_name("again.png"))
    Image.new("RGB", (50, 50), (0, 0, 0)).save(more)
    with qtbot.waitSignal(events.files_opened, timeout=30_000):
        QApplication.postEvent(qapp, QFileOpenEvent(more))
    assert w.document.page_images() == pages + [more]


def test_a_file_that_is_not_an_image_says_so(qtbot, qapp, window, pages, tmp_path):
    w, events = window
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    with qtbot.waitSignal(events.files_opened, timeout=30_000):
        QApplication.postEvent(qapp, QFileOpenEvent(str(notes)))
        QApplication.postEvent(qapp, QFileOpenEvent(pages[1]))
    assert w.document.page_images() == [pages[1]]
    assert "notes.txt" in w.transcript.message_text


def test_only_the_application_s_file_open_events_are_taken(qapp, window, pages):
    w, events = window
    received = []
    events.files_opened.connect(received.append)
    # the same event type sent to a widget is not the system's open request: left alone
    assert not events.eventFilter(w, QFileOpenEvent(pages[0]))
    QApplication.processEvents()
    assert received == [] and w.document.pages == []


def run_app(args, home, timeout=120):
    env = dict(os.environ, SPECSCOPE_HOME=str(home), QT_QPA_PLATFORM="offscreen")
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_command_line_files_open_in_ocr_mode(tmp_path, pages):
    """`specscope green.png blue.png`: the window opens on the first of them, in OCR mode."""
    shot = tmp_path / "shot.png"
    out = run_app(["--screenshot", str(shot), pages[1], pages[2]], tmp_path / "home")
    assert out.returncode == 0, out.stderr[-2000:]
    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    count = {c: n for n, c in colours}
    green, blue = count.get((20, 200, 20), 0), count.get((20, 20, 220), 0)
    assert green > 10_000 and blue == 0  # the first file is the page shown


def test_command_line_file_that_does_not_exist(tmp_path, pages):
    out = run_app([pages[0], str(tmp_path / "missing.png")], tmp_path / "home")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"specscope: error: no such file: {tmp_path / 'missing.png'}"]
