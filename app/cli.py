"""The command line: `specscope chat | ocr | bench | convert | models`. No Qt here.

Bad input gets one clear line on stderr and exit code 2, never a traceback. Flag names follow
mlx-lm's where they overlap (--model, --prompt, --system-prompt is --system here,
--max-tokens, --temp, --top-p, --top-k, --min-p, --seed, --draft-model, --ignore-chat-template).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from app.cli_io import EXIT_INTERRUPTED, Interrupt, PrefillMeter, PromptError, read_prompt, stdout_failed
from engines.types import EngineError, Request, Sampling, SpecConfig
from engines.speculative.schedule import DEFAULT_STEPS, MAX_STEPS, PRESETS
from engines.speculative.trace import TraceError, TraceWriter
from app.connect import add_server_arguments, run_on_server
from app.documents import EXPORT_FORMATS, PageResult, export_text, pages_of, parse_page_ranges, summarize
from engines.speculative.repetition import DEFAULT_MAX_REPEAT
from engines.validation import InvalidParameter, validate

EXIT_BAD_INPUT = 2

# Request fields as the CLI spells them, for InvalidParameter messages (engines.validation).
FLAGS = {"temperature": "--temp", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p", "seed": "--seed",
         "max_tokens": "--max-tokens", "stop": "--stop", "spec": "--spec", "steps": "--steps",
         "skip_streak": "--skip-streak", "ngram_min": "--ngram-min", "ngram_max": "--ngram-max",
         "max_steps": "--preset's max steps", "min_steps": "min steps", "max_repeat": "--max-repeat"}


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), not usage + error."""

    def error(self, message: str):
        raise UsageError(message)


def add_spec_arguments(p: argparse.ArgumentParser, methods: list[str], default_method: str) -> None:
    p.add_argument("--spec", choices=methods, default=default_method, help=f"speculation method (default {default_method})")
    p.add_argument("--steps", type=int, default=None, help=f"drafts per round, 0..{MAX_STEPS} (0 = plain decoding; "
                   f"default per method: {', '.join(f'{m} {DEFAULT_STEPS[m]}' for m in methods if m != 'off')})")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="block-size preset (B counts the target token)")
    p.add_argument("--adaptive", action="store_true", help="adapt the draft length to acceptance")
    p.add_argument("--skip-streak", type=int, default=0, help="skip drafting once after N zero-accept rounds (0 = off)")
    if "ngram" in methods:  # the n-gram lookup's own settings, only where it can be chosen
        p.add_argument("--ngram-min", type=int, default=1, help="n-gram lookup: shortest suffix to match")
        p.add_argument("--ngram-max", type=int, default=4, help="n-gram lookup: longest suffix to match")
    p.add_argument("--max-tokens", "-m", type=int, default=256)
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0, help="mlx-lm's min-p (0 = off)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-repeat", type=int, default=DEFAULT_MAX_REPEAT, metavar="N",
                   help=f"stop when the output repeats one block N times in a row (default {DEFAULT_MAX_REPEAT}; 0 = off)")


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    """What a single run writes (bench writes its own reports)."""
    p.add_argument("--trace", default=None, help="append one NDJSON line per round to this file")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of streaming text")


