"""Data files shipped with Specscope (prompts, presets, icons, styles): `resources.path(...)`."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent


def path(*parts: str) -> Path:
    return ROOT.joinpath(*parts)
