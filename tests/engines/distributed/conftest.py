"""Tensor-parallel servers as a user starts them: `python -m app serve --ranks 2` in a fresh
process (the launcher), which starts two ranks with mlx.launch over loopback. The helpers find
the ranks by their command line (the server's unique --port) and MLX_RANK, to kill, stop, or
check that none is left."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engines.mlx_chat.conftest import ckpt_dir, llama_dir, llama_draft_dir  # noqa: F401  (pytest fixtures)

pytest.importorskip("mlx.core")

MODEL = "tiny-llama"


@pytest.fixture(scope="session")
def llama(llama_dir):
    """The chat tests' tiny llama (tests/engines/mlx_chat): 4 query / 2 KV heads, splits in two."""
    return llama_dir


@pytest.fixture(scope="session")
def llama_draft(llama_draft_dir):
    return llama_draft_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankServer:
    """The launcher process, its port, and its stderr (a file: the ranks' lines land there)."""

    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def lines_from(self, prefix: str) -> list[str]:
        """The lines of stderr that start with `prefix`, wherever in the line they begin:
        mlx.launch prints its own warnings from another thread in pieces ("\\033[33m[WARN]",
        then the message), so a rank's line can land just after that colour code."""
        return [line[line.index(prefix):] for line in self.stderr().splitlines() if prefix in line]

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def chat(self, prompt: str, timeout: float = 120, **body) -> tuple[int, dict]:
        payload = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 40} | body
        req = urllib.request.Request(self.url + "/v1/chat/completions", json.dumps(payload).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def processes(self) -> dict[int, int | None]:
        """pid -> MLX_RANK (None: the launcher or mlx.launch) of every live process of this server."""
        marker = f"--port\0{self.port}\0".encode()
        found = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if marker not in (d / "cmdline").read_bytes():
                    continue
                if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # exited, not yet reaped by its parent
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            ranks = [int(e.split(b"=", 1)[1]) for e in env if e.startswith(b"MLX_RANK=")]
            found[int(d.name)] = ranks[0] if ranks else None
        return found

    def rank_pid(self, rank: int) -> int:
        pids = [pid for pid, r in self.processes().items() if r == rank]
        assert len(pids) == 1, self.processes()
        return pids[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for pid in self.processes():  # a test that failed midway: leave nothing running
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_rank_server(model: str, tmp: Path, *args: str, ranks: int = 2, wait: float = 180) -> RankServer:
    port = free_port()
    log = tmp / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "app", "serve", "--model", model, "--model-name", MODEL, "--port", str(port),
           "--ranks", str(ranks), *args]
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=err, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
    server = RankServer(proc, port, log)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}):\n{server.stderr()}")
        try:
            if server.get("/health")[0] == 200:
                return server
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.2)
    server.stop()
    raise AssertionError(f"the server did not answer /health in {wait} s:\n{server.stderr()}")


def wait_gone(server: RankServer, seconds: float) -> None:
    """The launcher exits and no process of the server is left."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.proc.poll() is not None and not server.processes():
            return
        time.sleep(0.2)
    raise AssertionError(f"left running: {server.processes()} (launcher {server.proc.poll()})\n{server.stderr()}")
