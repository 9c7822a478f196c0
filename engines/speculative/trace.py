"""NDJSON trace: one JSON object per line per round, flushed as it happens, so a trace is
readable (and complete up to the last round) even if the process dies mid-run.

A trace is telemetry: when writing it fails mid-run (a full disk, a vanished folder) the run
goes on without it. The first failure is kept in `error` and handed to `on_error` once; later
writes and close() are quiet. Opening it is the up-front check: a path that cannot be opened
is a TraceError before anything is loaded. (An append-only log is not written to a temp file
and renamed: a line at a time is what keeps it readable after a crash; a torn last line is
skipped by its readers.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Callable

from engines.speculative.rounds import Round


class TraceError(OSError):
    pass


class TraceWriter:
    def __init__(self, path: str | Path, header: dict | None = None,
                 on_error: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.on_error = on_error
        self.error: str | None = None  # the first write failure, in one line
        try:
            self.file: IO[str] = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise TraceError(f"cannot write trace file {self.path}: {e.strerror or e}") from e
        if header is not None:
            self.write_header(header)

    def write_header(self, header: dict) -> None:
        """A "run" line: the request and model, before the rounds that follow it."""
        self._write({"event": "run", **header})

    def _write(self, obj: dict) -> None:
        if self.error is not None:
            return
        try:
            self.file.write(json.dumps(obj, ensure_ascii=False) + "\n")
            self.file.flush()
        except OSError as e:
            self._failed(e)

    def _failed(self, e: OSError) -> None:
        self.error = f"cannot write {self.path}: {e.strerror or e}"
        try:
            self.file.close()  # flushes the buffered line again, fails again, closes the file anyway
        except OSError:
            pass
        if self.on_error is not None:
            self.on_error(self.error)

    def write(self, rnd: Round) -> None:
        self._write({"event": "round", **rnd.to_dict()})

    def close(self) -> None:
        if self.file.closed:
            return
        try:
            self.file.close()
        except OSError as e:
            if self.error is None:
                self._failed(e)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

