"""`specscope bench chat | ocr`: speculation off vs on (or a server vs its baseline), medians,
JSON and CSV reports."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.common import (Parser, UsageError, add_ocr_compute_arguments, add_spec_arguments, advanced, check_images,
                            checked, load_chat_engine, load_prompts, ocr_load_options, pick_drafter, resolve_models,
                            sampling, save_bench, spec_config)
from app.cli.bench_concurrency import add_serve_parser, cmd_bench_chat_concurrency, cmd_bench_serve
from app.cli.connect import add_server_arguments, connect
from engines.types import Request


def bench_parser() -> Parser:
    p = Parser(prog="specscope bench", description="Speculation off vs on: warm-up, N runs each (alternating), medians.")
    sub = p.add_subparsers(dest="engine", required=True)
    chat = sub.add_parser("chat", help="chat models over a prompt set")
    chat.add_argument("--model", default=None, metavar="ID|PATH",
                      help="model directory or .gguf (default: the embedded SmolLM2)")
    chat.add_argument("--draft-model", default=None, metavar="ID|PATH",
                      help="draft model (--spec draft) or MTP drafter / Gemma 4 assistant (--spec mtp)")
    chat.add_argument("--prompts", default=None, metavar="FILE",
                      help="JSON {prompts: [{name, prompt}]} or text, one prompt per line (default: the copy-heavy set)")
    add_spec_arguments(chat, ["ngram", "draft", "mtp"], "ngram")
    advanced(chat).add_argument("--system", default=None, metavar="TEXT", help="system prompt")
    add_server_arguments(chat, baseline=True)
    chat.add_argument("--concurrency", default=None, metavar="N[,M...]",
                      help="the batch in process: N requests at a time, speculation on vs off (bench serve: over HTTP)")
    advanced(chat).add_argument("--requests", type=int, default=8, metavar="N",
                                help="with --concurrency: requests per level (default 8)")
    ocr = sub.add_parser("ocr", help="GLM-OCR over images")
    ocr.add_argument("images", nargs="+", metavar="IMAGE", help="page images to read")
    ocr.add_argument("--model", required=True, metavar="ID|PATH", help="GLM-OCR: catalog id, checkpoint or converted directory")
    ocr.add_argument("--runtime", choices=["torch", "coreml", "coreml-twin"], default=None,
                     help="default: coreml for a converted directory on macOS, else torch")
    ocr.add_argument("--task", choices=["text", "table", "formula"], default="text", help="what to read (default text)")
    add_spec_arguments(ocr, ["mtp"], "mtp")
    add_ocr_compute_arguments(advanced(ocr))
    add_serve_parser(sub)
    for q in (chat, ocr):
        q.add_argument("--runs", type=int, default=3, metavar="N", help="runs of each case, alternating (default 3)")
        q.add_argument("--out", default="bench/results", metavar="DIR", help="directory for the JSON and CSV reports")
        advanced(q).add_argument("--warmup", type=int, default=1, metavar="N", help="runs not counted first (default 1)")
        advanced(q).add_argument("--limit", type=int, default=None, metavar="N", help="only the first N prompts / images")
    return p


def cmd_bench(argv: list[str]) -> int:
    from engines.factory import load_engine
    from engines.runs import bench_case, bench_document, check_writable

    args = bench_parser().parse_args(argv)
    if args.engine == "serve":
        return cmd_bench_serve(args)
    if args.runs < 1 or args.warmup < 0:
        raise UsageError("--runs must be >= 1 and --warmup >= 0")
    try:  # before the benchmark runs, not after
        check_writable(Path(args.out))
    except OSError as e:
        raise UsageError(f"cannot write to --out {args.out}: {e.strerror or e}")
    if args.engine == "chat" and args.server:
        return bench_servers(args)
    if args.engine == "chat" and args.concurrency:
        return cmd_bench_chat_concurrency(args)
    if args.engine == "chat":
        pick_drafter(args)
        spec = spec_config(args)
        cases = [(name, checked(Request(kind="chat", prompt=text, system=args.system, max_tokens=args.max_tokens,
                                        spec=spec, sampling=sampling(args)))) for name, text in load_prompts(args.prompts)]
        resolve_models(args, spec, "chat")
        engine = load_chat_engine(args.model, spec.draft_model)
    else:
        spec = spec_config(args, builtin_drafter=True)
        cases = [(Path(img).name, checked(Request(kind="ocr", image=img, task=args.task, max_tokens=args.max_tokens,
                                                  spec=spec, sampling=sampling(args)))) for img in args.images]
        check_images(args.images)
        resolve_models(args, spec, "ocr")
        engine = load_engine("ocr", args.model, **ocr_load_options(args))
    cases = cases[: args.limit] if args.limit else cases
    results = []
    print(f"{'case':<22} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>8} {'tau':>5} {'accept':>7} {'same':>5}", file=sys.stderr)
    for name, request in cases:
        c = bench_case(engine, name, request, runs=args.runs, warmup=args.warmup)
        results.append(c)
        speedup = f"{c.speedup:>7.2f}x" if c.plain_tok_s and c.spec_tok_s else "    n/a "  # ended at once
        print(f"{name:<22} {c.plain_tok_s:>11.1f} {c.spec_tok_s:>10.1f} {speedup} {c.tau:>5.2f} "
              f"{100 * c.acceptance:>6.0f}% {'yes' if c.identical else 'NO':>5}", file=sys.stderr, flush=True)
    settings = vars(args) | {"spec": cases[0][1].spec.__dict__ if cases else None}
    doc = bench_document(results, settings, engine.model_info())
    summary = doc["summary"]
    if summary["median_speedup"] is not None:
        print(f"speedup: median {summary['median_speedup']:.2f}x, geometric mean {summary['geomean_speedup']:.2f}x, "
              f"median tau {summary['median_tau']:.2f}; outputs identical: {summary['all_identical']}", file=sys.stderr)
    return save_bench(doc, Path(args.out))


def bench_servers(args: argparse.Namespace) -> int:
    """`specscope bench chat --server URL [--baseline-server URL]`: the server's speculation
    beside its plain twin (--baseline-server), or beside the local engine (--model is then the
    local model, the server's model id being its first). Same prompts, alternating runs."""
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
