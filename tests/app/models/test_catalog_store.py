"""The catalog and install state, without a network: what is listed, resolved, refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.models import catalog, store
from engines.types import EngineError


@pytest.fixture(autouse=True)
def models_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(store.MODELS_DIR_ENV, str(tmp_path / "models"))
    return tmp_path / "models"


def test_builtin_catalog_pairs_point_at_real_entries():
    entries = catalog.load_catalog()
    ids = {e.id for e in entries}
    assert "glm-ocr" in ids and catalog.find("zai-org/GLM-OCR").id == "glm-ocr"
    for e in entries:
        if e.pairs_with:
            pair = catalog.pair_of(e, entries)
            assert pair is not None, e.id
            assert pair.pairs_with == e.id, f"{e.id} <-> {pair.id} is not mutual"
            assert {e.role, pair.role} in ({"chat", "drafter"}, {"ocr", "layout"})
        if e.source == "hub":
            assert catalog.REPO_ID.match(e.repo_id), e.id
            assert e.revision is not None or "npinned" in e.note, f"{e.id}: unpinned without saying why"


def test_allow_list_never_admits_pickles_or_code():
    from app.models.download import allowed

    patterns = catalog.DEFAULT_ALLOW_PATTERNS
    assert allowed("model-00001-of-00002.safetensors", patterns)
    assert allowed("model.safetensors.index.json", patterns)
    assert allowed("chat_template.jinja", patterns)
    for bad in ("pytorch_model.bin", "model.pt", "modeling_glm.py", "optimizer.pkl", "README.md", "sub/x.bin"):
        assert not allowed(bad, patterns), bad
    assert not allowed("weights.bin", ("*",)), "the deny list wins over an entry's own patterns"


def test_unknown_id_and_non_model_path_are_one_sentence(tmp_path):
    with pytest.raises(EngineError, match="no such model"):
        store.resolve("not-a-model", "chat")
    with pytest.raises(EngineError, match="specscope models get someone/thing"):
        store.resolve("someone/thing", "chat")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(EngineError, match="not a model"):
        store.resolve(str(tmp_path / "notes.txt"), "chat")
    (tmp_path / "fake.gguf").write_bytes(b"not gguf at all")
    with pytest.raises(EngineError, match="not a model"):
        catalog.entry_for_path(tmp_path / "fake.gguf")
    from engines.mlx_chat.models import default_chat_model

    real = catalog.entry_for_path(default_chat_model())  # the embedded SmolLM2 GGUF
    assert real.role == "chat" and real.source == "local" and real.id.endswith(".gguf")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EngineError, match="no config.json"):
        store.resolve(str(empty), "chat")


def test_a_role_mismatch_is_refused():
    with pytest.raises(EngineError, match="glm-ocr is a model for ocr, not for chat"):
        store.resolve("glm-ocr", "chat")


def test_hub_model_is_installed_only_with_a_complete_record(models_dir):
    entry = catalog.find("glm-ocr")
    snapshot = store.repo_cache_dir(entry.repo_id) / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert not store.status(entry).installed  # files on disk, no record: a download that did not finish
    assert "not finished" in store.status(entry).missing[0]
    record = store.InstallRecord(entry.repo_id, "a" * 40, {"config.json": 2, "model.safetensors": 10})
    store.write_record(record)
    assert not store.status(entry).installed  # the record names a file that is not there
    (snapshot / "model.safetensors").write_bytes(b"0" * 10)
    st = store.status(entry)
    assert st.installed and st.path == snapshot and st.revision == "a" * 40
    assert store.resolve("zai-org/GLM-OCR", "ocr") == snapshot


def test_user_entries_persist_and_never_shadow_builtins(tmp_path):
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gemma4_assistant"}))
    entry = catalog.add_user_entry(catalog.entry_for_path(model))
    assert entry.role == "drafter"
    again = catalog.find(entry.id)
    assert again is not None and again.user_added and again.path == str(model.resolve())
    assert store.status(again).installed
    with pytest.raises(EngineError, match="built-in"):
        catalog.add_user_entry(catalog.CatalogEntry(id="glm-ocr", title="x", role="ocr"))
    assert store.remove(entry.id) == 0  # forgets the entry ...
    assert model.is_dir()  # ... never deletes the user's own files
    assert catalog.find(entry.id) is None


def test_remove_refuses_while_another_process_uses_the_model(models_dir, tmp_path):
    entry = catalog.find("glm-ocr")
    snapshot = store.repo_cache_dir(entry.repo_id) / "snapshots" / ("b" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    store.write_record(store.InstallRecord(entry.repo_id, "b" * 40, {"config.json": 2}))
    # A real second process holds a lease, as a running `specscope ocr` would.
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from app.models import store\n"
         f"with store.lease({str(snapshot)!r}):\n"
         "    print('held', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**__import__('os').environ, store.MODELS_DIR_ENV: str(models_dir)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(EngineError, match=f"in use by process {holder.pid}"):
            store.remove("glm-ocr")
        assert store.status(entry).installed
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=30)
    assert store.remove("glm-ocr") > 0  # lease released: removal goes ahead
    assert not store.status(entry).installed and not store.repo_cache_dir(entry.repo_id).exists()


def test_a_dead_process_lease_does_not_block_removal(models_dir):
    entry = catalog.find("glm-ocr")
    snapshot = store.repo_cache_dir(entry.repo_id) / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    store.write_record(store.InstallRecord(entry.repo_id, "c" * 40, {"config.json": 2}))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leases = models_dir / "leases"
    leases.mkdir(parents=True)
    (leases / f"{store._lease_key(snapshot)}.{int(dead.stdout)}.0").write_text(str(snapshot))
    assert store.users_of(snapshot) == []
    assert store.remove("glm-ocr") > 0


def test_on_macos_glm_ocr_waits_for_its_core_ml_conversion(models_dir, monkeypatch):
    """The macOS rule, checked as logic here (Core ML itself runs only on a Mac): a downloaded
    GLM-OCR is missing its conversion until one is in place, then resolves to it."""
    entry = catalog.find("glm-ocr")
    snapshot = store.repo_cache_dir(entry.repo_id) / "snapshots" / ("d" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    store.write_record(store.InstallRecord(entry.repo_id, "d" * 40, {"config.json": 2}))
    monkeypatch.setattr(sys, "platform", "darwin")
    assert store.status(entry).missing == ["downloaded, not converted for Core ML"]
    assert store.resolve("glm-ocr", "ocr") == snapshot  # the torch runtime can still read it
    converted = store.coreml_dir(entry)
    converted.mkdir(parents=True)
    (converted / "manifest.json").write_text("{}")
    assert store.status(entry).missing == []
    assert store.resolve("glm-ocr", "ocr") == converted
    monkeypatch.setattr(sys, "platform", "linux")
    assert store.resolve("glm-ocr", "ocr") == snapshot, "elsewhere the checkpoint runs on torch"
