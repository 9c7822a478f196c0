"""The models Specscope knows: `resources/catalog.json` plus the ones the user added.

The built-in list is data (one JSON file), so a new model is an edit there, not code. User
entries (a local mlx-lm directory, a GGUF file, any hub repo id fetched with `models get`) are
kept in `user_models.json` beside the downloads (`store.models_dir()`), so they survive
restarts and are isolated by SPECSCOPE_MODELS_DIR in tests.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from app.models.paths import models_dir, write_json_atomic
from engines.types import EngineError

Role = Literal["ocr", "chat", "drafter", "layout"]
Source = Literal["hub", "pypi", "local"]
ROLES: tuple[str, ...] = ("ocr", "chat", "drafter", "layout")

# What a hub download fetches unless an entry says otherwise: weights as safetensors (and
# their index), configs, tokenizer and chat-template files. Never pickles (*.bin, *.pt, *.pth,
# *.ckpt, *.pkl) and never code (*.py: Specscope never sets trust_remote_code).
DEFAULT_ALLOW_PATTERNS: tuple[str, ...] = (
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
)
# Refused even if an entry's own allow_patterns would match them.
DENY_PATTERNS: tuple[str, ...] = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle", "*.py", "*.msgpack", "*.h5")

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


@dataclass(frozen=True)
class CatalogEntry:
    """One model. `repo_id`/`revision` for hub models; `package` (a pip name) for the models that
    ship as PyPI packages; `path` for a user's local directory or GGUF file."""

    id: str
    title: str
    role: Role
    source: Source = "hub"
    repo_id: str | None = None
    # A commit sha where one was verified from published sources; None means "the branch head
    # at download time" and `note` says why it is not pinned.
    revision: str | None = None
    size_bytes: int | None = None  # approximate, from the model's published file list
    licence: str = ""
    gated: bool = False
    pairs_with: str | None = None  # a target's drafter or a drafter's target; GLM-OCR's layout model and back
    allow_patterns: tuple[str, ...] = DEFAULT_ALLOW_PATTERNS
    package: str | None = None
    path: str | None = None
    note: str = ""
    user_added: bool = False
    sources: tuple[str, ...] = field(default=(), compare=False)  # where the entry was verified

    def to_dict(self) -> dict:
        d = asdict(self)
        d["allow_patterns"] = list(self.allow_patterns)
        d["sources"] = list(self.sources)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CatalogEntry":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for key in ("allow_patterns", "sources"):
            if key in known:
                known[key] = tuple(known[key])
        entry = cls(**known)
        if entry.role not in ROLES:
            raise ValueError(f"{entry.id}: role must be one of {ROLES}, not {entry.role!r}")
        return entry


def builtin_catalog_path() -> Path:
    import resources

    return resources.path("catalog.json")


def user_catalog_path() -> Path:
    return models_dir() / "user_models.json"


def _read_entries(path: Path, user_added: bool) -> list[CatalogEntry]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise EngineError(f"cannot read the model list {path}: {e}") from None
    try:
        return [replace(CatalogEntry.from_dict(d), user_added=user_added) for d in data["models"]]
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(f"{path}: not a valid model list ({e})") from None


def load_catalog() -> list[CatalogEntry]:
    """The built-in entries, then the user's (a user entry never shadows a built-in id)."""
    builtin = _read_entries(builtin_catalog_path(), user_added=False)
    ids = {e.id for e in builtin}
    return builtin + [e for e in _read_entries(user_catalog_path(), user_added=True) if e.id not in ids]


def find(id_or_repo: str, catalog: list[CatalogEntry] | None = None) -> CatalogEntry | None:
    """By catalog id, or by hub repo id (case-insensitive, as the hub treats them)."""
    entries = load_catalog() if catalog is None else catalog
    for e in entries:
        if e.id == id_or_repo:
            return e
    wanted = id_or_repo.lower()
    for e in entries:
        if e.repo_id and e.repo_id.lower() == wanted:
            return e
    return None


