"""A loopback HTTP server that answers as the Hugging Face Hub does, for huggingface_hub itself.

It serves folders on disk as model repositories, with the endpoints and headers that
huggingface_hub 2.4 uses (reference/huggingface-hub-notes.md):

    GET  /api/models/<org>/<name>[/revision/<rev>][?blobs=true] model info (sha, siblings,
                                                                 gated; sizes/lfs with blobs)
    GET  /api/models/<org>/<name>/tree/<rev>?recursive=true      the file list
    HEAD|GET /<org>/<name>/resolve/<rev>/<path>                  the file: X-Repo-Commit, ETag,
         X-Linked-Etag / X-Linked-Size (LFS), Range -> 206; LFS files answer 302 to a "CDN"
         URL on another origin (localhost instead of 127.0.0.1), as the hub redirects to its
         CDN, so the client drops Authorization on the way, as it does for real
    GET  /cdn/<sha256>                                           the LFS bytes, Range -> 206

Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo). A gated
repo answers its metadata without a token and its files only with `Authorization: Bearer
<TOKEN>`, as the hub does for a user who accepted the licence.

Switches for failure tests: `cut_first_transfer(repo, path, after=N)` closes the connection
after N bytes of the next GET of that file (huggingface_hub then retries, with a Range request
from the last 10 MiB chunk it wrote); `stall(repo, path, after=N)` sends N bytes and hangs
until `release()` (a download caught mid-file); `corrupt(repo, path)` serves altered bytes
under the right ETag and size. `requests` records
(method, path, headers) of every request.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "hf_loopbacktesttoken"
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".model")
LFS_MIN_SIZE = 1 << 20  # larger files go to LFS whatever their suffix, as on the hub


@dataclass(frozen=True)
class HostedFile:
    path: str  # in the repo
    local: Path
    size: int
    blob_id: str  # git blob sha1
    sha256: str | None  # LFS only

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id


@dataclass
class HostedRepo:
    repo_id: str
    folder: Path
    sha: str
    files: dict[str, HostedFile]
    gated: bool = False


def _hash_file(path: Path) -> tuple[str, str]:
    sha1 = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    sha256 = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha1.update(chunk)
            sha256.update(chunk)
    return sha1.hexdigest(), sha256.hexdigest()


def host_folder(repo_id: str, folder: Path, gated: bool = False, revision: str | None = None) -> HostedRepo:
    files = {}
    for p in sorted(Path(folder).rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(folder).as_posix()
        blob_id, sha256 = _hash_file(p)
        lfs = rel.endswith(LFS_SUFFIXES) or p.stat().st_size >= LFS_MIN_SIZE
        files[rel] = HostedFile(rel, p, p.stat().st_size, blob_id, sha256 if lfs else None)
    # The commit sha is derived from the content, so re-serving the same folder gives the same
    # sha; a given `revision` (a catalog entry's pin) is served instead, as the hub would.
    commit = revision or hashlib.sha1(json.dumps([repo_id, [(f.path, f.blob_id) for f in files.values()]]).encode()).hexdigest()
    return HostedRepo(repo_id, Path(folder), commit, files, gated)


@dataclass
class HubState:
    repos: dict[str, HostedRepo] = field(default_factory=dict)
    cut: dict[tuple[str, str], int | None] = field(default_factory=dict)  # (repo, path) -> cut after N bytes
    stalls: dict[tuple[str, str], int] = field(default_factory=dict)  # (repo, path) -> stop after N bytes
    released: threading.Event = field(default_factory=threading.Event)
    corrupted: set[tuple[str, str]] = field(default_factory=set)
    requests: list[tuple[str, str, dict]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, repo_id: str) -> HostedRepo | None:
        return self.repos.get(repo_id.lower())


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "HubServer"

    def log_message(self, *args) -> None:  # quiet: pytest shows failures, not access logs
        pass

    # -- routing ------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        state = self.server.state
        url = urlsplit(self.path)
        path = unquote(url.path)
        with state.lock:
            state.requests.append((self.command, self.path, dict(self.headers)))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            return self._model_info(m[1], m[2] or "main", "blobs" in parse_qs(url.query))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/.*)?", path):
            return self._tree(m[1], m[2])
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(m[1], m[2], m[3], head)
        if m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
            return self._cdn(m[1], head)
        self._error(404, "RepoNotFound", f"no route for {path}")

    # -- answers ------------------------------------------------------------------------

    def _repo(self, repo_id: str, revision: str) -> HostedRepo | None:
        repo = self.server.state.find(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if revision not in ("main", repo.sha):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo

    def _model_info(self, repo_id: str, revision: str, blobs: bool) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        siblings = []
        for f in repo.files.values():
            s: dict = {"rfilename": f.path}
            if blobs:
                s |= {"size": f.size, "blobId": f.blob_id}
                if f.sha256:
                    s["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
            siblings.append(s)
        self._json({"_id": repo.sha[:24], "id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.sha,
                    "private": False, "disabled": False, "gated": "manual" if repo.gated else False,
                    "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
                    "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z"})

    def _tree(self, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        items = []
        for f in repo.files.values():
            item = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
            if f.sha256:
                item["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            items.append(item)
        self._json(items)

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {TOKEN}"

    def _resolve(self, repo_id: str, revision: str, file_path: str, head: bool) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        if repo.gated and not self._authorized():
            return self._error(401, "GatedRepo", "Access to model is restricted. You must have access to it and be authenticated to access it. Please log in.")
        f = repo.files.get(file_path)
        if f is None:
            return self._error(404, "EntryNotFound", f"{file_path} does not exist on \"{revision}\"")
        common = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if f.sha256:  # LFS: the hub answers 302 to its CDN (another origin)
            host, port = self.server.server_address[:2]
            cdn_host = "localhost" if host == "127.0.0.1" else host
            self.server.cdn_files[f.sha256] = (repo, f)
            self.send_response(302)
            for k, v in {**common, "Location": f"http://{cdn_host}:{port}/cdn/{f.sha256}",
                         "X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size),
                         "ETag": f'"{f.blob_id}"', "Content-Length": "0"}.items():
                self.send_header(k, v)
            self.end_headers()
            return
        self._send_file(repo, f, head, {**common, "ETag": f'"{f.blob_id}"'})

    def _cdn(self, sha256: str, head: bool) -> None:
        hosted = self.server.cdn_files.get(sha256)
        if hosted is None:
            return self._error(404, None, "no such object")
        repo, f = hosted
        self._send_file(repo, f, head, {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes"})

    def _send_file(self, repo: HostedRepo, f: HostedFile, head: bool, headers: dict) -> None:
        state = self.server.state
        data = f.local.read_bytes()
        key = (repo.repo_id.lower(), f.path)
        if key in state.corrupted and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]  # same size, same ETag, other content
        start, end = 0, len(data)
        status = 200
        if m := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")):
            start = int(m[1])
            end = int(m[2]) + 1 if m[2] else len(data)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        body = data[start:end]
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body)), "Content-Type": "application/octet-stream"}.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        with state.lock:
            cut = state.cut.pop(key, False) if status == 200 else False
            stall = state.stalls.get(key) if status == 200 else None
        if cut is not False:  # send part of the body, then drop the connection
            self.wfile.write(body[: len(body) // 2 if cut is None else cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if stall is not None:  # send part of the body, then hang until released
            self.wfile.write(body[:stall])
            self.wfile.flush()
            state.released.wait()
            body = body[stall:]
        self.wfile.write(body)

    def _json(self, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _catalog_pin(repo_id: str) -> str | None:
    from app.models import catalog

    entry = catalog.find(repo_id)
    return entry.revision if entry is not None and not entry.user_added else None


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.state = HubState()
        self.cdn_files: dict[str, tuple[HostedRepo, HostedFile]] = {}
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="loopback-hub", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> "HubServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release()
        self.shutdown()
        self.server_close()

    # -- what the tests call ------------------------------------------------------------

    def serve_repo(self, repo_id: str, folder: str | Path, gated: bool = False, revision: str | None = None) -> HostedRepo:
        """Serve `folder` as model repo `repo_id` (files read when requested: later edits to
        the folder show, but the sha and hashes are those of now). `revision`: the commit sha
        to answer with; default: the built-in catalog's pin for that repo when it has one (so
        `models get glm-ocr` finds its pinned commit, as on the hub), else one made from the files."""
        repo = host_folder(repo_id, Path(folder), gated, revision or _catalog_pin(repo_id))
        with self.state.lock:
            self.state.repos[repo_id.lower()] = repo
        return repo

    def cut_first_transfer(self, repo_id: str, path: str, after: int | None = None) -> None:
        """Drop the connection after `after` bytes (default: half) of the file's next full GET."""
        with self.state.lock:
            self.state.cut[(repo_id.lower(), path)] = after

    def stall(self, repo_id: str, path: str, after: int) -> None:
        """Every full GET of the file sends `after` bytes, then hangs until `release()`."""
        with self.state.lock:
            self.state.stalls[(repo_id.lower(), path)] = after
            self.state.released.clear()

    def release(self) -> None:
        with self.state.lock:
            self.state.stalls.clear()
        self.state.released.set()

    def corrupt(self, repo_id: str, path: str) -> None:
        with self.state.lock:
            self.state.corrupted.add((repo_id.lower(), path))

    def requests_for(self, path_part: str) -> list[tuple[str, str, dict]]:
        with self.state.lock:
            return [r for r in self.state.requests if path_part in r[1]]