def chat_parser() -> Parser:
    p = Parser(prog="specscope chat", description="Chat with an mlx-lm model (HF directory or GGUF file).")
    p.add_argument("--model", default=None, help="catalog id, hub repo id (after `models get`), directory or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", "-p", help="the prompt; - reads it from stdin")
    prompt.add_argument("--prompt-file", "-f", metavar="PATH", help="read the prompt from PATH (- for stdin)")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--draft-model", default=None, help="draft model (--spec draft) or Gemma 4 assistant (--spec mtp; default: the target's paired assistant)")
    p.add_argument("--ignore-chat-template", action="store_true", help="tokenize the raw prompt, no chat template")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop before this text (repeatable)")
    add_spec_arguments(p, ["off", "ngram", "draft", "mtp"], "ngram")
    add_output_arguments(p)
    add_server_arguments(p)
    return p


def ocr_parser() -> Parser:
    p = Parser(prog="specscope ocr", description="Read document images and PDFs with GLM-OCR, page by page.")
    p.add_argument("files", nargs="+", metavar="FILE", help="images, multi-page TIFFs or PDFs, read in order")
    p.add_argument("--model", default="glm-ocr", help="catalog id, hub repo id, GLM-OCR HF checkpoint (torch runtime) or converted directory (default: glm-ocr)")
    p.add_argument("--runtime", choices=["coreml", "torch"], default=None, help="default: coreml for a converted directory on macOS, else torch")
    p.add_argument("--task", choices=["text", "table", "formula"], default="text")
    p.add_argument("--pages", default=None, metavar="LIST", help="pages of each PDF / TIFF to read, e.g. 1-3,7 (default: all)")
    p.add_argument("--format", choices=EXPORT_FORMATS, default=None,
                   help="print the document at the end as Markdown, plain text or JSON (per page: text, task, "
                        "model, runtime, rounds summary) instead of streaming its text")
    add_spec_arguments(p, ["off", "mtp"], "mtp")
    add_output_arguments(p)
    add_server_arguments(p)
    return p


def spec_config(args: argparse.Namespace, builtin_drafter: bool = False) -> SpecConfig:
    """--spec/--steps/--preset/--adaptive into a SpecConfig. `builtin_drafter`: the model carries
    its own MTP layer (GLM-OCR), so --spec mtp needs no --draft-model."""
    method = args.spec
    preset = PRESETS[args.preset] if args.preset else None
    if args.steps is not None:
        steps = args.steps
    elif preset:
        steps = preset.steps
    else:
        steps = DEFAULT_STEPS[method]
    draft_model = getattr(args, "draft_model", None)
    if method in ("draft", "mtp") and steps > 0 and not draft_model and not builtin_drafter:
        raise UsageError(f"--spec {method} needs --draft-model PATH")
    return SpecConfig(
        method=method if steps > 0 else "off",
        steps=steps,
        adaptive=args.adaptive,
        max_steps=preset.max_steps if preset else MAX_STEPS,
        skip_streak=args.skip_streak,
        draft_model=draft_model,
        ngram_min=getattr(args, "ngram_min", 1),
        ngram_max=getattr(args, "ngram_max", 4),
    )


def sampling(args: argparse.Namespace) -> Sampling:
    return Sampling(temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, seed=args.seed)


def checked(request: Request) -> Request:
    """The shared parameter check (engines.validation), before anything is loaded."""
    validate(request)
    return request


def open_trace(args: argparse.Namespace) -> TraceWriter | None:
    # Opened before the model loads, so an unwritable path fails in a second, not a minute.
    return TraceWriter(args.trace) if args.trace else None


def run_and_report(engine, request: Request, args: argparse.Namespace, trace: TraceWriter | None,
                   stream: bool | None = None, label: str = ""):
    """Run to the end (or to the round after Ctrl-C), streaming the text (or printing --json),
    the stats line to stderr; returns the Session. The caller closes the trace (the pages of a
    document append their runs to one trace). A trace that stops being writable is said once
    and the run goes on without it."""
    from engines.runs import run_session

    stream = not args.json if stream is None else stream
    if trace is not None:
        trace.on_error = lambda message: print(f"specscope: warning: {message}; the run goes on without the trace",
                                               file=sys.stderr, flush=True)
        trace.write_header({"request": request.to_dict(), "model": engine.model_info()})

    def on_round(rnd) -> None:
        if rnd.note:  # e.g. why this run decodes plainly: said on stderr, --json or not
            print(f"specscope: {rnd.note}", file=sys.stderr)
        if stream:
            write_stdout(rnd.text)

    interrupt = Interrupt()
    with interrupt.installed():
        session = run_session(engine, request, on_round=on_round, trace=trace, should_stop=interrupt,
                              on_prefill=PrefillMeter())
    if args.json:
        write_stdout(json.dumps(session.to_dict(), ensure_ascii=False) + "\n")
    else:
        if stream:
            write_stdout("\n")  # flushed: a piped stdout never takes the stats line in mid-text
        print((f"[{label}] " if label else "") + stats_line(session), file=sys.stderr, flush=True)
    return session


def exit_code(session) -> int:
    return EXIT_INTERRUPTED if session.finish == "cancelled" else 0


def stats_line(session) -> str:
    s = session.stats()
    fallback = f"; {s.fallback}" if s.fallback else ""  # the drafter failed; decoding went on plainly
    return (f"[{s.decode_rounds} rounds, {s.tokens} tokens, {s.decode_tok_s:.1f} tok/s decode, "
            f"tau {s.tau:.2f}, acceptance {100 * s.acceptance_rate:.0f}%, ttft {1000 * s.ttft_s:.0f} ms, "
            f"finish {session.finish}{fallback}]")


class StdoutFailed(Exception):
    """Writing to stdout failed (a closed pipe, a full disk); `error` is the OSError."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        raise StdoutFailed(e) from e


def load_chat_engine(model: str | None, draft_model: str | None):
    from engines.factory import load_engine

    if model is None:
        from engines.mlx_chat.models import default_chat_model

        model = str(default_chat_model())
    return load_engine("chat", model, draft_model=draft_model)


def pick_drafter(args: argparse.Namespace) -> None:
    """--spec mtp without --draft-model: the target's paired assistant in the catalog, if any."""
    from app.models.cli import paired_drafter

    if args.spec == "mtp" and not args.draft_model and args.model:
        args.draft_model = paired_drafter(args.model)


def resolve_models(args: argparse.Namespace, spec: SpecConfig, role: str) -> None:
    """--model and the drafter: catalog ids and hub repo ids become local paths (paths stay)."""
    from app.models.cli import model_path

    args.model = model_path(args.model, role)
    spec.draft_model = model_path(spec.draft_model, ("drafter", "chat"))


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


def cmd_ocr(argv: list[str]) -> int:
    """Every page of every FILE in order, in one process (the model loads once). Streams each
    page's text as it is read (a Markdown heading per page when there are several), or prints
    the whole document at the end with --format (or one page's rounds with --json)."""
    from app.settings import data_dir

    args = ocr_parser().parse_args(argv)
    if args.json and args.format:
        raise UsageError("--json prints one page's rounds, --format json every page's text and summary: pick one")
    wanted = parse_page_ranges(args.pages) if args.pages else None
    pages = pages_of(args.files, data_dir() / "pages", wanted)
    if args.json and len(pages) > 1:
        raise UsageError(f"--json prints one page's rounds and the input has {len(pages)} pages; use --format json")
    requests = [checked(Request(
        kind="ocr", image=page.image, task=args.task, max_tokens=args.max_tokens,
        spec=spec_config(args, builtin_drafter=True), sampling=sampling(args), max_repeat=args.max_repeat,
    )) for page in pages]
    check_images([page.image for page in pages])
    if args.server:
        if args.format or len(pages) > 1:
            raise UsageError("--server reads one page at a time without --format: give one image")
        args.model = None if args.model == "glm-ocr" else args.model  # the catalog default is no server id
        return run_on_server(args, requests[0])
    resolve_models(args, requests[0].spec, "ocr")
    trace = open_trace(args)
    from app.models.store import leases
    from engines.factory import load_engine

    try:
        with leases(args.model):
            engine = load_engine("ocr", args.model, runtime=args.runtime)
            results = read_pages(engine, pages, requests, args, trace)
    finally:
        if trace is not None:
            trace.close()
    if args.format:
        write_stdout(export_text(results, args.format))
    if len(pages) > 1:
        print(f"[document: {summarize(results).line()}]", file=sys.stderr, flush=True)
    return exit_code(results[-1].session)


def read_pages(engine, pages, requests: list[Request], args: argparse.Namespace,
               trace: TraceWriter | None) -> list[PageResult]:
    """The pages in order; Ctrl-C ends the page being read and the document there."""
    stream = not args.json and not args.format
    results = []
    for i, (page, request) in enumerate(zip(pages, requests)):
        if stream and len(pages) > 1:
            write_stdout(("\n" if i else "") + f"## {page.label}\n\n")
        session = run_and_report(engine, request, args, trace, stream, page.label if len(pages) > 1 else "")
        results.append(PageResult(page, session))
        if session.finish == "cancelled":
            break
    return results


def check_images(paths: list[str]) -> None:
    """Decode each input before the model loads (seconds), so a bad file is said at once."""
    from engines.glm_ocr.image import load_image

    for path in paths:
        load_image(path).close()  # EngineError: one line naming the file and what is wrong


def cmd_convert(argv: list[str]) -> int:
    p = Parser(prog="specscope convert", description="Convert a checkpoint to Core ML packages.")
    p.add_argument("what", choices=["glm-ocr"])
    p.add_argument("--from", dest="source", required=True, help="GLM-OCR HF checkpoint directory")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seq-len", type=int, default=8)
    p.add_argument("--cache-length", type=int, default=2048)
    args = p.parse_args(argv)
    if not 2 <= args.seq_len <= 64:
        raise UsageError("--seq-len must be between 2 and 64")
    if args.cache_length < args.seq_len:
        raise UsageError("--cache-length must be at least --seq-len")
    from engines.glm_ocr.convert import convert_glm_ocr

    def progress(message: str, fraction: float) -> None:
        print(f"[{100 * fraction:5.1f}%] {message}", file=sys.stderr, flush=True)

    manifest = convert_glm_ocr(args.source, args.out, seq_len=args.seq_len, cache_length=args.cache_length, progress=progress)
    print(json.dumps(manifest.get("parity", manifest), indent=1))
    return 0


def bench_parser() -> Parser:
    p = Parser(prog="specscope bench", description="Speculation off vs on: warm-up, N runs each (alternating), medians.")
    sub = p.add_subparsers(dest="engine", required=True)
    chat = sub.add_parser("chat", help="chat models over a prompt set")
    chat.add_argument("--model", default=None, help="model directory or .gguf (default: the embedded SmolLM2)")
    chat.add_argument("--draft-model", default=None)
    chat.add_argument("--prompts", default=None, help="JSON {prompts: [{name, prompt}]} or text, one prompt per line (default: the copy-heavy set)")
    chat.add_argument("--system", default=None)
    add_spec_arguments(chat, ["ngram", "draft", "mtp"], "ngram")
    add_server_arguments(chat, baseline=True)
    ocr = sub.add_parser("ocr", help="GLM-OCR over images")
    ocr.add_argument("images", nargs="+")
    ocr.add_argument("--model", required=True)
    ocr.add_argument("--runtime", choices=["coreml", "torch"], default=None)
    ocr.add_argument("--task", choices=["text", "table", "formula"], default="text")
    add_spec_arguments(ocr, ["mtp"], "mtp")
    for q in (chat, ocr):
        q.add_argument("--runs", type=int, default=3)
        q.add_argument("--warmup", type=int, default=1)
        q.add_argument("--limit", type=int, default=None, help="only the first N prompts / images")
        q.add_argument("--out", default="bench/results", help="directory for the JSON and CSV reports")
    return p


def load_prompts(path: str | None) -> list[tuple[str, str]]:
    import resources

    source = Path(path) if path else resources.path("prompts", "copy_heavy.json")
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read prompts file {source}: {e.strerror}")
    if source.suffix == ".json":
        try:
            return [(p["name"], p["prompt"]) for p in json.loads(text)["prompts"]]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{source}: expected {{\"prompts\": [{{\"name\": ..., \"prompt\": ...}}]}}")
    return [(f"line-{i + 1}", line) for i, line in enumerate(text.splitlines()) if line.strip()]


def cmd_bench(argv: list[str]) -> int:
    from engines.factory import load_engine
    from engines.runs import bench_case, bench_document, check_writable

    args = bench_parser().parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        raise UsageError("--runs must be >= 1 and --warmup >= 0")
    try:  # before the benchmark runs, not after
        check_writable(Path(args.out))
    except OSError as e:
        raise UsageError(f"cannot write to --out {args.out}: {e.strerror or e}")
    if args.engine == "chat" and args.server:
        from app.connect import bench_servers

        return bench_servers(args)
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
        engine = load_engine("ocr", args.model, runtime=args.runtime)
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


def save_bench(doc: dict, out: Path) -> int:
    """The results are never lost: --out, else a temporary folder, else the JSON on stdout;
    each fallback says where the results went (exit 1 when --out was not written)."""
    import tempfile

    from engines.runs import write_bench

    for folder in (out, Path(tempfile.gettempdir()) / "specscope-bench"):
        try:
            json_path, csv_path = write_bench(doc, folder)
        except OSError as e:
            print(f"specscope: cannot write the results to {folder}: {e.strerror or e}", file=sys.stderr)
            continue
        print(f"wrote {json_path} and {csv_path}", file=sys.stderr)
        return 0 if folder == out else 1
    print("specscope: the results follow on stdout", file=sys.stderr)
    write_stdout(json.dumps(doc, indent=1) + "\n")
    return 1


def cmd_models(argv: list[str]) -> int:
    from app.models.cli import run

    return run(argv)


def cmd_serve(argv: list[str]) -> int:
    from app.serve.cli import cmd_serve as serve

    return serve(argv)


COMMANDS = {"chat": cmd_chat, "ocr": cmd_ocr, "bench": cmd_bench, "convert": cmd_convert, "models": cmd_models,
            "serve": cmd_serve}

TOP_HELP = f"""usage: specscope [--screenshot PATH --chat PROMPT | --ocr FILE...] [options]   (opens the window)
       specscope {{{','.join(COMMANDS)}}} ...                              (command line)

  chat      chat with an mlx-lm model, speculation off | ngram | draft | mtp
  ocr       read a document image with GLM-OCR (torch or Core ML runtime), MTP speculation
  bench     speculation off vs on over a prompt set: tau, acceptance, tok/s, speedup
  convert   convert GLM-OCR to Core ML packages
  models    list | get ID | rm ID | add PATH | path ID: the model catalog and downloads
  serve     an OpenAI-compatible server over the engines, with speculation counters

`specscope COMMAND --help` for a command's options."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Library chatter (transformers' config warnings, tokenizers' fork notices) is not for users
    # of a CLI whose stderr carries progress and one-line errors.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if argv and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        if argv and argv[0] in ("-h", "--help", "help"):
            from app.gui import add_gui_arguments

            window = Parser(prog="specscope", usage=argparse.SUPPRESS, add_help=False)
            add_gui_arguments(window)
            print(TOP_HELP + "\n\n" + window.format_help().strip())
            return 0
        if argv and argv[0] == "--version":
            from app import __version__

            print(f"specscope {__version__}")
            return 0
        from app.gui import add_gui_arguments, run_gui

        p = Parser(prog="specscope", description="Specscope desktop app.")
        add_gui_arguments(p)
        return run_gui(p.parse_args(argv))
    except InvalidParameter as e:
        print(f"specscope: error: {FLAGS.get(e.name, e.name)} {e.problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except StdoutFailed as e:
        return stdout_failed(e.error)
    except BrokenPipeError as e:  # a listing piped into `head`
        return stdout_failed(e)
    except (UsageError, EngineError, TraceError, PromptError) as e:
        print(f"specscope: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\nspecscope: interrupted", file=sys.stderr)
        return 130
