"""OCR in the window on the real GLM-OCR engine (torch runtime) with a tiny random checkpoint
in the real HF format: drop an image, run, compare with `specscope ocr` (the CLI) on the same
input, check the plots and the exports."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app.gui.main_window import MainWindow
from app.settings import AppSettings
from tests.app.conftest import Recorder

ROOT = Path(__file__).resolve().parents[3]


def drop_files(widget, paths):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    enter = QDragEnterEvent(pos.toPoint(), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    drop = QDropEvent(pos, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, drop)
    return drop.isAccepted()


def cli_ocr(model, image, steps, max_tokens):
    env = dict(os.environ, HF_HUB_OFFLINE="1", QT_QPA_PLATFORM="offscreen")
    out = subprocess.run(
        [sys.executable, "-m", "app", "ocr", str(image), "--model", str(model), "--runtime", "torch",
         "--spec", "mtp", "--steps", str(steps), "--max-tokens", str(max_tokens), "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_drop_two_images_read_both_in_order_and_match_the_cli(qtbot, tiny_ocr, tmp_path):
    model, images = tiny_ocr
    window = MainWindow(AppSettings(engine="chat", ocr_model=str(model), ocr_method="mtp", steps=2,
                                    preset=None, max_tokens=16), persist=False)
    qtbot.addWidget(window)
    window.show()
    window.ensure_telemetry()

    # dropping two images onto the window (in chat mode) switches to OCR and lists the pages
    assert drop_files(window, images)
    assert window.controls.engine == "ocr" and window.document.isVisible()
    assert window.document.page_images() == [str(p) for p in images]
    assert window.document.page_list.count() == 2 and window.document.page_list.isVisible()

    rec = Recorder(window)
    page_during_run = []
    window.round_shown.connect(lambda b: page_during_run.append(
        (b.round.index, window.document.current_image(), window.document.isVisible())))
    with qtbot.waitSignal(window.run_ended, timeout=240_000) as ended:
        assert window.run()
    assert ended.args == ["finished"]
    assert [r.page.image for r in window.ocr.results] == [str(p) for p in images]  # in order, one run each
    assert window.document.page_list.states == ["read" if r.session.finish == "stop" else r.session.finish
                                                for r in window.ocr.results]
    rounds = rec.rounds
    starts = [i for i, r in enumerate(rounds) if r.index == 0]
    assert len(starts) == 2  # round indices restart with each page
    first_page = rounds[: starts[1]]
    assert sum(len(r.tokens) for r in first_page) <= 16 and first_page[-1].finish in ("length", "stop")
    assert sum(r.proposed for r in rounds) > 0  # the MTP layer drafted
    # each page stayed in view while it was read
    shown = [image for _i, image, visible in page_during_run if visible]
    assert shown == [str(images[0])] * starts[1] + [str(images[1])] * (len(rounds) - starts[1])

    cli = cli_ocr(model, images[0], steps=2, max_tokens=16)
    assert window.ocr.results[0].session.tokens == cli["tokens"]
    assert window.ocr.results[0].session.text == cli["text"]

    # the plots hold the page read last; the exports are of that page's session
    window.telemetry.refresh(force=True)
    n = len(rounds) - starts[1]
    assert window.telemetry.point_counts() == {"drafted": n, "accepted": n, "speed": n}
    window.session_files.export("json", tmp_path / "ocr.json")
    window.session_files.export("csv", tmp_path / "ocr.csv")
    window.session_files.export("png", tmp_path / "ocr.png")
    doc = json.loads((tmp_path / "ocr.json").read_text())
    assert doc["request"]["image"] == str(images[1]) and doc["request"]["kind"] == "ocr"
    assert len(doc["rounds"]) == n and doc["model"]["hash"]
    assert len(list(csv.DictReader((tmp_path / "ocr.csv").open()))) == n
    assert (tmp_path / "ocr.png").read_bytes()[:4] == b"\x89PNG"
    window.shutdown()
