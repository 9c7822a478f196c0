"""`--server URL` for `specscope chat | ocr | bench chat`: the run goes to an OpenAI-compatible
server (llama.cpp, vLLM, SGLang, `specscope serve`) through engines.remote. No Qt.

With --server, --model names the server's model id (default: the first it lists); the drafter
is the server's own, so --spec only says what `specscope serve` should do per request."""

from __future__ import annotations

import argparse
import os
import sys

API_KEY_ENV = "SPECSCOPE_API_KEY"


def add_server_arguments(p: argparse.ArgumentParser, baseline: bool = False) -> None:
    p.add_argument("--server", default=None, metavar="URL",
                   help="run on an OpenAI-compatible server (llama.cpp, vLLM, SGLang, specscope serve); "
                        "--model is then its model id")
    p.add_argument("--api-key", default=None, help=f"the server's key (default: ${API_KEY_ENV})")
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
    from app.cli import exit_code, open_trace, run_and_report

    trace = open_trace(args)
    engine = connect(args.server, args.api_key, args.model)
    try:
        session = run_and_report(engine, request, args, trace)
    finally:
        if trace is not None:
            trace.close()
    report_server(engine)
    return exit_code(session)


def bench_servers(args: argparse.Namespace) -> int:
    """`specscope bench chat --server URL [--baseline-server URL]`: the server's speculation
    beside its plain twin (--baseline-server), or beside the local engine (--model is then the
    local model, the server's model id being its first). Same prompts, alternating runs."""
    from pathlib import Path

    from app.cli import UsageError, checked, load_chat_engine, load_prompts, sampling, save_bench, spec_config
    from engines.types import Request
    from engines.runs import bench_document, bench_pair

    if args.runs < 1 or args.warmup < 0:
        raise UsageError("--runs must be >= 1 and --warmup >= 0")
    spec = spec_config(args, builtin_drafter=True)
    server = connect(args.server, args.api_key, None)
    if args.baseline_server:
        baseline, baseline_name = connect(args.baseline_server, args.api_key, None), args.baseline_server
    else:
        baseline, baseline_name = load_chat_engine(args.model, None), "local engine"
    cases = [(name, checked(Request(kind="chat", prompt=text, system=args.system, max_tokens=args.max_tokens,
                                    spec=spec, sampling=sampling(args)))) for name, text in load_prompts(args.prompts)]
    cases = cases[: args.limit] if args.limit else cases
    print(f"baseline: {baseline_name}; measured: {args.server} ({server.server})", file=sys.stderr)
    print(f"{'case':<22} {'base tok/s':>10} {'server tok/s':>12} {'ratio':>7} {'tau':>5} {'accept':>7} {'same':>5}",
          file=sys.stderr)
    results, reports = [], []
    for name, request in cases:
        c = bench_pair(name, (baseline, request), (server, request), runs=args.runs, warmup=args.warmup)
        results.append(c)
        reports.append(server.last_report.to_dict() if server.last_report else None)
        ratio = f"{c.speedup:>6.2f}x" if c.plain_tok_s and c.spec_tok_s else "   n/a "
        print(f"{name:<22} {c.plain_tok_s:>10.1f} {c.spec_tok_s:>12.1f} {ratio} {c.tau:>5.2f} "
              f"{100 * c.acceptance:>6.0f}% {'yes' if c.identical else 'NO':>5}", file=sys.stderr, flush=True)
    settings = vars(args) | {"spec": spec.__dict__, "baseline": baseline_name, "server_reports": reports}
    doc = bench_document(results, settings, server.model_info())
    summary = doc["summary"]
    if summary["median_speedup"] is not None:
        print(f"server vs baseline: median {summary['median_speedup']:.2f}x, geometric mean "
              f"{summary['geomean_speedup']:.2f}x, median tau {summary['median_tau']:.2f}; "
              f"outputs identical: {summary['all_identical']}", file=sys.stderr)
    return save_bench(doc, Path(args.out))
