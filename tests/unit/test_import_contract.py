"""House rule: engines/ never imports Qt, and importing the engines package pulls in neither
Qt nor a model runtime (the GUI starts fast and engines stay headless)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QT_MODULES = {"PySide6", "PyQt5", "PyQt6", "pyqtgraph", "qtpy", "shiboken6"}


def test_no_engine_module_imports_qt():
    offenders = []
    for path in [*(ROOT / "engines").rglob("*.py"), *(ROOT / "app" / "models").rglob("*.py")]:  # both headless
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in QT_MODULES]
    assert offenders == []


def test_importing_engines_loads_no_qt_mlx_or_torch():
    code = (
        "import sys, engines, engines.speculative, engines.speculative.sampling\n"
        "heavy = {'PySide6', 'mlx', 'torch', 'transformers', 'coremltools'} & {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
