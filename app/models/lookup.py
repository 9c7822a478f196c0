"""From what a user typed (a catalog id, a hub repo id or a path) to the local paths the engines
load, and a chat target's paired drafter. The CLI and the GUI both use it."""

from __future__ import annotations

from pathlib import Path

from app.models import catalog, store
from engines.types import EngineError


def model_path(value: str | None, role) -> str | None:
    """`--model` / `--draft-model` values: a catalog id, a hub repo id or a path -> a path."""
    if value is None:
        return None
    return str(store.resolve(value, role))


def paired_drafter(target: str) -> str | None:
    """The installed drafter paired with a chat target (catalog id, repo id or its path), for
    `--spec mtp` without `--draft-model`. None when the target has no pair in the catalog."""
    entries = catalog.load_catalog()
    entry = catalog.find(target, entries) or store.entry_at(Path(target), entries)
    pair = catalog.pair_of(entry, entries) if entry else None
    if pair is None or pair.role != "drafter":
        return None
    store.resolve(target, "chat")  # a missing target is the first thing to say
    try:
        return str(store.resolve(pair.id, "drafter"))
    except EngineError as e:
        raise EngineError(f"--spec mtp on {entry.id} needs its assistant drafter; {e}") from None
