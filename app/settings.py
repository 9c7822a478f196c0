"""What the window remembers across launches: one JSON file in the platformdirs config dir.

SPECSCOPE_HOME, when set, holds both config and data (tests and screenshot runs use it so they
never touch the user's own settings or sessions)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from app import APP_NAME


def config_dir() -> Path:
    home = os.environ.get("SPECSCOPE_HOME")
    if home:
        return Path(home) / "config"
    import platformdirs

    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    home = os.environ.get("SPECSCOPE_HOME")
    if home:
        return Path(home) / "data"
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def profiles_dir() -> Path:
    """Where `specscope tune` and the window's Tune… keep the tuning profiles that --steps auto
    (Auto in the window) reads: one per machine, model and drafter."""
    return data_dir() / "profiles"


@dataclass
class AppSettings:
    engine: str = "chat"  # "chat" | "ocr"
    chat_model: str = ""  # "" = the embedded default (SmolLM2-135M-Instruct)
    ocr_model: str = ""
    ocr_runtime: str = "torch"  # "coreml" on a Mac with converted packages
    draft_model: str = ""
    task: str = "text"  # OCR task: text | table | formula
    ocr_layout: str = "auto"  # "auto": pages read by region when the layout model is installed; "off": whole pages
    ocr_max_batch: int = 8  # a page's regions read together (`specscope ocr --max-batch`)
    chat_method: str = "ngram"
    ocr_method: str = "mtp"
    steps: int | None = None  # None: the method's default (engines.speculative.schedule.DEFAULT_STEPS)
    steps_auto: bool = False  # Auto: each round's draft length from this machine's costs (--steps auto)
    compose_ngram: bool = False  # with a model drafter: n-gram lookup beside it (--with-ngram)
    preset: str | None = None
    temperature: float = 0.0
    max_tokens: int = 256
    max_repeat: int = 4  # copies of a block that end a run (engines.speculative.repetition); 0 = off
    system_prompt: str = "You are a helpful, concise assistant."
    recent_models: list[str] = field(default_factory=list)
    window_geometry: str = ""  # base64 of QMainWindow.saveGeometry()
    window_state: str = ""  # base64 of the splitters' sizes

    @property
    def method(self) -> str:
        return self.ocr_method if self.engine == "ocr" else self.chat_method


def settings_path() -> Path:
    return config_dir() / "settings.json"


def load_settings(path: Path | None = None) -> AppSettings:
    """Unknown keys are dropped and missing ones take their defaults, so a settings file
    written by another version never stops the app from starting."""
    path = path or settings_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return AppSettings()
    if not isinstance(raw, dict):
        return AppSettings()
    names = {f.name for f in fields(AppSettings)}
    try:
        return AppSettings(**{k: v for k, v in raw.items() if k in names})
    except TypeError:
        return AppSettings()


def save_settings(settings: AppSettings, path: Path | None = None) -> None:
    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(settings), indent=1), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a crash mid-write never leaves half a settings file
