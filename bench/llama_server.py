"""llama.cpp's server with n-gram speculation beside its plain twin, and beside the local engine.

Starts two llama-server processes on the embedded SmolLM2 GGUF (one with --spec-type
ngram-simple, one without), then runs on the copy-heavy prompt set:
  specscope bench chat --server NGRAM --baseline-server PLAIN    (llama.cpp: speculation vs plain)
  specscope bench chat --server NGRAM                            (llama.cpp ngram vs the local engine)
Each prints a table and writes JSON + CSV to --out. Not a test: figures go to docs/benchmarks.md.

Usage: python bench/llama_server.py [--runs 3] [--max-tokens 128] [--threads 2] [--limit N]
                                    [--size-n N --size-m M]
--size-n / --size-m set llama.cpp's ngram-simple lookup and draft lengths (its defaults are 12 and
48: a 12-token match is rare in a short answer); 3 and 5 come close to the local engine's n-gram
lookup (1-4 tokens matched, 5 drafts). Needs scripts/build-llama-server to have run."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BINARY = Path(os.environ.get("SPECSCOPE_LLAMA_SERVER",
                             Path.home() / ".cache/specscope/llama.cpp-b11434/bin/llama-server"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: Path, threads: int, spec: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([str(BINARY), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                             "--metrics", "-c", "4096", "-np", "1", "--threads", str(threads), "--no-webui", *spec],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"llama-server did not start ({' '.join(spec) or 'plain'})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--size-n", type=int, default=None, help="--spec-ngram-simple-size-n (llama.cpp: 12)")
    p.add_argument("--size-m", type=int, default=None, help="--spec-ngram-simple-size-m (llama.cpp: 48)")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    if not BINARY.is_file():
        raise SystemExit(f"{BINARY} is missing: run scripts/build-llama-server")
    from app.cli.main import main as specscope
    from engines.mlx_chat.models import default_chat_model

    model = default_chat_model()
    common = ["--runs", str(args.runs), "--warmup", str(args.warmup), "-m", str(args.max_tokens), "--out", args.out]
    if args.limit:
        common += ["--limit", str(args.limit)]
    spec = ["--spec-type", "ngram-simple"]
    if args.size_n:
        spec += ["--spec-ngram-simple-size-n", str(args.size_n)]
    if args.size_m:
        spec += ["--spec-ngram-simple-size-m", str(args.size_m)]
    ngram, ngram_url = start(model, args.threads, spec)
    plain, plain_url = start(model, args.threads, [])
    try:
        print(f"== llama-server: {' '.join(spec)} vs plain ==", file=sys.stderr, flush=True)
        specscope(["bench", "chat", "--server", ngram_url, "--baseline-server", plain_url, *common])
        plain.terminate()  # the local engine gets the cores the plain server no longer polls
        print("== llama-server ngram-simple vs the local engine (n-gram, steps 5) ==", file=sys.stderr, flush=True)
        specscope(["bench", "chat", "--server", ngram_url, "--steps", "5", *common])
    finally:
        for proc in (ngram, plain):
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
