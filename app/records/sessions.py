"""Sessions on disk: the autosave file every round is appended to as it happens, exports
(JSON, CSV, PNG) and the list of past sessions. Qt-free except `export_png`'s widget grab.

An autosave file is an NDJSON trace (engines.speculative.trace): a "run" header with the
request, settings, model and machine (and, for OCR, the document page the run read: `page`, since
the request's image may be a region's crop or a PDF page's rendering), one "round" line per round (plus its burst split,
`draft_chars`), and an "end" line when the run ends. `load_session` reads it; a torn last
line (the process died mid-write) is skipped, so a crash loses at most the round in flight."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from app.records.bursts import Burst, burst_of
from app.records.documents import Page
from app.settings import data_dir
from engines.files import atomic_path, atomic_write_text
from engines.speculative.rounds import Round
from engines.speculative.session import Session
from engines.speculative.trace import TraceWriter


def sessions_dir() -> Path:
    return data_dir() / "sessions"


def new_autosave_path(kind: str) -> Path:
    folder = sessions_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = folder / f"{stamp}-{kind}{'-' + str(n) if n else ''}.ndjson"
        if not path.exists():
            return path
    raise OSError(f"no free autosave name in {folder}")


def autosave_problem() -> str | None:
    """The up-front check of the autosave folder: None if a session file can be written there,
    else one line saying where and why not (a read-only or unreachable data folder)."""
    folder = sessions_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as e:
        return f"{folder} is not writable ({e.strerror or e})"
    return None


def page_record(page: Page, region=None) -> dict:
    """The document page an OCR run read, as its autosave names it: the file, the page's number
    in it and its page count, and for a region read by the layout stage its index and label."""
    record = {"source": page.source, "number": page.number, "count": page.count}
    if region is not None:
        record["region"] = {"index": region.index, "label": region.label}
    return record


def input_label(request: dict, page: dict | None) -> str:
    """What an OCR run read, named as the CLI names it: `scan.pdf · p. 2 · region 3 doc_title`
    from the autosave's page record (the request's image may be a region's crop or a rendered
    PDF page: a temporary file's name); the image's file name when no page is recorded."""
    if not page:
        return Path(str(request.get("image") or "")).name
    label = Page(str(page.get("source") or ""), int(page.get("number") or 1), int(page.get("count") or 1), "").label
    region = page.get("region")
    if isinstance(region, dict):
        label += f" \u00b7 region {int(region.get('index', 0)) + 1} {region.get('label', '')}".rstrip()
    return label


class Autosave(TraceWriter):
    """Appends each round as it happens, flushed, so the file is complete up to the last round.
    A write that fails (full disk) stops the autosave, not the run (TraceWriter.on_error).
    `page`: the page_record of the document page an OCR run read."""

    def __init__(self, path: Path, session: Session, settings: dict | None = None,
                 on_error: Callable[[str], None] | None = None, page: dict | None = None):
        header = {
            "request": session.request,
            "settings": settings or {},
            "model": session.model,
            "machine": session.machine,
            "started_at": session.started_at,
            "pid": os.getpid(),  # a run whose writer is gone and that has no "end" line crashed
        }
        if page is not None:
            header["page"] = page
        super().__init__(path, header=header, on_error=on_error)

    def write_burst(self, burst: Burst) -> None:
        self._write({"event": "round", **burst.round.to_dict(), "draft_chars": burst.draft_chars})

    def write_end(self, outcome: str, message: str | None = None) -> None:
        self._write({"event": "end", "outcome": outcome, "message": message, "ended_at": time.time()})


@dataclass
class SavedSession:
    path: Path
    session: Session
    settings: dict = field(default_factory=dict)
    bursts: list[Burst] = field(default_factory=list)
    outcome: str | None = None  # finished | cancelled | errored | interrupted; None = never ended
    message: str | None = None
    pid: int | None = None  # the process that wrote it
    page: dict | None = None  # the document page an OCR run read (page_record); None: not said


def load_session(path: str | Path) -> SavedSession:
    path = Path(path)
    header: dict = {}
    bursts: list[Burst] = []
    end: dict = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line from a crash mid-write
        event = obj.get("event")
        if event == "run" and not header:
            header = obj
        elif event == "round":
            bursts.append(burst_of(Round.from_dict(obj), obj.get("draft_chars")))
        elif event == "end":
            end = obj
    session = Session(
        request=header.get("request", {}),
        model=header.get("model", {}),
        rounds=[b.round for b in bursts],
        machine=header.get("machine", {}),
        started_at=header.get("started_at", 0.0),
    )
    return SavedSession(path, session, header.get("settings", {}), bursts, end.get("outcome"), end.get("message"),
                        header.get("pid"), header.get("page"))


@dataclass
class SessionEntry:
    path: Path
    started_at: float
    kind: str
    model: str
    rounds: int
    outcome: str | None
    preview: str
    pid: int | None = None


def list_sessions(folder: Path | None = None, limit: int = 200) -> list[SessionEntry]:
    """Past sessions, newest first."""
    folder = folder or sessions_dir()
    if not folder.is_dir():
        return []
    files = sorted(folder.glob("*.ndjson"), key=lambda p: p.stat().st_mtime, reverse=True)[:limit]
    entries = []
    for path in files:
        try:
            saved = load_session(path)
        except OSError:
            continue
        s = saved.session
        req = s.request
        entries.append(SessionEntry(
            path=path,
            started_at=s.started_at,
            kind=str(req.get("kind", "?")),
            model=str(s.model.get("name") or Path(str(s.model.get("path", "?"))).name),
            rounds=len(s.rounds),
            outcome=saved.outcome,
            preview=(req.get("prompt") or input_label(req, saved.page) or s.text)[:80],
            pid=saved.pid,
        ))
    return entries


def chat_texts(folder: Path | None = None) -> list[tuple[str, str]]:
    """Each saved chat session as (file name, its prompt and the answer it received): the
    user's own conversations, as text a drafter can learn from (`specscope drafter train
    --sessions`). OCR sessions and chats that produced no text are left out."""
    folder = folder or sessions_dir()
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.ndjson")):
        try:
            saved = load_session(path)
        except (OSError, UnicodeDecodeError):
            continue  # unreadable: not worth stopping a training run for
        request, answer = saved.session.request, saved.session.text.strip()
        if request.get("kind", "chat") != "chat" or not answer:
            continue
        out.append((path.name, f"{request.get('prompt') or ''}\n\n{answer}".strip()))
    return out


def crashed_sessions(folder: Path | None = None) -> list[SessionEntry]:
    """Runs that never ended (no "end" line) and whose writing process is gone: the app was
    killed or crashed mid-run. Newest first. A run still being written by another window of
    the app (its pid alive) is not one."""
    return [e for e in list_sessions(folder, limit=20) if e.outcome is None and not _alive(e.pid)]


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    if pid == os.getpid():
        return True  # this process: its run may be going on now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def mark_interrupted(path: Path) -> None:
    """Record that a crashed run was seen (offered once): its file gets the "end" line the run
    never wrote."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "end", "outcome": "interrupted", "message": "the app quit mid-run",
                            "ended_at": time.time()}) + "\n")


def export_dict(session: Session, settings: dict | None = None) -> dict:
    """All rounds, request, settings, machine and model (with its hash) in one document."""
    d = session.to_dict()
    d["settings"] = settings or {}
    return d


# Exports are written whole or not at all (engines.files): a full disk leaves no 0-byte file.
def export_json(session: Session, path: str | Path, settings: dict | None = None) -> None:
    atomic_write_text(path, json.dumps(export_dict(session, settings), indent=1, ensure_ascii=False))


def export_text_file(text: str, path: str | Path) -> None:
    """A document export (Markdown, plain text, per-page JSON: app.records.documents.export_text)."""
    Path(path).write_text(text, encoding="utf-8")


def export_csv(session: Session, path: str | Path) -> None:
    atomic_write_text(path, session.to_csv())


def export_png(widget, path: str | Path) -> None:
    """The widget (the telemetry pane) as rendered now."""
    with atomic_path(path) as tmp:
        if not widget.grab().save(os.fspath(tmp), "PNG"):
            raise OSError(f"cannot write {path}")
