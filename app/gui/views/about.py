"""Help › About: what this build is made of (versions of the app, Qt, MLX, Core ML tools,
PyTorch) and the model in use; and where the README is."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QMessageBox, QWidget

from app import APP_NAME, __version__

README = Path(__file__).resolve().parents[3] / "README.md"


def package_version(name: str) -> str:
    """From the installed distribution's metadata: no import (MLX and torch take seconds)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def about_text(model: dict | None) -> str:
    from PySide6 import __version__ as pyside_version
    from PySide6.QtCore import qVersion

    coreml = package_version("coremltools")
    if sys.platform != "darwin":
        coreml += " (conversion only: Core ML prediction needs macOS)"
    lines = [
        f"<b>{APP_NAME} {__version__}</b>",
        f"MLX {package_version('mlx')} \u00b7 mlx-lm {package_version('mlx-lm')}",
        f"Core ML tools {coreml}",
        f"PyTorch {package_version('torch')} \u00b7 transformers {package_version('transformers')}",
        f"Qt {qVersion()} \u00b7 PySide6 {pyside_version} \u00b7 Python {platform.python_version()}",
    ]
    if model:
        name = model.get("name") or Path(str(model.get("path", ""))).name
        detail = " \u00b7 ".join(str(v) for v in (model.get("runtime"), model.get("hash")) if v)
        lines.append(f"Model: {name}" + (f" ({detail})" if detail else ""))
    else:
        lines.append("Model: none loaded yet")
    return "<br>".join(lines)


def readme_url() -> QUrl | None:
    """The README beside the code (a source checkout or an install that ships it)."""
    return QUrl.fromLocalFile(str(README)) if README.is_file() else None


def show_about(parent: QWidget, model: dict | None) -> None:
    QMessageBox.about(parent, f"About {APP_NAME}", about_text(model))


def open_readme(parent: QWidget) -> bool:
    url = readme_url()
    if url is None or not QDesktopServices.openUrl(url):
        QMessageBox.information(parent, APP_NAME, f"The README is not installed beside the app ({README}).")
        return False
    return True
