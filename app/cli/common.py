"""The bottom of the command line, shared by every command: the parser and its errors, the
speculation / sampling / output arguments, running one request and reporting it, loading the
engine and resolving model ids. Imports no command module (app.cli.main dispatches). No Qt.

Bad input gets one clear line on stderr and exit code 2, never a traceback (app.cli.main turns
these errors into it). Flag names follow mlx-lm's where they overlap (--model, --prompt,
--system-prompt is --system here, --max-tokens, --temp, --top-p, --top-k, --min-p, --seed,
--draft-model, --ignore-chat-template).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.cli.io import EXIT_INTERRUPTED, Interrupt, PrefillMeter
from engines.types import Request, Sampling, SpecConfig
from engines.speculative.schedule import DEFAULT_STEPS, MAX_STEPS, PRESETS
from engines.speculative.trace import TraceWriter
from engines.speculative.repetition import DEFAULT_MAX_REPEAT
from engines.validation import validate

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


def advanced(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The group every command's --help lists last, under "advanced": the options a run seldom
    needs (tuning knobs, the alternatives to measured defaults), after those a user needs. One
    per parser, whoever asks for it first."""
    for group in p._action_groups:
        if group.title == "advanced":
            return group
    return p.add_argument_group("advanced")


def steps_value(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 0..{MAX_STEPS} or auto, got {text!r}") from None


def add_spec_arguments(p: argparse.ArgumentParser, methods: list[str], default_method: str) -> None:
    """The speculation and sampling options: the method, drafts a round, length and temperature
    for every run; the rest under "advanced"."""
    p.add_argument("--spec", choices=methods, default=default_method, help=f"speculation method (default {default_method})")
    p.add_argument("--steps", type=steps_value, default=None, metavar="K|auto",
                   help=f"drafts per round, 0..{MAX_STEPS} (0 = plain decoding; "
                   f"default per method: {', '.join(f'{m} {DEFAULT_STEPS[m]}' for m in methods if m != 'off')}), "
                   "or auto: per round, what this machine's measured costs say pays (`specscope tune` measures them)")
    p.add_argument("--max-tokens", "-m", type=int, default=256, metavar="N", help="tokens to write at most (default 256)")
    p.add_argument("--temp", type=float, default=0.0, metavar="T", help="sampling temperature (default 0 = greedy)")
    more = advanced(p)
    more.add_argument("--preset", choices=sorted(PRESETS), default=None, help="block-size preset (B counts the target token)")
    more.add_argument("--adaptive", action="store_true", help="adapt the draft length to acceptance")
    more.add_argument("--skip-streak", type=int, default=0, metavar="N",
                      help="skip drafting once after N zero-accept rounds (default 0 = off)")
    if {"draft", "mtp"} & set(methods):
        more.add_argument("--with-ngram", action="store_true", help="with --spec draft|mtp: n-gram lookup beside the "
                          "drafter; each round drafts from whichever this run's costs and acceptance expect to pay more")
    if "ngram" in methods:  # the n-gram lookup's own settings, only where it can be chosen
        more.add_argument("--ngram-min", type=int, default=1, metavar="N",
                          help="n-gram lookup: shortest suffix to match (default 1)")
        more.add_argument("--ngram-max", type=int, default=4, metavar="N",
                          help="n-gram lookup: longest suffix to match (default 4)")
    more.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling's p (default 1 = off)")
    more.add_argument("--min-p", type=float, default=0.0, metavar="P", help="mlx-lm's min-p (default 0 = off)")
    more.add_argument("--top-k", type=int, default=0, metavar="K",
                      help="sample from the K most likely tokens only (default 0 = off)")
    more.add_argument("--seed", type=int, default=None, metavar="N", help="sampling's seed (default: unseeded)")
    more.add_argument("--max-repeat", type=int, default=DEFAULT_MAX_REPEAT, metavar="N",
                      help=f"stop when the output repeats one block N times in a row (default {DEFAULT_MAX_REPEAT}; 0 = off)")


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    """What a single run writes (bench writes its own reports)."""
    p.add_argument("--json", action="store_true", help="print one JSON document instead of streaming text")
    advanced(p).add_argument("--trace", default=None, metavar="FILE", help="append one NDJSON line per round to FILE")


def spec_config(args: argparse.Namespace, builtin_drafter: bool = False) -> SpecConfig:
    """--spec/--steps/--preset/--adaptive into a SpecConfig. `builtin_drafter`: the model carries
    its own MTP layer (GLM-OCR), so --spec mtp needs no --draft-model."""
    method = args.spec
    preset = PRESETS[args.preset] if args.preset else None
    auto = args.steps == "auto"
    if args.steps is not None and not auto:
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
        compose_ngram=getattr(args, "with_ngram", False) and method in ("draft", "mtp"),
        auto=auto,
        profile=str(profiles_dir()) if auto else None,
    )


