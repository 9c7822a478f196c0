"""Issue 16 item 3 for finished files: exports and benchmark reports are written whole or not at
all, checked up front where they can be, and computed results are never lost."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest

EXPORT_UNDER_A_FILE_SIZE_LIMIT = """
import json, resource, signal, sys
from pathlib import Path
from app.records.sessions import export_csv, export_json
from engines.speculative.rounds import Round
from engines.speculative.session import Session

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))  # a disk that fills after 2000 bytes
session = Session(request={"kind": "chat", "prompt": "hi"}, model={"name": "tiny"})
for i in range(50):
    session.add(Round(i, 2, 1, [i, i + 1], [True, False], " two", [True, False], 0.0, 0.01, 0.01))
out = Path(sys.argv[1])
for export, name in ((export_json, "s.json"), (export_csv, "s.csv")):
    try:
        export(session, out / name)
    except OSError as e:
        print(name, "failed:", e.strerror)
    else:
        print(name, "written")
"""


def test_an_export_that_fills_the_disk_leaves_no_partial_file(tmp_path):
    (tmp_path / "s.csv").write_text("the previous export\n")
    out = subprocess.run([sys.executable, "-c", EXPORT_UNDER_A_FILE_SIZE_LIMIT, str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["s.json failed: File too large", "s.csv failed: File too large"]
    assert not (tmp_path / "s.json").exists()  # before: a truncated file
    assert (tmp_path / "s.csv").read_text() == "the previous export\n"  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["s.csv"]  # no temporary files left


def test_bench_out_is_checked_before_the_benchmark_runs(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = subprocess.run([sys.executable, "-m", "app", "bench", "chat", "--model", str(tmp_path / "no-model"),
                          "--out", str(blocker / "results")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"specscope: error: cannot write to --out {blocker / 'results'}: Not a directory"]


def doc():
    return {"settings": {}, "model": {}, "machine": {}, "summary": {"median_speedup": 1.5},
            "cases": [{"name": "a", "plain_tok_s": 10.0, "spec_tok_s": 15.0, "speedup": 1.5, "tau": 2.0,
                       "acceptance": 0.5, "identical": True, "tokens": 8, "host_overhead": None}]}


def test_bench_results_that_cannot_go_to_out_go_elsewhere_and_say_where(tmp_path, monkeypatch, capsys):
    from app.cli.common import save_bench

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert save_bench(doc(), blocker / "results") == 1
    err = capsys.readouterr().err
    saved = sorted((tmp_path / "tmp" / "specscope-bench").glob("bench-*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text()) == doc()
    assert f"cannot write the results to {blocker / 'results'}" in err and str(saved[0]) in err

    monkeypatch.setattr(tempfile, "tempdir", str(blocker))  # nowhere to write at all: stdout
    assert save_bench(doc(), blocker / "results") == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == doc() and "the results follow on stdout" in captured.err
