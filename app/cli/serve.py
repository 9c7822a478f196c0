"""`specscope serve ...`: load the engines, then answer HTTP until interrupted."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.common import (Parser, UsageError, add_spec_arguments, load_chat_engine, pick_drafter, resolve_models,
                            spec_config)
from app.serve.protocol import ServedModel
from app.serve.server import DEFAULT_MAX_BATCH, ServeConfig, Served, build_app, serve_forever


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def serve_parser(parser_class) -> argparse.ArgumentParser:
    p = parser_class(prog="specscope serve", description="Serve the chat (and GLM-OCR) engines over an "
                     "OpenAI-compatible HTTP API: /v1/chat/completions, /v1/models, /health, /metrics.")
    p.add_argument("--model", default=None, help="chat model: catalog id, hub repo id, directory or .gguf (default: the embedded SmolLM2)")
    p.add_argument("--model-name", default=None, help="the id clients ask for (default: the model's file name)")
    p.add_argument("--draft-model", default=None, help="draft model (--spec draft) or Gemma 4 assistant (--spec mtp)")
    p.add_argument("--ocr-model", default=None, help="also serve GLM-OCR (catalog id or checkpoint; image content parts)")
    p.add_argument("--ocr-runtime", choices=["torch", "coreml", "coreml-twin"], default=None)
    p.add_argument("--no-chat", action="store_true", help="serve only the OCR model")
    p.add_argument("--host", default="127.0.0.1", help="default loopback; another address needs --api-key or --insecure")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback --host without --api-key")
    p.add_argument("--queue-size", type=int, default=4, help="requests that may wait for a row of the batch (or behind the running one)")
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                   help=f"chat requests decoded together, one target forward per step (default {DEFAULT_MAX_BATCH}; 1 = one at a time)")
    p.add_argument("--prompt-cache", type=int, default=512, metavar="MB",
                   help="prompts read before, kept for requests that start the same (default 512 MB; 0 = off)")
    p.add_argument("--allowed-hosts", type=comma_list, default=(), metavar="NAME,...",
                   help="Host names served besides localhost, 127.0.0.1 and [::1] (a reverse proxy, a .local name)")
    p.add_argument("--allowed-origins", type=comma_list, default=(), metavar="ORIGIN,...",
                   help="browser origins that may call the API (CORS), e.g. http://localhost:3000; others get 403")
    add_spec_arguments(p, ["off", "ngram", "draft", "mtp"], "ngram")
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
    served: list[Served] = []
    if not args.no_chat:
        pick_drafter(args)
        spec = spec_config(args)
        asked = args.model  # a catalog id names the model better than its cache folder does
        resolve_models(args, spec, "chat")
        engine = load_chat_engine(args.model, spec.draft_model)
        name = args.model_name or Path(asked or engine.model_path).name
        served.append(Served(ServedModel(name, "chat", spec), engine))
    if args.ocr_model:
        from app.models.lookup import model_path

        ocr_args = argparse.Namespace(**vars(args) | {"spec": "mtp" if args.spec != "off" else "off"})
        spec = spec_config(ocr_args, builtin_drafter=True)
        engine = load_engine("ocr", model_path(args.ocr_model, "ocr"), runtime=args.ocr_runtime)
        served.append(Served(ServedModel(Path(args.ocr_model).name, "ocr", spec), engine))
    app = build_app(config, served)
    print(f"specscope serve: {', '.join(s.model.id for s in served)} on http://{args.host}:{args.port}/v1",
          file=sys.stderr, flush=True)
    serve_forever(app, config)
    return 0
