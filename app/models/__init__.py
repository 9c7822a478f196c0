"""The model manager (no Qt): what models Specscope knows, where they are, getting them.

The CLI (`specscope models ...`, `--model ID`) and the GUI's Models dialog both use this API;
the engines only ever see the local paths it returns.

Catalog (`app.models.catalog`)
    CatalogEntry        one model: id, title, role ("ocr" | "chat" | "drafter" | "layout"), source
                        ("hub" | "pypi" | "local"), repo_id, revision (a verified commit sha,
                        or None with the reason in `note`), size_bytes (approximate), licence,
                        gated, pairs_with (a target's drafter id / a drafter's target id;
                        GLM-OCR's layout model id and back),
                        allow_patterns, package (pip name), path (local), note, user_added
    load_catalog()      built-in entries (resources/catalog.json) + the user's own
    find(id_or_repo)    by catalog id or hub repo id -> CatalogEntry | None
    pair_of(entry)      the paired entry (Gemma 4 target <-> its assistant, GLM-OCR <->
                        PP-DocLayoutV3) or None
    entry_for_path(p)   a user entry for a local model dir / .gguf (EngineError if not a model)
    role_of_dir(p)      "ocr" | "drafter" | "layout" | "chat", read from a model folder's config
    add_user_entry(e), remove_user_entry(id)

Install state (`app.models.store`)
    models_dir()        SPECSCOPE_MODELS_DIR, else <platformdirs user data>/models
    status(entry)       -> ModelStatus(id, installed, path, size_on_disk, missing: list[str],
                        downloading, revision); `missing` holds sentences such as
                        "downloaded, not converted for Core ML" (macOS GLM-OCR and its
                        layout model) or
                        "its drafter ... is not downloaded"
    resolve(id_or_path, role) -> Path   catalog id, hub repo id (downloaded) or a path;
                        EngineError with the next step when it cannot
    remove(id) -> bytes freed   refused while in use or downloading
    lease(path)         context manager: marks a model in use (the GUI holds one while an
                        engine has the model loaded; CLI runs hold one)
    coreml_dir(entry)   where the Core ML conversion of `entry` (GLM-OCR, PP-DocLayoutV3) belongs

Downloads (`app.models.download`)
    download(entry_or_repo, revision=None, *, on_progress=None, should_cancel=None) -> Path
                        the snapshot directory; blocking (run it on a worker thread);
                        on_progress(DownloadProgress(file, bytes_done, bytes_total,
                        rate_bytes_s, eta_s, files_done, files_total)) is called from the
                        calling thread; should_cancel() is polled at every progress point
                        (once per 10 MiB chunk inside a file, and between files) and makes
                        the download raise DownloadCancelled (an EngineError)
    plan(entry, revision) -> DownloadPlan(repo_id, revision sha, files)   hub metadata only
    DownloadCancelled, EngineError: every failure is one sentence saying what to do
                        (gated -> accept the licence and log in; no network -> says so and
                        what is installed; unknown id; not enough disk space, before any
                        byte is written; a checksum mismatch -> the bad file is deleted)

Tests: `tests/hub/` has a loopback hub server: fixtures `hub` and `hub_env`
(tests/hub/fixtures.py), `hub.serve_repo(repo_id, folder, gated=False, revision=None)` (a
built-in catalog repo is served at its pinned commit), `cut_first_transfer`, `stall`/`release`,
`corrupt`; tiny repos in tests/hub/repos.py.
"""

from app.models.catalog import CatalogEntry, find, load_catalog, pair_of
from app.models.store import ModelStatus, models_dir, remove, resolve, status

__all__ = ["CatalogEntry", "ModelStatus", "find", "load_catalog", "models_dir", "pair_of", "remove", "resolve", "status"]
