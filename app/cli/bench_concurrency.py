"""Many requests at once, measured: `specscope bench serve --concurrency 1,2,4,8 [--server URL]`
(any OpenAI-compatible server, or ours started here on the local model) and `specscope bench
chat --concurrency N` (the batch in process, no HTTP). The client is engines/concurrent_runs.py:
c clients at a time through the prompt set, cycled to --requests; per level aggregate and
per-request decode tok/s, TTFT and latency p50/p95 and acceptance, beside speculation off at the
same concurrency wherever the server can be asked for it (ours: per request). JSON + CSV."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.common import (UsageError, add_spec_arguments, advanced, checked, load_chat_engine, load_prompts, pick_drafter,
                            resolve_models, sampling, save_bench, spec_config)
from app.cli.connect import connect
from engines.types import Request, SpecConfig

COLUMNS = ["target", "mode", "concurrency", "requests", "tokens", "wall_s", "aggregate_tok_s",
           "per_request_decode_tok_s_median", "ttft_p50_s", "ttft_p95_s", "latency_p50_s", "latency_p95_s",
           "proposed", "accepted", "acceptance", "identical_to_off"]


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="many clients at once against a server (any OpenAI-compatible one, or ours)")
    p.add_argument("--server", default=None, metavar="URL",
                   help="the server to load (default: `specscope serve` started here on --model)")
    p.add_argument("--api-key", default=None, metavar="KEY", help="the server's key")
    p.add_argument("--model", default=None, metavar="ID|PATH",
                   help="without --server: the model ours serves (default: the embedded SmolLM2)")
    p.add_argument("--draft-model", default=None, metavar="ID|PATH",
                   help="without --server: its draft model (--spec draft) or MTP drafter (--spec mtp)")
    add_concurrency_arguments(p, "1,2,4,8")
    add_spec_arguments(p, ["off", "ngram", "draft", "mtp"], "ngram")
    advanced(p).add_argument("--max-batch", type=int, default=None, metavar="N",
                             help="without --server: ours batches this many (default: the highest level)")


def add_concurrency_arguments(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--concurrency", default=default, metavar="N[,M...]",
                   help=f"clients at a time, a comma-separated list (default {default})")
    p.add_argument("--requests", type=int, default=8, metavar="N", help="requests per level: the prompt set cycled (default 8)")
    p.add_argument("--prompts", default=None, metavar="FILE", help="as for bench chat (default: the copy-heavy set)")
    p.add_argument("--out", default="bench/results", metavar="DIR", help="directory for the JSON and CSV reports")


def levels_of(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--concurrency takes numbers separated by commas, not {text!r}") from None
    if not levels or min(levels) < 1:
        raise UsageError("--concurrency levels must be >= 1")
    return levels


def workload(args: argparse.Namespace, spec: SpecConfig) -> list[tuple[str, Request]]:
    if args.requests < 1:
        raise UsageError("--requests must be >= 1")
    prompts = load_prompts(args.prompts)
    return [(name, checked(Request(kind="chat", prompt=text, max_tokens=args.max_tokens, spec=spec,
                                   sampling=sampling(args))))
            for name, text in (prompts[i % len(prompts)] for i in range(args.requests))]


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from engines.concurrent_runs import run_clients

    levels = levels_of(args.concurrency)
    spec = spec_config(args, builtin_drafter=True)
    running = None
    if args.server:
        url, target = args.server, args.server
    else:
        pick_drafter(args)
        resolve_models(args, spec, "chat")
        running = start_local_server(args, spec, max(args.max_batch or max(levels), 1))
        url, target = running.url, f"specscope serve --max-batch {args.max_batch or max(levels)} (here)"
    try:
        kind = connect(url, args.api_key, None).server
        # ours takes speculation per request, so its off twin runs at every level; another
        # server decodes as it was launched (compare with its plain twin by running it again)
        modes = [("spec", spec)] + ([("off", SpecConfig("off", 0))] if kind == "specscope" and spec.enabled else [])
        rows = measure(levels, modes, lambda c, reqs: run_clients(lambda: connect(url, args.api_key, None), reqs, c),
                       args, target)
    finally:
        if running is not None:
            running.stop()
    return report(rows, args, {"server": target, "kind": kind})


def start_local_server(args: argparse.Namespace, spec: SpecConfig, max_batch: int):
    from app.serve.protocol import ServedModel
    from app.serve.server import ServeConfig, Served, build_app, start_in_thread

    engine = load_chat_engine(args.model, spec.draft_model)
    served = [Served(ServedModel(Path(engine.model_path).name, "chat", spec), engine)]
    return start_in_thread(build_app(ServeConfig(max_batch=max_batch, queue_size=max(levels_of(args.concurrency))),
                                     served))


def cmd_bench_chat_concurrency(args: argparse.Namespace) -> int:
    """`bench chat --concurrency N[,M...]`: the batch in process; spec vs off per level."""
    from engines.batch.engine import BatchEngine
    from engines.concurrent_runs import run_batched

    levels = levels_of(args.concurrency)
    pick_drafter(args)
    spec = spec_config(args)
    resolve_models(args, spec, "chat")
    chat = load_chat_engine(args.model, spec.draft_model)
    modes = [("spec", spec), ("off", SpecConfig("off", 0))]
    rows = measure(levels, modes, lambda c, reqs: run_batched(BatchEngine(chat, max_batch=c), reqs, c), args,
                   f"{Path(chat.model_path).name} in process")
    return report(rows, args, chat.model_info())


def measure(levels: list[int], modes: list[tuple[str, SpecConfig]], run, args: argparse.Namespace,
            target: str) -> list[dict]:
    """Every level, each mode; a warm-up at the first level's width first (compiled kernels and
    caches of that shape), then the measured runs. At T=0 the outputs are compared with off's."""
    from engines.concurrent_runs import summarize

    run(min(levels), workload(args, modes[0][1])[: min(levels)])
    print(f"{'mode':<5} {'c':>3} {'agg tok/s':>9} {'per req':>8} {'TTFT p50':>9} {'lat p50':>8} {'lat p95':>8} "
          f"{'accept':>7} {'same':>5}", file=sys.stderr)
    rows = []
    for c in levels:
        level = {}
        for mode, spec in modes:
            records, wall = run(c, workload(args, spec))
            level[mode] = ({"target": target, "mode": mode, "concurrency": c, **summarize(records, wall)},
                           [r.token_ids for r in records])
        for mode, (row, tokens) in level.items():
            if mode != "off" and "off" in level and args.temp == 0:
                row["identical_to_off"] = tokens == level["off"][1]
            rows.append(row)
            acc = f"{100 * row['acceptance']:6.0f}%" if row["acceptance"] is not None else "      -"
            same = {True: "yes", False: "NO", None: ""}[row.get("identical_to_off")]
            print(f"{mode:<5} {c:>3} {row['aggregate_tok_s']:>9.1f} {row['per_request_decode_tok_s_median'] or 0:>8.1f} "
                  f"{row['ttft_p50_s'] or 0:>8.2f}s {row['latency_p50_s']:>7.2f}s {row['latency_p95_s']:>7.2f}s {acc} "
                  f"{same:>5}", file=sys.stderr, flush=True)
    return rows


def report(rows: list[dict], args: argparse.Namespace, target: dict) -> int:
    from engines.speculative.session import machine_info

    doc = {"settings": {k: v for k, v in vars(args).items() if k != "api_key"}, "target": target,
           "machine": machine_info(), "levels": rows}
    return save_bench(doc, Path(args.out), columns=COLUMNS, rows="levels", prefix="bench-concurrency")
