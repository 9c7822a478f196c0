"""A session: the settings of one run, its rounds and its statistics; exports as JSON / CSV."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from engines.speculative.rounds import Round, SessionStats, session_stats

CSV_COLUMNS = [
    "index", "prefill", "steps", "proposed", "accepted", "tokens", "from_draft", "accept_flags",
    "draft_s", "verify_s", "wall_s", "t_s", "finish", "note", "text",
]


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }


def model_hash(path: str | Path) -> str:
    """A stable fingerprint of a model file or directory: sha256 over file names, sizes and
    contents (weights files hashed by their first and last 8 MiB to stay fast on large models)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(path) if path.is_dir() else f.name}:{size}".encode())
        with open(f, "rb") as fh:
            if size <= 16 << 20:
                h.update(fh.read())
            else:
                h.update(fh.read(8 << 20))
                fh.seek(size - (8 << 20))
                h.update(fh.read(8 << 20))
    return h.hexdigest()[:16]


@dataclass
class Session:
    request: dict
    model: dict
    rounds: list[Round] = field(default_factory=list)
    machine: dict = field(default_factory=machine_info)
    started_at: float = field(default_factory=time.time)

    def add(self, rnd: Round) -> None:
        self.rounds.append(rnd)

    @property
    def tokens(self) -> list[int]:
        return [t for r in self.rounds for t in r.tokens]

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.rounds)

    @property
    def finish(self) -> str | None:
        return self.rounds[-1].finish if self.rounds else None

    def stats(self) -> SessionStats:
        return session_stats(self.rounds)

    def to_dict(self) -> dict:
        return {
            "request": self.request,
            "model": self.model,
            "machine": self.machine,
            "started_at": self.started_at,
            "text": self.text,
            "tokens": self.tokens,
            "finish": self.finish,
            "stats": self.stats().to_dict(),
            "rounds": [r.to_dict() for r in self.rounds],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Session":
        return cls(
            request=d.get("request", {}),
            model=d.get("model", {}),
            rounds=[Round.from_dict(r) for r in d.get("rounds", [])],
            machine=d.get("machine", {}),
            started_at=d.get("started_at", 0.0),
        )

    def to_csv(self) -> str:
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in self.rounds:
            d = r.to_dict()
            d["tokens"] = " ".join(map(str, r.tokens))
            d["from_draft"] = "".join("1" if f else "0" for f in r.from_draft)
            d["accept_flags"] = "".join("1" if f else "0" for f in r.accept_flags)
            w.writerow({k: d[k] for k in CSV_COLUMNS})
        return out.getvalue()
