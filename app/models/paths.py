"""Where the models folder is, and how its JSON files are written: the two things both the
catalog (the user's entries file) and the store (install records) need, so neither imports
the other for them."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

MODELS_DIR_ENV = "SPECSCOPE_MODELS_DIR"


def models_dir() -> Path:
    override = os.environ.get(MODELS_DIR_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    from app import APP_NAME

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)) / "models"


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a temp file in the same folder, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
