"""`specscope chat`: one prompt to an mlx-lm model (or a server), streamed with its stats."""

from __future__ import annotations

from app.cli.common import (Parser, UsageError, add_output_arguments, add_spec_arguments, advanced, checked, exit_code,
                            load_chat_engine, open_trace, pick_drafter, resolve_models, run_and_report, sampling,
                            spec_config)
from app.cli.connect import add_server_arguments, run_on_server
from app.cli.io import read_prompt
from engines.types import Request


def chat_parser() -> Parser:
    p = Parser(prog="specscope chat", description="Chat with an mlx-lm model (HF directory or GGUF file).")
    p.add_argument("--model", default=None, metavar="ID|PATH", help="catalog id, hub repo id (after `models get`), directory or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", "-p", help="the prompt; - reads it from stdin")
    prompt.add_argument("--prompt-file", "-f", metavar="PATH", help="read the prompt from PATH (- for stdin)")
    p.add_argument("--system", default=None, metavar="TEXT", help="system prompt")
    p.add_argument("--draft-model", default=None, metavar="ID|PATH", help="draft model (--spec draft) or Gemma 4 assistant (--spec mtp; default: the target's paired assistant)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop before this text (repeatable)")
    add_spec_arguments(p, ["off", "ngram", "draft", "mtp"], "ngram")
    add_output_arguments(p)
    add_server_arguments(p)
    advanced(p).add_argument("--ignore-chat-template", action="store_true", help="tokenize the raw prompt, no chat template")
    return p



def cmd_chat(argv: list[str]) -> int:
    args = chat_parser().parse_args(argv)
    args.prompt = read_prompt(args.prompt, args.prompt_file)
    if not args.prompt.strip():
        raise UsageError("the prompt is empty")
    if not args.server:
        pick_drafter(args)
    request = checked(Request(
        kind="chat", prompt=args.prompt, system=args.system, max_tokens=args.max_tokens, stop=args.stop,
        ignore_chat_template=args.ignore_chat_template, spec=spec_config(args, builtin_drafter=bool(args.server)),
        sampling=sampling(args), max_repeat=args.max_repeat,
    ))
    if args.server:
        return run_on_server(args, request)
    resolve_models(args, request.spec, "chat")
    trace = open_trace(args)
    from app.models.store import leases

    try:
        with leases(args.model, request.spec.draft_model):  # `models rm` refuses while this runs
            engine = load_chat_engine(args.model, request.spec.draft_model)
            return exit_code(run_and_report(engine, request, args, trace))
    finally:
        if trace is not None:
            trace.close()
