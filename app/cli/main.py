"""The command line's top: `specscope chat | ocr | bench | convert | models | serve | drafter | tune` to the
command's module, no command to the window (app.gui.startup); every error the commands raise
becomes one line on stderr and an exit code here. No Qt is imported unless the window opens.
"""

from __future__ import annotations

import argparse
import os
import sys

from app.cli.bench import cmd_bench
from app.cli.chat import cmd_chat
from app.cli.common import EXIT_BAD_INPUT, FLAGS, Parser, StdoutFailed, UsageError
from app.cli.convert import cmd_convert
from app.cli.io import PromptError, stdout_failed
from app.cli.ocr import cmd_ocr
from engines.speculative.trace import TraceError
from engines.types import EngineError
from engines.validation import InvalidParameter

def cmd_models(argv: list[str]) -> int:
    from app.cli.models import cmd_models as models  # imported when used: the hub client

    return models(argv)


def cmd_serve(argv: list[str]) -> int:
    from app.cli.serve import cmd_serve as serve  # imported when used: Starlette, uvicorn

    return serve(argv)


def cmd_drafter(argv: list[str]) -> int:
    from app.cli.drafter import cmd_drafter as drafter  # imported when used: the trainer

    return drafter(argv)


def cmd_tune(argv: list[str]) -> int:
    from app.cli.tune import cmd_tune as tune  # imported when used: the model loads

    return tune(argv)


COMMANDS = {"chat": cmd_chat, "ocr": cmd_ocr, "bench": cmd_bench, "convert": cmd_convert, "models": cmd_models,
            "serve": cmd_serve, "drafter": cmd_drafter, "tune": cmd_tune}

TOP_HELP = f"""usage: specscope [--screenshot PATH --chat PROMPT | --ocr FILE...] [options]   (opens the window)
       specscope {{{','.join(COMMANDS)}}} ...                              (command line)

  chat      chat with an mlx-lm model, speculation off | ngram | draft | mtp
  ocr       read a document image with GLM-OCR (PyTorch or Core ML runtime), MTP speculation
  bench     speculation off vs on over a prompt set: tau, acceptance, tok/s, speedup
  convert   convert GLM-OCR to Core ML packages
  models    list | get ID | rm ID | add PATH | path ID: the model catalog and downloads
  serve     an OpenAI-compatible server over the engines, with speculation counters
  drafter   train ...: train an MTP drafter for a chat model on this machine (--spec mtp uses it)
  tune      measure this machine's speculation costs for a model (--steps auto chooses from them)

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
            from app.gui.startup import add_gui_arguments

            window = Parser(prog="specscope", usage=argparse.SUPPRESS, add_help=False)
            add_gui_arguments(window)
            print(TOP_HELP + "\n\n" + window.format_help().strip())
            return 0
        if argv and argv[0] == "--version":
            from app import __version__

            print(f"specscope {__version__}")
            return 0
        from app.gui.startup import add_gui_arguments, run_gui

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