def profiles_dir():
    """Where `specscope tune` keeps its profiles (app.settings: the window's Tune… too)."""
    from app.settings import profiles_dir

    return profiles_dir()


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
        print((f"[{label}] " if label else "") + stats_line(session, runtime_label(engine)), file=sys.stderr, flush=True)
    return session


def exit_code(session) -> int:
    return EXIT_INTERRUPTED if session.finish == "cancelled" else 0


def stats_line(session, runtime: str | None = None) -> str:
    s = session.stats()
    fallback = f"; {s.fallback}" if s.fallback else ""  # the drafter failed; decoding went on plainly
    ran_on = f", runtime {runtime}" if runtime else ""
    return (f"[{s.decode_rounds} rounds, {s.tokens} tokens, {s.decode_tok_s:.1f} tok/s decode, "
            f"tau {s.tau:.2f}, acceptance {100 * s.acceptance_rate:.0f}%, ttft {1000 * s.ttft_s:.0f} ms, "
            f"finish {session.finish}{ran_on}{fallback}]")


def runtime_label(engine) -> str | None:
    """The OCR runtime a run used, for the stats line: "torch (bfloat16)", "coreml (all)",
    "coreml-twin"; None for engines that do not name one."""
    try:
        info = engine.model_info()
    except Exception:  # noqa: BLE001 -- the stats line never fails a finished run
        return None
    runtime = info.get("runtime") if isinstance(info, dict) else None
    if not runtime:
        return None
    detail = info.get("dtype") if runtime == "torch" else info.get("compute_units") if runtime == "coreml" else None
    return f"{runtime} ({detail})" if detail else runtime


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


# engines.glm_ocr.runtime_fast.DTYPES, spelled here: importing it would load torch to parse flags
OCR_DTYPES = ("float32", "bfloat16", "float16")


def thread_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of threads, at least 1; got {text!r}")
    return int(text)


def add_ocr_compute_arguments(group, prefix: str = "") -> None:
    """How GLM-OCR's torch runtime computes: --dtype and --threads (`serve`: --ocr-dtype,
    --ocr-threads). The Core ML runtimes have neither."""
    group.add_argument(f"--{prefix}dtype", choices=OCR_DTYPES, default=None,
                       help="the torch runtime's compute dtype (default float32; bfloat16 holds the weights in a "
                            "third of the memory and decodes faster, but its speculative output may differ from "
                            "its plain output)")
    group.add_argument(f"--{prefix}threads", type=thread_count, default=None, metavar="N",
                       help="the torch runtime's threads for decode and the vision tower (default: one per core; "
                            "1 is steadier on a machine busy with other work)")


def ocr_load_options(args: argparse.Namespace, prefix: str = "") -> dict:
    """load_engine("ocr", ...)'s options as the command line gave them (None: the engine's default)."""
    def given(name: str):
        return getattr(args, prefix.replace("-", "_") + name)

    return {"runtime": given("runtime"), "dtype": given("dtype"), "threads": given("threads")}


DEFAULT_CHAT_ID = "smollm2-135m-instruct"  # the catalog id of the embedded default (no --model)


def pick_drafter(args: argparse.Namespace) -> None:
    """--spec mtp without --draft-model: the target's paired drafter in the catalog (a Gemma 4
    assistant, or one trained by `specscope drafter train`), if any."""
    from app.models.lookup import paired_drafter

    if args.spec == "mtp" and not args.draft_model:
        args.draft_model = paired_drafter(args.model or DEFAULT_CHAT_ID)


def resolve_models(args: argparse.Namespace, spec: SpecConfig, role: str) -> None:
    """--model and the drafter: catalog ids and hub repo ids become local paths (paths stay)."""
    from app.models.lookup import model_path

    args.model = model_path(args.model, role)
    spec.draft_model = model_path(spec.draft_model, ("drafter", "chat"))


def check_images(paths: list[str]) -> None:
    """Decode each input before the model loads (seconds), so a bad file is said at once."""
    from engines.glm_ocr.image import load_image

    for path in paths:
        load_image(path).close()  # EngineError: one line naming the file and what is wrong


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


def save_bench(doc: dict, out: Path, **table) -> int:
    """The results are never lost: --out, else a temporary folder, else the JSON on stdout;
    each fallback says where the results went (exit 1 when --out was not written). `table`:
    write_bench's columns / rows / prefix for reports that are not off-vs-on cases."""
    import tempfile

    from engines.runs import write_bench

    for folder in (out, Path(tempfile.gettempdir()) / "specscope-bench"):
        try:
            json_path, csv_path = write_bench(doc, folder, **table)
        except OSError as e:
            print(f"specscope: cannot write the results to {folder}: {e.strerror or e}", file=sys.stderr)
            continue
        print(f"wrote {json_path} and {csv_path}", file=sys.stderr)
        return 0 if folder == out else 1
    print("specscope: the results follow on stdout", file=sys.stderr)
    write_stdout(json.dumps(doc, indent=1) + "\n")
    return 1
