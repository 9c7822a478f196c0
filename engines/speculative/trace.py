"""NDJSON trace: one JSON object per line per round, flushed as it happens, so a trace is
readable (and complete up to the last round) even if the process dies mid-run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from engines.speculative.rounds import Round


class TraceError(OSError):
    pass


class TraceWriter:
    def __init__(self, path: str | Path, header: dict | None = None):
        self.path = Path(path)
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
        self.file.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self.file.flush()

    def write(self, rnd: Round) -> None:
        self._write({"event": "round", **rnd.to_dict()})

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_trace(path: str | Path) -> list[Round]:
    """The rounds of a trace; a torn last line (the process died while writing) is skipped."""
    rounds = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if obj.get("event") == "round":
            rounds.append(Round.from_dict(obj))
    return rounds
