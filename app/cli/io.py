"""The command line's dealings with the terminal and the files around a run (no Qt): reading the
prompt from a file or stdin, Ctrl-C that ends the run at the next round, prefill progress on
stderr, and stdout that may be a closed pipe or a full disk.

Each follows what command-line tools do: `... | head` ends quietly; a full disk is one line; the
first Ctrl-C finishes the current round and reports what was made (exit 130), a second one
stops at once."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from typing import Iterator

from engines.types import PrefillProgress

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what `yes | head` reports for `yes`
EXIT_OUTPUT_FAILED = 1


class PromptError(Exception):
    """The prompt could not be read; the message is one line."""


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """--prompt TEXT, --prompt - (stdin, as mlx-lm), or --prompt-file PATH (- for stdin too):
    a prompt too long for one shell argument goes through a file or a pipe."""
    source = prompt_file if prompt_file is not None else prompt
    if source == "-":
        try:
            return sys.stdin.read()
        except UnicodeDecodeError:
            raise PromptError("the prompt on stdin is not UTF-8 text")
    if prompt_file is None:
        return prompt or ""
    try:
        with open(prompt_file, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise PromptError(f"cannot read prompt file {prompt_file}: not UTF-8 text")
    except OSError as e:
        raise PromptError(f"cannot read prompt file {prompt_file}: {e.strerror or e}")


class Interrupt:
    """The first SIGINT asks the run to stop after the current round (polled as `should_stop`);
    the second raises KeyboardInterrupt as usual."""

    def __init__(self):
        self.requested = False

    def __call__(self) -> bool:
        return self.requested

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nspecscope: stopping after this round (Ctrl-C again to stop now)", file=sys.stderr, flush=True)

    @contextmanager
    def installed(self) -> Iterator["Interrupt"]:
        previous = signal.signal(signal.SIGINT, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


class PrefillMeter:
    """Prefill progress on stderr: nothing for a prompt read in one chunk; for a longer one a
    line per chunk (rewritten in place on a terminal)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.shown = False

    def __call__(self, progress: PrefillProgress) -> None:
        if progress.done == progress.total and not self.shown:
            return  # read in one chunk: nothing worth a line
        self.shown = True
        tty = self.stream.isatty()
        line = f"specscope: {progress.describe()}"
        try:
            if tty:
                self.stream.write("\r\033[K" + line + ("\n" if progress.done == progress.total else ""))
            else:
                self.stream.write(line + "\n")
            self.stream.flush()
        except OSError:
            pass  # progress is a courtesy; a closed stderr must not stop the run


def silence_stdout() -> None:
    """After stdout failed: point it at /dev/null so the interpreter's final flush of what is
    still buffered does not print 'Exception ignored ... BrokenPipeError' on the way out."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def stdout_failed(error: OSError) -> int:
    """The exit for a write to stdout that failed: quiet for a closed pipe (the reader has
    what it wanted), one line for anything else (a full disk)."""
    silence_stdout()
    if isinstance(error, BrokenPipeError):
        return EXIT_CLOSED_PIPE
    print(f"specscope: error: cannot write the output: {error.strerror or error}", file=sys.stderr)
    return EXIT_OUTPUT_FAILED
