"""Cold start of the window: wall time from spawning `specscope` (no arguments) to its first
window shown, offscreen. Baseline in the same run: a bare PySide6 process showing an empty
QWidget, so the ratio says what Specscope adds on top of Qt itself. Also reports which heavy
modules were imported by then (engines, mlx, torch and pyqtgraph must load lazily).

    python bench/app_cold_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ["torch", "mlx", "mlx_lm", "transformers", "pyqtgraph", "engines.mlx_chat", "engines.glm_ocr"]

# The real entry point (app.cli.main -> app.gui.run_gui), with a probe that reports the moment
# the main window has been shown and its first events processed, then quits.
SPECSCOPE = """
import json, os, sys, time
t0 = float(os.environ["COLD_T0"])
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
import app.main_window as mw
shown = mw.MainWindow.showEvent
def probe(self, event):
    def report():
        heavy = [m for m in %r if m in sys.modules]
        print(json.dumps({"seconds": time.time() - t0, "heavy": heavy}), flush=True)
        os._exit(0)
    QTimer.singleShot(0, report)  # queued before the window's own deferred work (the plots)
    shown(self, event)
mw.MainWindow.showEvent = probe
from app.cli import main
main([])
""" % (HEAVY,)

BARE_QT = """
import json, os, time
t0 = float(os.environ["COLD_T0"])
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QWidget
app = QApplication([])
w = QWidget(); w.resize(1480, 920); w.show()
def report():
    print(json.dumps({"seconds": time.time() - t0, "heavy": []}), flush=True)
    os._exit(0)
QTimer.singleShot(0, report)
app.exec()
"""


def spawn(code: str, home: str) -> dict:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", SPECSCOPE_HOME=home, COLD_T0=repr(time.time()))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        spawn(SPECSCOPE, home)  # warm the OS file cache once; every measured run is a new process
        bare, ours, heavy = [], [], set()
        for _ in range(args.runs):
            bare.append(spawn(BARE_QT, home)["seconds"])
            r = spawn(SPECSCOPE, home)
            ours.append(r["seconds"])
            heavy.update(r["heavy"])
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"bare PySide6 window shown:  median {b:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in bare)})")
    print(f"specscope window shown:     median {o:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in ours)})")
    print(f"ratio specscope / bare Qt:  {o / b:.2f}x   goal: <= 1.5 s -> {'met' if o <= 1.5 else 'NOT met'}")
    print(f"heavy modules imported before the window was shown: {sorted(heavy) or 'none'}")
    try:
        print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
