"""`--server URL` for `specscope chat | ocr | bench chat`: the run goes to an OpenAI-compatible
server (llama.cpp, vLLM, SGLang, `specscope serve`) through engines.remote. No Qt. The
commands import this; `bench chat --server` itself is in app.cli.bench.

With --server, --model names the server's model id (default: the first it lists); the drafter
is the server's own, so --spec only says what `specscope serve` should do per request."""

from __future__ import annotations

import argparse
import os
import sys

from app.cli.common import exit_code, open_trace, run_and_report

API_KEY_ENV = "SPECSCOPE_API_KEY"


def add_server_arguments(p: argparse.ArgumentParser, baseline: bool = False) -> None:
    p.add_argument("--server", default=None, metavar="URL",
                   help="run on an OpenAI-compatible server (llama.cpp, vLLM, SGLang, specscope serve); "
                        "--model is then its model id")
    p.add_argument("--api-key", default=None, metavar="KEY", help=f"the server's key (default: ${API_KEY_ENV})")
    if baseline:
        p.add_argument("--baseline-server", default=None, metavar="URL",
                       help="compare --server with this server (e.g. the same model without speculation) "
                            "instead of the local engine")


def connect(url: str, api_key: str | None, model: str | None):
    from engines.remote.engine import RemoteEngine

    return RemoteEngine.load(url, api_key=api_key or os.environ.get(API_KEY_ENV), model=model)


def report_server(engine) -> None:
    """The server's own figures for the last response; 'unknown' where it reports none."""
    report = getattr(engine, "last_report", None)
    if report is not None:
        print(f"[server {report.summary()}]", file=sys.stderr)


def run_on_server(args: argparse.Namespace, request) -> int:
    trace = open_trace(args)
    engine = connect(args.server, args.api_key, args.model)
    try:
        session = run_and_report(engine, request, args, trace)
    finally:
        if trace is not None:
            trace.close()
    report_server(engine)
    return exit_code(session)
