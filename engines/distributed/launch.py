"""Starting the ranks: `mlx.launch` (MLX's own launcher) runs the same command once per rank,
over the ring backend -- N ranks on this machine (`--ranks N`: loopback), or one per host of a
hostfile (ssh; mlx.launch's JSON format). Each rank is told its number in MLX_RANK.

The launcher waits for mlx.launch, which stops every rank when one exits with an error; then
it kills whatever is left of the ranks on this machine (a stopped rank ignores mlx.launch's
SIGTERM until it is continued), so no process outlives the command. mlx.launch's own messages
about a rank's exit are its; the rank that saw the loss says which rank it was."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from engines.types import EngineError

RANK_ENV = "MLX_RANK"


def this_rank() -> int | None:
    """This process's rank when mlx.launch started it, else None (the launcher)."""
    value = os.environ.get(RANK_ENV)
    return int(value) if value is not None and value.isdigit() else None


def pin_local_rank(rank: int, ranks: int) -> None:
    """N ranks on one machine: each rank runs on its own share of the cores (Linux). Every split
    layer makes the ranks wait for each other twice per forward; unpinned, the ranks' threads
    (and OpenBLAS's spinning ones) fight over the same cores and each wait costs a scheduler
    time slice (docs/benchmarks.md, "Tensor parallel on one machine"; bench/tensor_parallel.py).
    Call it first thing: threads started later inherit the mask."""
    if not hasattr(os, "sched_setaffinity"):  # macOS has no affinity API (and runs on Metal)
        return
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // ranks
    if share:
        os.sched_setaffinity(0, cpus[rank * share:(rank + 1) * share])


def check_hostfile(path: str) -> int:
    """The number of hosts in an mlx.launch hostfile; one clear line for a wrong one."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise EngineError(f"--hostfile {path}: no such file")
    try:
        data = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise EngineError(f"--hostfile {path}: not JSON ({e})") from None
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or not hosts:
        raise EngineError(f"--hostfile {path}: expected a list of hosts, or {{\"hosts\": [...]}} (mlx.launch's format)")
    for i, h in enumerate(hosts):
        if not isinstance(h, dict) or not isinstance(h.get("ssh"), str) or not h.get("ips"):
            raise EngineError(f"--hostfile {path}: host {i} needs \"ssh\" (a name) and \"ips\" (the addresses the "
                              "ranks connect over, e.g. the Thunderbolt bridge's)")
        for ip in h["ips"]:
            try:
                socket.inet_pton(socket.AF_INET6 if ":" in ip else socket.AF_INET, ip)
            except (OSError, TypeError):
                raise EngineError(f"--hostfile {path}: host {i}: {ip!r} is not an IP address "
                                  "(the ring backend connects by address)") from None
    return len(hosts)


def check_hosts_reachable(path: str) -> None:
    """mlx.launch starts a rank on another machine over ssh, without a password: try that
    first (a host that is down, unknown or asks for a password is one line now, not a hang)."""
    data = json.loads(Path(path).expanduser().read_text())
    hosts = data.get("hosts") if isinstance(data, dict) else data
    for h in hosts:
        name = h["ssh"]
        if name == "127.0.0.1":  # mlx.launch runs this one without ssh
            continue
        try:
            out = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", name, "true"],
                                 capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
            problem = None if out.returncode == 0 else (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        except FileNotFoundError:
            problem = "no ssh command on this machine"
        except subprocess.TimeoutExpired:
            problem = "no answer in 20 s"
        if problem:
            raise EngineError(f"--hostfile {path}: cannot reach {name} over ssh ({problem}); mlx.launch starts "
                              "each rank with ssh, without a password (docs/distributed.md)")


def free_port_run(count: int) -> int:
    """A port p with p .. p+count-1 free on loopback (the ring's listening ports)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65536 and all(_free(base + i) for i in range(count)):
            return base
    raise EngineError("no free ports for the ranks on 127.0.0.1")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def launch_command(argv: list[str], ranks: int, hostfile: str | None, port: int | None) -> list[str]:
    """mlx.launch running `python -m app <argv>` on every rank."""
    launcher = Path(sys.executable).with_name("mlx.launch")
    cmd = [str(launcher) if launcher.exists() else "mlx.launch", "--backend", "ring"]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    else:
        cmd += ["-n", str(ranks)]
    if port is not None:
        cmd += ["--starting-port", str(port)]
    return cmd + ["--python", sys.executable, "--", "-m", "app", *argv]


def run_ranks(cmd: list[str], local_ranks: int | None = None) -> int:
    """Run mlx.launch in a process group of its own, and leave no rank behind. `local_ranks`:
    all ranks on this machine -- each gets its share of the cores' BLAS threads."""
    env = dict(os.environ)
    if local_ranks and "OPENBLAS_NUM_THREADS" not in env:
        env["OPENBLAS_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // local_ranks))
    root = str(Path(__file__).resolve().parents[2])  # local ranks import this very checkout
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    # stdin: a pipe never written to. mlx.launch relays its stdin to the ranks with select();
    # /dev/null would be always readable and spin it.
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    failed = threading.Event()
    relay = threading.Thread(target=_relay_stderr, args=(proc.stderr, failed), daemon=True)
    relay.start()
    stopped_by: list[int] = []

    def stop(signum, frame):
        stopped_by.append(signum)
        _signal_group(proc.pid, signal.SIGTERM)

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _signal_group(proc.pid, signal.SIGKILL)  # stopped or hung ranks too
        relay.join(timeout=5)
    if stopped_by:  # Ctrl-C or a SIGTERM: the shell's convention
        return 128 + stopped_by[0]
    # mlx.launch itself exits 0 whatever its ranks did: a rank that failed is told by its own
    # warning line, which the relay watched for.
    return code or (1 if failed.is_set() else 0)


def _relay_stderr(stream, failed: threading.Event) -> None:
    """mlx.launch's stderr (the ranks' lines and its own) to ours, noting a rank that failed."""
    for line in iter(stream.readline, b""):
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()
        if b"Node with rank" in line and (b"exited with code" in line or b"was killed" in line):
            failed.set()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
