"""The supervisor files `serve` is documented to run under (docs/serve.md): a systemd user unit
and a launchd agent that restart it when its process dies, and only then."""

from __future__ import annotations

import configparser
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "supervisor" / "specscope-serve.service"
PLIST = ROOT / "packaging" / "supervisor" / "app.specscope.serve.plist"


def test_the_launchd_agent_restarts_serve_after_a_crash_only():
    with PLIST.open("rb") as f:
        agent = plistlib.load(f)
    assert agent["Label"] == "app.specscope.serve" == PLIST.stem
    assert agent["ProgramArguments"][0].endswith("/.venv/bin/specscope") and agent["ProgramArguments"][1] == "serve"
    assert agent["KeepAlive"] == {"SuccessfulExit": False}  # a crash or a kill, not a clean stop
    assert agent["RunAtLoad"] is True


def test_the_systemd_unit_restarts_serve_on_failure():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(UNIT)
    assert unit["Service"]["Restart"] == "on-failure"  # exit codes != 0 and deaths by signal
    assert unit["Service"]["ExecStart"].split()[:2] == ["%h/specscope/.venv/bin/specscope", "serve"]


@pytest.mark.skipif(sys.platform != "linux" or not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_systemd_reads_the_unit_without_a_complaint(tmp_path):
    # its ExecStart pointed at a binary that exists here: verify checks that it does
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("%h/specscope/.venv/bin/specscope", sys.executable))
    out = subprocess.run(["systemd-analyze", "verify", "--user", str(unit)], capture_output=True, text=True,
                         env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(tmp_path)})
    complaints = [line for line in out.stderr.splitlines() if UNIT.name in line]
    assert complaints == [], out.stderr
