"""Running an engine to the end of a request, and benchmarking speculation off vs on.

Shared by the CLI (`specscope chat|ocr|bench`) and benchmark scripts. No Qt: the app's worker
drives `engine.generate` itself so it can stop between rounds.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from engines.types import Engine, OnPrefill, Request, ShouldStop
from engines.files import atomic_write_text
from engines.speculative.rounds import Round
from engines.speculative.session import Session, machine_info
from engines.speculative.trace import TraceWriter


def run_session(
    engine: Engine,
    request: Request,
    on_round: Callable[[Round], None] | None = None,
    trace: TraceWriter | None = None,
    should_stop: ShouldStop | None = None,
    on_prefill: OnPrefill | None = None,
) -> Session:
    session = Session(request=request.to_dict(), model=engine.model_info())
    for rnd in engine.generate(request, should_stop, on_prefill=on_prefill):
        session.add(rnd)
        if trace is not None:
            trace.write(rnd)
        if on_round is not None:
            on_round(rnd)
    return session


@dataclass
class BenchCase:
    """One prompt (or image) measured with speculation off and on; medians over runs."""

    name: str
    plain_tok_s: float
    spec_tok_s: float
    speedup: float
    tau: float
    acceptance: float
    identical: bool  # at T=0 the outputs must be equal token for token
    plain_runs: list[float] = field(default_factory=list)
    spec_runs: list[float] = field(default_factory=list)
    tokens: int = 0
    host_overhead: float | None = None  # share of round time spent outside draft + verify


def bench_case(engine: Engine, name: str, request: Request, runs: int, warmup: int) -> BenchCase:
    """The same engine and request with speculation off (plain) and as asked (spec)."""
    plain_req = copy.deepcopy(request)
    plain_req.spec.method = "off"
    return bench_pair(name, (engine, plain_req), (engine, request), runs, warmup)


def bench_pair(name: str, plain: tuple[Engine, Request], spec: tuple[Engine, Request], runs: int,
               warmup: int) -> BenchCase:
    """Alternate the plain (baseline) and speculative runs so drift (thermal, other load) hits
    both alike; report medians of decode tok/s (prefill excluded). The two sides may be different
    engines (a server beside its plain twin, or beside the local engine): their outputs are then
    compared as text, since a server may not report token ids."""
    (plain_engine, plain_req), (spec_engine, spec_req) = plain, spec
    for _ in range(warmup):
        run_session(plain_engine, plain_req)
        run_session(spec_engine, spec_req)
    plain_runs, spec_runs = [], []
    for _ in range(runs):
        plain_runs.append(run_session(plain_engine, plain_req))
        spec_runs.append(run_session(spec_engine, spec_req))
    p_tok_s = statistics.median(s.stats().decode_tok_s for s in plain_runs)
    s_tok_s = statistics.median(s.stats().decode_tok_s for s in spec_runs)
    last = spec_runs[-1].stats()
    overhead = [
        1 - (r.draft_s + r.verify_s) / r.wall_s
        for s in spec_runs for r in s.rounds if not r.prefill and r.wall_s > 0 and r.draft_s + r.verify_s > 0
    ]
    same_engine = plain_engine is spec_engine
    return BenchCase(
        name=name,
        plain_tok_s=p_tok_s,
        spec_tok_s=s_tok_s,
        speedup=s_tok_s / p_tok_s if p_tok_s else 0.0,
        tau=last.tau,
        acceptance=last.acceptance_rate,
        identical=(plain_runs[-1].tokens == spec_runs[-1].tokens) if same_engine
        else plain_runs[-1].text == spec_runs[-1].text,
        plain_runs=[s.stats().decode_tok_s for s in plain_runs],
        spec_runs=[s.stats().decode_tok_s for s in spec_runs],
        tokens=len(spec_runs[-1].tokens),
        host_overhead=statistics.median(overhead) if overhead else None,
    )


BENCH_COLUMNS = ["name", "plain_tok_s", "spec_tok_s", "speedup", "tau", "acceptance", "identical", "tokens",
                 "host_overhead"]


def bench_document(cases: list[BenchCase], settings: dict, model: dict) -> dict:
    """The JSON report: settings, model, machine, summary and every case."""
    # A case whose output ended at once (EOS as the first token) has no decode rounds to time.
    timed = [c for c in cases if c.plain_tok_s > 0 and c.spec_tok_s > 0]
    summary = {
        "median_speedup": statistics.median(c.speedup for c in timed) if timed else None,
        "geomean_speedup": statistics.geometric_mean(c.speedup for c in timed) if timed else None,
        "median_tau": statistics.median(c.tau for c in timed) if timed else None,
        "untimed_cases": [c.name for c in cases if c not in timed],
        "all_identical": all(c.identical for c in cases),
    }
    return {"settings": settings, "model": model, "machine": machine_info(), "summary": summary,
            "cases": [asdict(c) for c in cases]}


def write_bench(doc: dict, out_dir: Path, columns: list[str] = BENCH_COLUMNS, rows: str = "cases",
                prefix: str = "bench") -> tuple[Path, Path]:
    """<prefix>-<time>.json and .csv (doc[rows] under `columns`) in `out_dir`, each written
    whole or not at all. OSError if the folder cannot be made or written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = out_dir / f"{prefix}-{stamp}.json"
    atomic_write_text(json_path, json.dumps(doc, indent=1))
    table = io.StringIO()
    w = csv.DictWriter(table, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    w.writerows(doc[rows])
    csv_path = out_dir / f"{prefix}-{stamp}.csv"
    atomic_write_text(csv_path, table.getvalue())
    return json_path, csv_path


def check_writable(folder: Path) -> None:
    """The up-front check of an output folder: make it and write a file there. OSError if not."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".specscope-probe-"):
        pass
