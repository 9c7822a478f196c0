"""`specscope serve ...`: load the engines, then answer HTTP until interrupted."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from app.cli.common import (Parser, UsageError, add_ocr_compute_arguments, add_spec_arguments, advanced, load_chat_engine,
                            ocr_load_options, pick_drafter, resolve_models, spec_config)
from app.serve.protocol import ServedModel
from app.serve.server import DEFAULT_MAX_BATCH, ServeConfig, Served, build_app, serve_forever


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def serve_parser(parser_class) -> argparse.ArgumentParser:
    p = parser_class(prog="specscope serve", description="Serve the chat (and GLM-OCR) engines over an "
                     "OpenAI-compatible HTTP API: /v1/chat/completions, /v1/models, /health, /metrics.")
    p.add_argument("--model", metavar="ID|PATH", default=None, help="chat model: catalog id, hub repo id, directory or .gguf (default: the embedded SmolLM2)")
    p.add_argument("--model-name", metavar="NAME", default=None, help="the id clients ask for (default: the model's file name)")
    p.add_argument("--draft-model", metavar="ID|PATH", default=None, help="draft model (--spec draft) or Gemma 4 assistant (--spec mtp)")
    p.add_argument("--ocr-model", metavar="ID|PATH", default=None, help="also serve GLM-OCR (catalog id or checkpoint; image content parts)")
    p.add_argument("--host", metavar="ADDRESS", default="127.0.0.1", help="default loopback; another address needs --api-key or --insecure")
    p.add_argument("--port", metavar="N", type=int, default=8000, help="default 8000")
    p.add_argument("--api-key", metavar="KEY", default=None, help="require 'Authorization: Bearer KEY'")
    add_spec_arguments(p, ["off", "ngram", "draft", "mtp"], "ngram")
    more = advanced(p)
    more.add_argument("--ocr-runtime", choices=["torch", "coreml", "coreml-twin"], default=None,
                      help="GLM-OCR's runtime (default: coreml for a converted directory on macOS, else torch)")
    add_ocr_compute_arguments(more, prefix="ocr-")
    more.add_argument("--no-chat", action="store_true", help="serve only the OCR model")
    more.add_argument("--insecure", action="store_true", help="allow a non-loopback --host without --api-key")
    more.add_argument("--queue-size", metavar="N", type=int, default=4, help="requests that may wait for a row of the batch (or behind the running one; default 4)")
    more.add_argument("--max-batch", metavar="N", type=int, default=DEFAULT_MAX_BATCH,
                      help=f"chat requests decoded together, one target forward per step (default {DEFAULT_MAX_BATCH}; 1 = one at a time)")
    more.add_argument("--prompt-cache", type=int, default=512, metavar="MB",
                      help="prompts read before, kept for requests that start the same (default 512 MB; 0 = off)")
    more.add_argument("--allowed-hosts", type=comma_list, default=(), metavar="NAME,...",
                      help="Host names served besides localhost, 127.0.0.1 and [::1] (a reverse proxy, a .local name)")
    more.add_argument("--allowed-origins", type=comma_list, default=(), metavar="ORIGIN,...",
                      help="browser origins that may call the API (CORS), e.g. http://localhost:3000; others get 403")
    more.add_argument("--ranks", type=int, default=1, metavar="N",
                      help="split the chat model over N processes on this machine (mlx.launch, ring backend over "
                           "loopback); rank 0 serves HTTP and drafts")
    more.add_argument("--hostfile", default=None, metavar="FILE",
                      help="split the chat model over several machines: mlx.launch's JSON hostfile, one rank per host "
                           "(see docs/distributed.md)")
    more.add_argument("--split", choices=["auto", "tensor", "pipeline"], default="auto",
                      help="how --ranks / --hostfile split the model: tensor (every layer's heads over the ranks), "
                           "pipeline (runs of whole layers, rank 0 the last; for Gemma 3 / 4, heads that do not "
                           "divide, and MTP drafters), auto (tensor where mlx-lm can and no MTP drafter is served)")
    more.add_argument("--rank-timeout", type=float, default=30.0, metavar="S",
                      help="longest wait on another rank before it is declared lost (the server answers 503 and exits)")
    more.add_argument("--memory-limit", type=float, default=None, metavar="GB",
                      help="the most memory the chat model may take in this process (in each rank with --ranks): "
                           "MLX's limit (mx.set_memory_limit), checked after loading")
    more.add_argument("--check-ranks", action="store_true",
                      help="compare every forward across the ranks: its logits' argmax (tensor parallel) or the mirrored "
                           "caches' slot tables (pipeline); a divergence check, one more collective per forward")
    more.add_argument("--drafter-on", choices=["rank0", "every-rank"], default="rank0",
                      help="with --ranks / --hostfile and a draft model: rank 0 drafts and sends the drafts in each "
                           "forward's message (default), or every rank loads the draft model and drafts too")
    return p


def cmd_serve(argv: list[str]) -> int:
    from engines.factory import load_engine

    args = serve_parser(Parser).parse_args(argv)
    config = ServeConfig(host=args.host, port=args.port, api_key=args.api_key, insecure=args.insecure,
                         queue_size=args.queue_size, max_batch=args.max_batch, prompt_cache_mb=args.prompt_cache,
                         allowed_hosts=args.allowed_hosts,
                         allowed_origins=args.allowed_origins)
    config.check()
    if not 0 < args.port < 65536:
        raise UsageError("--port must be in 1..65535")
    if args.no_chat and not args.ocr_model:
        raise UsageError("--no-chat leaves nothing to serve: give --ocr-model PATH")
    if args.ranks < 1:
        raise UsageError("--ranks must be >= 1")
    if args.ranks > 1 or args.hostfile:
        return serve_ranks(args, argv, config)
    if args.drafter_on != "rank0":
        raise UsageError("--drafter-on every-rank needs ranks to draft on: --ranks N or --hostfile FILE")
    served: list[Served] = []
    if not args.no_chat:
        pick_drafter(args)
        spec = spec_config(args)
        asked = args.model  # a catalog id names the model better than its cache folder does
        resolve_models(args, spec, "chat")
        limit_memory(args.memory_limit)
        engine = load_chat_engine(args.model, spec.draft_model)
        check_memory_limit(args.memory_limit, "the model")
        name = args.model_name or Path(asked or engine.model_path).name
        served.append(Served(ServedModel(name, "chat", spec, args.max_repeat), engine))
    if args.ocr_model:
        from app.models.lookup import model_path

        ocr_args = argparse.Namespace(**vars(args) | {"spec": "mtp" if args.spec != "off" else "off"})
        spec = spec_config(ocr_args, builtin_drafter=True)
        engine = load_engine("ocr", model_path(args.ocr_model, "ocr"), **ocr_load_options(args, prefix="ocr-"))
        served.append(Served(ServedModel(Path(args.ocr_model).name, "ocr", spec, args.max_repeat), engine))
    app = build_app(config, served)
    print(f"specscope serve: {', '.join(s.model.id for s in served)} on http://{args.host}:{args.port}/v1",
          file=sys.stderr, flush=True)
    serve_forever(app, config)
    return 0


CONNECT_AT_LEAST_S = 60.0


def serve_ranks(args: argparse.Namespace, argv: list[str], config: ServeConfig) -> int:
    """Over several ranks (tensor parallel or a pipeline). Started by the user: launch the ranks
    (mlx.launch) and wait for them. Started by mlx.launch (MLX_RANK is set): be that rank -- rank 0 serves, the others follow."""
    from engines.distributed.launch import (check_hostfile, check_hosts_reachable, free_port_run, launch_command,
                                            pin_local_rank, run_ranks, this_rank)

    if args.ocr_model or args.no_chat:
        raise UsageError("--ranks / --hostfile split the chat model only: serve GLM-OCR from a server of its own")
    if args.rank_timeout <= 0:
        raise UsageError("--rank-timeout must be > 0")
    pick_drafter(args)
    spec = spec_config(args)
    asked = args.model
    resolve_models(args, spec, "chat")
    if args.model is None:
        from engines.mlx_chat.models import default_chat_model

        args.model = str(default_chat_model())
    every_rank = args.drafter_on == "every-rank"
    if every_rank:
        check_drafter_every_rank(spec)
    rank = this_rank()
    if rank is None:
        from engines.distributed.engine import choose_split

        ranks = check_hostfile(args.hostfile) if args.hostfile else args.ranks
        if args.hostfile:
            check_hosts_reachable(args.hostfile)
        choose_split(args.model, ranks, args.split, serves_mtp(spec))  # one line now, not one per rank later
        port = None if args.hostfile else free_port_run(ranks)
        return run_ranks(launch_command(["serve", *argv], ranks, args.hostfile, port),
                         local_ranks=None if args.hostfile else ranks)
    if not args.hostfile:
        pin_local_rank(rank, args.ranks)  # before MLX starts its threads

    import mlx.core as mx

    from engines.distributed.bus import Bus, Watchdog
    from engines.distributed.engine import RankZeroEngine, choose_split, follow, load_part, load_rank_zero
    from engines.mlx_chat.loading import load_model

    # Connecting waits for every rank to start (Python, MLX, imports): seconds on a quiet machine,
    # tens of seconds on a loaded one, so a short --rank-timeout is not its measure.
    connect_s = max(args.rank_timeout, CONNECT_AT_LEAST_S)

    def unconnected(what: str) -> None:
        print(f"specscope serve: rank {rank}: the ranks did not connect within {connect_s:.0f} s "
              "(a rank that did not start, or a hostfile's ips this machine cannot reach); exiting",
              file=sys.stderr, flush=True)
        os._exit(1)

    watchdog = Watchdog(connect_s, unconnected).start()
    watchdog.arm("connecting")
    group = mx.distributed.init(strict=True, backend="ring")
    bus = Bus.join(group)
    watchdog.disarm()
    limit_memory(args.memory_limit)
    # every rank decides alike: from the same config and arguments
    split = choose_split(args.model, group.size(), args.split, serves_mtp(spec))
    if rank != 0:
        try:
            loaded, stage = load_part(args.model, group, split)
            draft = load_model(spec.draft_model).model if every_rank else None  # whole, as rank 0 loads it
            check_memory_limit(args.memory_limit, f"rank {rank}'s {split} part (and the drafter)")
        except Exception:  # rank 0 loads the same model and says what is wrong, once
            return 2
        return follow(loaded.model, bus, args.rank_timeout, stage=stage, draft_model=draft)
    chat, stage = load_rank_zero(args.model, spec.draft_model, group, split)
    check_memory_limit(args.memory_limit, f"rank 0's {split} part (and the drafter)")
    engine = RankZeroEngine(chat, max_batch=max(args.max_batch, 1), bus=bus, timeout_s=args.rank_timeout,
                            check=args.check_ranks, stage=stage, drafter_on=args.drafter_on)
    name = args.model_name or Path(asked or chat.model_path).name
    config.ranks = group.size()
    app = build_app(config, [Served(ServedModel(name, "chat", spec, args.max_repeat), chat, batch=engine)])
    layout = (f"pipeline, rank 0 layers {stage.lo}-{stage.hi - 1} of {stage.hi}" if stage is not None
              else "tensor parallel") + (", the draft model on every rank" if every_rank else "")
    print(f"specscope serve: {name} over {group.size()} ranks ({layout}) on http://{args.host}:{args.port}/v1",
          file=sys.stderr, flush=True)
    # Ctrl-C reaches the launcher, which stops every rank (engines/distributed/launch.py).
    serve_forever(app, config)
    return 0


def check_drafter_every_rank(spec) -> None:
    """--drafter-on every-rank replicates a draft model; one line where there is none to replicate."""
    if serves_mtp(spec):
        raise UsageError("--drafter-on every-rank: an MTP drafter (the Gemma 4 assistant, one trained here) reads the "
                         "target's K/V and final hidden state, which only rank 0 holds in a pipeline (tensor parallel "
                         "splits them over the ranks): it drafts on rank 0 only (--drafter-on rank0)")
    if not spec.draft_model:
        raise UsageError("--drafter-on every-rank runs a draft model on every rank: give --draft-model PATH "
                         "(n-gram drafting needs no drafter on the other ranks)")


def serves_mtp(spec) -> bool:
    """The server's drafter is an MTP drafter (the Gemma 4 assistant, one trained here)."""
    from engines.mlx_chat.mtp import is_assistant_dir

    return spec.method == "mtp" or bool(spec.draft_model and is_assistant_dir(spec.draft_model))


def limit_memory(gb: float | None) -> None:
    """MLX's memory limit: enforced by its Metal allocator; on the CPU backend it is advice,
    so check_memory_limit measures the load's peak against it as well."""
    if gb is not None:
        import mlx.core as mx

        if gb <= 0:
            raise UsageError("--memory-limit must be > 0 (GB)")
        mx.set_memory_limit(int(gb * 2**30))
        mx.reset_peak_memory()


def check_memory_limit(gb: float | None, what: str) -> None:
    if gb is None:
        return
    import mlx.core as mx

    from engines.types import EngineError

    peak = mx.get_peak_memory()
    if peak > gb * 2**30:
        raise EngineError(f"{what} took {peak / 2**30:.3f} GB to load, over --memory-limit {gb:g} GB: "
                          "split it over more ranks (--ranks N)")
