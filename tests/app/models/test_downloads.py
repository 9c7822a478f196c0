"""Downloads through huggingface_hub from the loopback hub (tests/hub/server.py): listing,
progress, cancel mid-file, resume after a dropped connection, errors, verification, space,
locks and orphans. No mocks: a real HTTP server on 127.0.0.1 and huggingface_hub itself."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from app.models import catalog, download as dl, store
from engines.types import EngineError
from tests.hub.fixtures import hub, hub_env  # noqa: F401  (pytest fixtures)
from tests.hub.repos import MiB, make_big_repo, make_small_repo

CHUNK = 10 * MiB  # huggingface_hub's DOWNLOAD_CHUNK_SIZE: progress and cancel points


@pytest.fixture(scope="session")
def small_repo(tmp_path_factory):
    return make_small_repo(tmp_path_factory.mktemp("small") / "repo")


@pytest.fixture(scope="session")
def big_repo(tmp_path_factory):
    return make_big_repo(tmp_path_factory.mktemp("big") / "repo")


def same_bytes(a, b) -> bool:
    return a.read_bytes() == b.read_bytes()


def test_listing_takes_the_allowed_files_with_sizes_and_hashes(hub, hub_env, small_repo):
    hosted = hub.serve_repo("org/small", small_repo)
    plan = dl.plan(catalog.entry_for_repo("org/small"))
    assert plan.revision == hosted.sha
    names = {f.name: f for f in plan.files}
    assert set(names) == {"config.json", "generation_config.json", "tokenizer_config.json",
                          "chat_template.jinja", "model.safetensors"}
    assert names["model.safetensors"].size == (small_repo / "model.safetensors").stat().st_size
    assert names["model.safetensors"].sha256 == hosted.files["model.safetensors"].sha256
    assert names["config.json"].blob_id == hosted.files["config.json"].blob_id


def test_download_reports_progress_and_installs_a_verified_snapshot(hub, hub_env, big_repo):
    hub.serve_repo("org/big", big_repo)
    events: list[dl.DownloadProgress] = []
    path = dl.download("org/big", on_progress=events.append)
    assert path.name == hub.state.find("org/big").sha
    for name in ("config.json", "model.safetensors", "chat_template.jinja"):
        assert same_bytes(path / name, big_repo / name)
    assert not (path / "pytorch_model.bin").exists() and not (path / "modeling_custom.py").exists()
    total = sum((big_repo / n).stat().st_size for n in os.listdir(path))
    assert events[-1].bytes_done == events[-1].bytes_total == total
    assert events[-1].files_done == events[-1].files_total == 5
    done = [e.bytes_done for e in events]
    assert done == sorted(done), "progress never goes backwards"
    inside = [e for e in events if e.file == "model.safetensors" and e.rate_bytes_s > 0]
    assert len(inside) >= 3, "one event per 10 MiB chunk of the 21 MiB file, at least"
    assert all(e.eta_s is not None and e.eta_s >= 0 for e in inside)
    st = store.status(catalog.find("org/big"))  # an arbitrary repo id becomes a user entry
    assert st.installed and st.path == path and st.missing == []
    assert store.resolve("org/big", "chat") == path


def test_cancel_stops_inside_a_file_and_leaves_nothing_behind(hub, hub_env, big_repo):
    hub.serve_repo("org/big", big_repo)
    seen: list[dl.DownloadProgress] = []

    def cancel_inside_weights() -> bool:  # asked at every progress point
        return bool(seen) and seen[-1].file == "model.safetensors" and seen[-1].rate_bytes_s > 0

    with pytest.raises(dl.DownloadCancelled):
        dl.download("org/big", on_progress=seen.append, should_cancel=cancel_inside_weights)
    size = (big_repo / "model.safetensors").stat().st_size
    weights_start = [e.bytes_done for e in seen if e.file == "model.safetensors"][0]
    stopped_at = seen[-1].bytes_done - weights_start
    assert 0 < stopped_at < size, f"cancelled at {stopped_at} of {size} bytes: inside the file"
    assert store.incomplete_files("org/big") == []
    assert not store.status(catalog.entry_for_repo("org/big")).installed
    assert catalog.find("org/big") is None, "a cancelled download adds no entry"


def test_a_dropped_connection_resumes_with_a_range_request(hub, hub_env, big_repo):
    hub.serve_repo("org/big", big_repo)
    hub.cut_first_transfer("org/big", "model.safetensors", after=15 * MiB)
    path = dl.download("org/big")
    assert same_bytes(path / "model.safetensors", big_repo / "model.safetensors")
    ranges = [h.get("Range") or h.get("range") for _m, p, h in hub.requests_for("/cdn/") if _m == "GET"]
    assert f"bytes={CHUNK}-" in ranges, f"resumed from the last whole chunk; requests: {ranges}"


def test_an_unknown_repo_is_one_sentence(hub, hub_env):
    with pytest.raises(EngineError, match="nobody/nothing is not a model on the hub"):
        dl.download("nobody/nothing")
    with pytest.raises(EngineError, match="no such model"):
        dl.download("not a repo id")


def test_an_unknown_revision_is_one_sentence(hub, hub_env, small_repo):
    hub.serve_repo("org/small", small_repo)
    with pytest.raises(EngineError, match="has no revision 'v9'"):
        dl.download("org/small", revision="v9")


def test_a_gated_repo_needs_the_licence_and_a_token(hub, hub_env, small_repo, monkeypatch):
    hub.serve_repo("org/gated", small_repo, gated=True)
    with pytest.raises(EngineError) as e:
        dl.download("org/gated")
    message = str(e.value)
    assert "gated" in message and "accept its licence" in message and "hf auth login" in message
    assert "\n" not in message
    assert not store.status(catalog.entry_for_repo("org/gated")).installed
    monkeypatch.setenv("HF_TOKEN", hub_env.token)  # as after `hf auth login`, or HF_TOKEN set
    path = dl.download("org/gated")
    assert same_bytes(path / "model.safetensors", small_repo / "model.safetensors")
    # As on the hub, the weights came from the CDN origin, without the token.
    cdn = [h for m, _p, h in hub.requests_for("/cdn/") if m == "GET"]
    assert cdn and not any("authorization" in {k.lower() for k in h} for h in cdn)


def test_a_pinned_installed_model_is_not_fetched_again(hub, hub_env, small_repo):
    hosted = hub.serve_repo("org/small", small_repo)
    entry = catalog.CatalogEntry(id="org/small", title="small", role="chat", repo_id="org/small", revision=hosted.sha)
    first = dl.download(entry)
    before = len(hub.state.requests)
    assert dl.download(entry) == first
    assert len(hub.state.requests) == before, "no request: the pinned revision is installed and verified"
    dl.download("org/small")  # unpinned: one metadata request finds main at the installed commit
    assert [p for _m, p, _h in hub.state.requests[before:]] == ["/api/models/org/small?blobs=true"]


def test_content_that_does_not_match_the_etag_is_rejected_and_deleted(hub, hub_env, small_repo):
    hub.serve_repo("org/small", small_repo)
    hub.corrupt("org/small", "model.safetensors")
    with pytest.raises(EngineError, match="does not match the hub's checksum"):
        dl.download("org/small")
    blobs = store.repo_cache_dir("org/small") / "blobs"
    sha256 = hub.state.find("org/small").files["model.safetensors"].sha256
    assert not (blobs / sha256).exists(), "the bad blob is deleted"
    assert not store.status(catalog.entry_for_repo("org/small")).installed
    hub.state.corrupted.clear()
    path = dl.download("org/small")  # the next attempt fetches it again
    assert same_bytes(path / "model.safetensors", small_repo / "model.safetensors")


def test_a_non_lfs_file_is_checked_against_its_git_blob_id(hub, hub_env, small_repo):
    hub.serve_repo("org/small", small_repo)
    hub.corrupt("org/small", "config.json")
    with pytest.raises(EngineError, match="config.json: the content does not match"):
        dl.download("org/small")


def test_too_little_free_space_is_refused_before_any_transfer(hub, hub_env, big_repo, monkeypatch):
    hub.serve_repo("org/big", big_repo)
    # The free space is measured for real; the reserve a download must leave free is the
    # product's own setting (SPECSCOPE_MIN_FREE_BYTES), here set so that the 21 MiB do not fit.
    hub_env.models_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(hub_env.models_dir).free
    monkeypatch.setenv(dl.MIN_FREE_BYTES_ENV, str(free - 10 * MiB))
    with pytest.raises(EngineError, match="not enough disk space"):
        dl.download("org/big")
    assert hub.requests_for("/resolve/") == [], "refused before the first file request"
    assert not store.repo_cache_dir("org/big").exists()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 16 MiB filesystem (tmpfs), where mounting is allowed (root on Linux)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux; the reserve-threshold test covers the check elsewhere")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); the reserve-threshold test covers the check")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_download_larger_than_a_real_small_disk_is_refused(hub, hub_env, big_repo, small_tmpfs, monkeypatch):
    hub.serve_repo("org/big", big_repo)
    monkeypatch.setenv(store.MODELS_DIR_ENV, str(small_tmpfs / "models"))
    monkeypatch.setenv(dl.MIN_FREE_BYTES_ENV, "0")
    with pytest.raises(EngineError, match=r"not enough disk space: the download needs 22\.\d MB"):
        dl.download("org/big")
    assert hub.requests_for("/resolve/") == []


def test_a_second_download_of_the_same_model_is_refused_at_once(hub, hub_env, big_repo):
    hub.serve_repo("org/big", big_repo)
    hub.stall("org/big", "model.safetensors", after=1 * MiB)
    first: dict = {}
    worker = threading.Thread(target=lambda: first.setdefault("path", dl.download("org/big")), daemon=True)
    worker.start()
    _wait_for(lambda: store.incomplete_files("org/big"))  # the first is mid-file
    with pytest.raises(EngineError, match="already being downloaded"):
        dl.download("org/big")
    assert store.status(catalog.entry_for_repo("org/big")).downloading
    with pytest.raises(EngineError, match="being downloaded"):
        store.remove("org/big") if catalog.find("org/big") else _remove_entry("org/big")
    hub.release()
    worker.join(timeout=60)
    assert same_bytes(first["path"] / "model.safetensors", big_repo / "model.safetensors")


def _remove_entry(repo_id: str):
    catalog.add_user_entry(catalog.entry_for_repo(repo_id))
    return store.remove(repo_id)


def test_a_killed_download_leaves_no_orphan_and_the_next_get_succeeds(hub, hub_env, big_repo):
    hub.serve_repo("org/big", big_repo)
    hub.stall("org/big", "model.safetensors", after=12 * MiB)  # one 10 MiB chunk written, then hang
    child = subprocess.Popen(
        [sys.executable, "-c", "from app.models.download import download; download('org/big')"],
        env=hub_env.subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(f.stat().st_size >= CHUNK for f in store.incomplete_files("org/big")))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert store.incomplete_files("org/big"), "huggingface_hub leaves its partial file after a kill"
    st = store.status(catalog.entry_for_repo("org/big"))  # looking is enough to clean it up
    assert store.incomplete_files("org/big") == [] and not st.installed
    hub.release()
    path = dl.download("org/big")
    assert same_bytes(path / "model.safetensors", big_repo / "model.safetensors")


def _wait_for(condition, timeout: float = 60.0) -> None:
    """Poll for a state another thread or process reaches (not a timing assertion: the
    timeout only turns a hang into a failure)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def test_no_network_says_so_and_lists_what_is_installed(hub_env, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nobody listens on: connection refused, as offline
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")
    with pytest.raises(EngineError) as e:
        dl.download("glm-ocr")
    message = str(e.value)
    assert message.startswith(f"no network: cannot reach http://127.0.0.1:{closed}")
    assert "installed: smollm2-135m-instruct" in message  # the embedded model is still there
    assert not store.status(catalog.find("glm-ocr")).installed


def test_a_stored_login_is_used_for_a_gated_repo(hub, hub_env, small_repo):
    hub.serve_repo("org/gated", small_repo, gated=True)
    hub_env.hf_home.mkdir(parents=True, exist_ok=True)
    (hub_env.hf_home / "token").write_text(hub_env.token)  # what `hf auth login` stores
    path = dl.download("org/gated")
    assert same_bytes(path / "model.safetensors", small_repo / "model.safetensors")


def test_a_repo_with_only_pickled_weights_is_refused(hub, hub_env, tmp_path):
    folder = tmp_path / "pickles"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 a pickle")
    hub.serve_repo("org/pickles", folder)
    with pytest.raises(EngineError, match="no safetensors weights"):
        dl.download("org/pickles")
    assert hub.requests_for("/resolve/") == []


def test_a_pinned_catalog_entry_is_fetched_at_its_pin(hub, hub_env, small_repo):
    entry = catalog.find("glm-ocr")
    hosted = hub.serve_repo(entry.repo_id, small_repo)  # the loopback hub answers at the pin, as the hub does
    assert hosted.sha == entry.revision
    path = dl.download("glm-ocr")
    assert path.name == entry.revision and store.status(entry).revision == entry.revision
    assert all(f"/resolve/{entry.revision}/" in p for m, p, _h in hub.requests_for("/resolve/"))


def test_any_repo_id_is_remembered_for_what_it_is(hub, hub_env, tmp_path):
    import json

    folder = make_small_repo(tmp_path / "ocr-like")
    (folder / "config.json").write_text(json.dumps({"model_type": "glm_ocr"}))
    hub.serve_repo("someone/glm-ocr-finetune", folder)
    path = dl.download("someone/glm-ocr-finetune")
    entry = catalog.find("someone/glm-ocr-finetune")
    assert entry is not None and entry.user_added and entry.role == "ocr"
    assert store.resolve("someone/glm-ocr-finetune", "ocr") == path


def test_glm_ocrs_layout_model_comes_from_the_hub_with_its_preprocessing(hub, hub_env, tmp_path):
    """The catalog's PP-DocLayoutV3 entry, paired with GLM-OCR: a tiny checkpoint in the real
    format on the loopback hub under the published repo id, fetched by `download`, found by
    `paired_layout` and loaded by the layout stage."""
    pytest.importorskip("torch")
    from app.models.lookup import layout_for, paired_layout
    from engines.glm_ocr.layout import LayoutModel
    from tests.engines.glm_ocr.layout_checkpoints import make_tiny_layout

    entry = catalog.find("pp-doclayout-v3")
    assert entry.role == "layout" and catalog.pair_of(entry).id == "glm-ocr"
    assert catalog.pair_of(catalog.find("glm-ocr")).id == entry.id and layout_for("glm-ocr") == entry.id
    assert paired_layout("glm-ocr") is None  # not downloaded yet
    hub.serve_repo(entry.repo_id, make_tiny_layout(tmp_path / "layout"))
    path = dl.download(entry.id)
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= {p.name for p in path.iterdir()}
    assert store.resolve(entry.id, "layout") == path and catalog.role_of_dir(path) == "layout"
    assert paired_layout("glm-ocr") == str(path)
    model = LayoutModel.load(paired_layout("glm-ocr"))
    assert model.prep.height == 800 and model.id2label[22] == "text"