def pair_of(entry: CatalogEntry, catalog: list[CatalogEntry] | None = None) -> CatalogEntry | None:
    return find(entry.pairs_with, catalog) if entry.pairs_with else None


def is_repo_id(text: str) -> bool:
    """`org/name` as the hub spells repo ids (and not an existing local path)."""
    return bool(REPO_ID.match(text)) and not os.path.exists(text)


def _save_user_entries(entries: list[CatalogEntry]) -> None:
    write_json_atomic(user_catalog_path(), {"models": [
        {k: v for k, v in e.to_dict().items() if k != "user_added"} for e in entries
    ]})


def add_user_entry(entry: CatalogEntry) -> CatalogEntry:
    """Persist `entry` (replacing a user entry of the same id). Built-in ids are refused."""
    if any(e.id == entry.id for e in _read_entries(builtin_catalog_path(), user_added=False)):
        raise EngineError(f"{entry.id} is a built-in catalog entry")
    entries = [e for e in _read_entries(user_catalog_path(), user_added=True) if e.id != entry.id]
    entry = replace(entry, user_added=True)
    _save_user_entries([*entries, entry])
    return entry


def remove_user_entry(entry_id: str) -> bool:
    entries = _read_entries(user_catalog_path(), user_added=True)
    kept = [e for e in entries if e.id != entry_id]
    if len(kept) == len(entries):
        return False
    _save_user_entries(kept)
    return True


def entry_for_repo(repo_id: str, role: Role = "chat") -> CatalogEntry:
    """A user entry for any hub repo id (the id is the repo id itself)."""
    return CatalogEntry(id=repo_id, title=repo_id, role=role, source="hub", repo_id=repo_id,
                        note="added by the user", user_added=True)


def entry_for_path(path: str | os.PathLike, role: Role | None = None) -> CatalogEntry:
    """A user entry for a local mlx-lm / HF directory or GGUF file; refuses what is not a model.
    The role is read from the directory when not given (GLM-OCR -> ocr, Gemma 4 assistant ->
    drafter, anything else -> chat)."""
    p = Path(path).expanduser().resolve()
    if p.is_file():
        if p.suffix.lower() != ".gguf" or not _has_gguf_magic(p):
            raise EngineError(f"not a model: {path} (expected a model directory or a .gguf file)")
        detected: Role = "chat"
    elif p.is_dir():
        detected = role_of_dir(p)
    else:
        raise EngineError(f"no such file or directory: {path}")
    return CatalogEntry(id=f"local:{p.name}", title=p.name, role=role or detected, source="local",
                        path=str(p), note="added by the user", user_added=True)


def _has_gguf_magic(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def role_of_dir(p: Path) -> Role:
    """What a model folder is for, from its files: a GLM-OCR checkpoint or Core ML conversion ->
    ocr, a Gemma 4 assistant or a drafter trained here -> drafter, a PP-DocLayoutV3 checkpoint
    or Core ML conversion -> layout, anything else -> chat. (A conversion carries its checkpoint's
    config.json.)"""
    try:
        cfg = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        if (p / "manifest.json").is_file():  # a GLM-OCR Core ML conversion written before configs were copied
            return "ocr"
        raise EngineError(f"not a model: {p} has no config.json (expected an mlx-lm / Hugging Face model directory)") from None
    except (OSError, ValueError) as e:
        raise EngineError(f"not a model: {p}/config.json is unreadable ({e})") from None
    model_type = cfg.get("model_type", "") if isinstance(cfg, dict) else ""
    if model_type in ("gemma4_assistant", "specscope_drafter"):  # specscope_drafter: `specscope drafter train`
        return "drafter"
    if model_type == "glm_ocr":
        return "ocr"
    if model_type == "pp_doclayout_v3":
        return "layout"
    return "chat"
