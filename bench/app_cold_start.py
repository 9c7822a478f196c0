"""Cold start of the window: wall time from spawning `specscope` (no arguments) to the window's
first paint, offscreen, from the venv (`python -m app`, the console script's code path, OpenBLAS
re-exec included) and from the built one-folder app (dist/Specscope/specscope, made by
scripts/package) side by side. Baseline in the same run: a bare PySide6 process painting an
empty QWidget, so the ratios say what Specscope adds on top of Qt itself.

The app reports its first paint itself (SPECSCOPE_FIRST_PAINT_EXIT=1, app/gui/startup.py FirstPaint), so
the venv and the bundle are timed the same way. Runs alternate (bare, venv, bundle) so a change
of machine load touches all three alike.

    python bench/app_cold_start.py [--runs 7] [--bundle dist/Specscope/specscope]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BUNDLE = ROOT / "dist" / "Specscope" / "specscope"

BARE_QT = """
import time
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QWidget
app = QApplication([])
class FirstPaint(QObject):
    def eventFilter(self, watched, event):
        if event.type() == QEvent.Type.Paint:
            print(f"first-paint {time.time():.6f}", flush=True)
            watched.removeEventFilter(self)
            QTimer.singleShot(0, app.quit)
        return False
w = QWidget(); w.resize(1480, 920)
w.installEventFilter(FirstPaint(w))
w.show()
app.exec()
"""


def first_paint_seconds(command: list[str], home: str) -> float:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", SPECSCOPE_HOME=home, SPECSCOPE_FIRST_PAINT_EXIT="1")
    t0 = time.time()
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    for line in out.stdout.splitlines():
        if line.startswith("first-paint "):
            return float(line.split()[1]) - t0
    raise RuntimeError(f"{command[0]} reported no first paint (exit {out.returncode}): {out.stderr[-2000:]}")


def summary(label: str, runs: list[float], baseline: float | None = None) -> str:
    median = statistics.median(runs)
    ratio = f"   {median / baseline:.2f}x bare Qt" if baseline else ""
    return f"{label:<28} median {median:.3f} s{ratio}   (runs: {', '.join(f'{x:.3f}' for x in runs)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE,
                        help="the built app's executable (default dist/Specscope/specscope)")
    args = parser.parse_args()
    commands = {"bare PySide6 QWidget": [sys.executable, "-c", BARE_QT],
                "specscope from the venv": [sys.executable, "-m", "app"]}
    if args.bundle.is_file():
        commands["specscope built one-folder"] = [str(args.bundle)]
    else:
        print(f"no built app at {args.bundle} (scripts/package makes it): venv only", file=sys.stderr)
    times: dict[str, list[float]] = {label: [] for label in commands}
    with tempfile.TemporaryDirectory() as home:
        for command in commands.values():  # warm the OS file cache once; every run is a new process
            first_paint_seconds(command, home)
        for _ in range(args.runs):
            for label, command in commands.items():
                times[label].append(first_paint_seconds(command, home))
    bare = statistics.median(times["bare PySide6 QWidget"])
    for label, runs in times.items():
        print(summary(label, runs, None if label.startswith("bare") else bare))
    venv = statistics.median(times["specscope from the venv"])
    print(f"goal: <= 1.5 s from the venv -> {'met' if venv <= 1.5 else 'NOT met'}")
    try:
        print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
