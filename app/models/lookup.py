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
    pair = (catalog.pair_of(entry, entries) or trained_drafter(entry, entries)) if entry else None
    if pair is None or pair.role != "drafter":
        return None
    store.resolve(target, "chat")  # a missing target is the first thing to say
    try:
        return str(store.resolve(pair.id, "drafter"))
    except EngineError as e:
        raise EngineError(f"--spec mtp on {entry.id} needs its assistant drafter; {e}") from None


def paired_layout(ocr_model: str) -> str | None:
    """The installed layout model paired with an OCR model (catalog id, repo id or its path):
    GLM-OCR's PP-DocLayoutV3. None when it has no pair or the pair is not downloaded."""
    entries = catalog.load_catalog()
    entry = catalog.find(ocr_model, entries) or store.entry_at(Path(ocr_model), entries)
    pair = catalog.pair_of(entry, entries) if entry else None
    if pair is None or pair.role != "layout":
        return None
    return str(store.resolve(pair.id, "layout")) if store.status(pair, entries).installed else None


def layout_for(ocr_model: str) -> str:
    """The catalog id of the layout model an OCR model pairs with (the default one when the OCR
    model is not in the catalog): what `specscope models get` needs."""
    entries = catalog.load_catalog()
    entry = catalog.find(ocr_model, entries) or store.entry_at(Path(ocr_model), entries)
    pair = catalog.pair_of(entry, entries) if entry else None
    return pair.id if pair is not None and pair.role == "layout" else "pp-doclayout-v3"


def trained_drafter(target: catalog.CatalogEntry, entries: list[catalog.CatalogEntry]) -> catalog.CatalogEntry | None:
    """The drafter the user trained for `target` (`specscope drafter train`), the last one
    registered: a user entry of role drafter whose pairs_with names the target."""
    found = [e for e in entries if e.user_added and e.role == "drafter" and e.pairs_with == target.id]
    return found[-1] if found else None


def register_drafter(target: str, drafter_dir: Path) -> catalog.CatalogEntry | None:
    """Pair a drafter trained here with its target in the user's catalog: the target's entry
    (added for a path the catalog does not know), and the drafter's, pairs_with the target.
    A built-in target that has a drafter of its own keeps it (None is returned)."""
    from dataclasses import replace

    entries = catalog.load_catalog()
    entry = catalog.find(target, entries) or store.entry_at(Path(target), entries)
    if entry is None:
        entry = catalog.add_user_entry(catalog.entry_for_path(target, "chat"))
    if entry.pairs_with:
        return None
    drafter = replace(catalog.entry_for_path(drafter_dir, "drafter"), id=f"drafter:{entry.id}",
                      title=f"Drafter for {entry.title} (trained here)", pairs_with=entry.id,
                      note="trained on this machine by `specscope drafter train`")
    return catalog.add_user_entry(drafter)
