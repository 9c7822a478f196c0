"""Writes docs/cli.md, the command line's reference, from the parsers `specscope` itself uses:

    python scripts/cli_docs.py           rewrite docs/cli.md
    python scripts/cli_docs.py --check   exit 1 (and show the difference) if docs/cli.md is not
                                         what the parsers say now

Every command of app/cli/main.py's COMMANDS, in its order, and their subcommands (bench chat |
ocr | serve, models list | get | ...), then the window's own options (app/gui/startup.py). Each
parser comes from the function the command builds it with; `convert` builds its parser inside
cmd_convert, so its parser is caught where cmd_convert would parse the arguments. Nothing reads
`--help` text: every row is an argparse action, its value spelled by argparse's own formatter.
tests/app/cli/test_docs.py fails when docs/cli.md and this script's output differ.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "cli.md"

HEADER = """# Command line reference

Every option of every `specscope` command, generated from the command line's own parsers by
`python scripts/cli_docs.py` (do not edit by hand: `tests/app/cli/test_docs.py` fails when this
file differs from what the parsers say). `specscope COMMAND --help` prints the same options.
What the speculation options do: [speculation.md](speculation.md); the server's endpoints:
[serve.md](serve.md); documents and OCR: [ocr.md](ocr.md).

`specscope --version` prints the version; `specscope --help` lists the commands. Bad input is one
line on stderr and exit code 2; Ctrl-C finishes the current round and exits 130
([reliability.md](reliability.md) lists every case).
"""


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


def built_by(command, argv: list[str]) -> argparse.ArgumentParser:
    """The parser `command(argv)` builds, caught where it would parse argv (for a command that
    builds its parser inline rather than in a function of its own)."""
    from app.cli.common import Parser

    original = Parser.parse_args

    def caught(self, *args, **kwargs):
        raise _Built(self)

    Parser.parse_args = caught
    try:
        command(argv)
    except _Built as built:
        return built.parser
    finally:
        Parser.parse_args = original
    raise SystemExit(f"cli_docs: {command.__name__}({argv}) built no parser")


def command_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(command, its parser) for every command app/cli/main.py dispatches, in its order."""
    from app.cli import bench, chat, convert, drafter, models, ocr, serve, tune
    from app.cli.common import Parser
    from app.cli.main import COMMANDS

    builders = {
        "chat": chat.chat_parser,
        "ocr": ocr.ocr_parser,
        "bench": bench.bench_parser,
        "convert": lambda: built_by(convert.cmd_convert, []),
        "models": models.parser,
        "serve": lambda: serve.serve_parser(Parser),
        "drafter": drafter.parser,  # `specscope drafter train`: cmd_drafter dispatches its one subcommand
        "tune": tune.parser,
    }
    unknown = [name for name in COMMANDS if name not in builders]
    if unknown:
        raise SystemExit(f"cli_docs: no parser known for {', '.join(unknown)}: add it to command_parsers()")
    return [(name, builders[name]()) for name in COMMANDS]


def window_parser() -> argparse.ArgumentParser:
    """`specscope` with no command: the window's options, as app/cli/main.py builds them."""
    from app.cli.common import Parser
    from app.gui.startup import add_gui_arguments

    p = Parser(prog="specscope", description="Specscope desktop app.")
    add_gui_arguments(p)
    return p


def one_line(text: str | None) -> str:
    return re.sub(r"\s+", " ", text or "").strip()


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def code(text: str) -> str:
    return f"`{text}`" if text else ""


def value_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """What follows the option, as argparse's own formatter spells it in --help."""
    if action.nargs == 0:
        return ""
    formatter = parser._get_formatter()
    if action.option_strings:
        return formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
    return formatter._format_args(action, formatter._get_default_metavar_for_positional(action))


def default_of(action: argparse.Action) -> str:
    default = action.default
    optional_positional = not action.option_strings and action.nargs in ("?", "*")  # argparse marks "*" required
    if action.required and not optional_positional:
        return "required"
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if default else "off"
    if default is None or default is False or default == argparse.SUPPRESS or default in ([], ()):
        return ""
    return code(str(default))


def help_of(parser: argparse.ArgumentParser, action: argparse.Action, together: dict) -> str:
    text = one_line(action.help)
    if "%(" in text:
        text = parser._get_formatter()._expand_help(action)
    group = together.get(id(action))
    if group is not None:
        names = ", ".join(a.option_strings[0] for a in group._group_actions)
        text = (text + "; " if text else "") + f"one of {names}" + (" (one is required)" if group.required else "")
    return text


def option_table(parser: argparse.ArgumentParser) -> list[str]:
    """The options as --help lists them: those a user needs in one table, then each named group
    of the parser (`advanced`: app.cli.common.advanced) in a table of its own under its name."""
    together = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    named = [g for g in parser._action_groups if g.title not in ("positional arguments", "options", "optional arguments")]
    in_named = {id(a) for g in named for a in g._group_actions}
    lines = table(parser, [a for a in parser._actions if id(a) not in in_named], together)
    for group in named:
        rows = table(parser, group._group_actions, together)
        if rows:  # a parser whose options are all in one named group: one table, unnamed
            lines += (["", f"{group.title.capitalize()}:", ""] if lines else []) + rows
    return lines


def table(parser: argparse.ArgumentParser, actions: list[argparse.Action], together: dict) -> list[str]:
    rows = []
    for action in actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(action.option_strings) if action.option_strings else value_of(parser, action)
        value = value_of(parser, action) if action.option_strings else ""
        rows.append(f"| {cell(code(name))} | {cell(code(value))} | {cell(default_of(action))} | "
                    f"{cell(help_of(parser, action, together))} |")
    return ["| option | value | default | what it does |", "|---|---|---|---|", *rows] if rows else []


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, its one-line help, its parser) for each subcommand, in the order they were added."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: one_line(choice.help) for choice in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def section(parser: argparse.ArgumentParser, title: str, level: int, summary: str = "") -> list[str]:
    lines = ["#" * level + f" {title}", ""]
    about = one_line(parser.description) or summary
    if about:
        lines += [about, ""]
    subs = subcommands(parser)
    if subs:
        lines += ["Subcommands: " + ", ".join(f"`{name}`" for name, _, _ in subs) + ".", ""]
    table = option_table(parser)
    lines += table + [""] if table else []
    for name, summary_of_sub, sub in subs:
        lines += section(sub, f"`{sub.prog}`", level + 1, summary_of_sub)
    return lines


def render() -> str:
    commands = command_parsers()
    lines = [HEADER, "Commands: " + ", ".join(f"[`{p.prog}`](#{anchor(p.prog)})" for _, p in commands)
             + ", and [the window](#specscope-the-window).", ""]
    for _, parser in commands:
        lines += section(parser, f"`{parser.prog}`", 2)
    lines += section(window_parser(), "`specscope` (the window)", 2)
    return "\n".join(lines).rstrip() + "\n"


def anchor(title: str) -> str:
    """GitHub's anchor for a heading `title` (backticks dropped)."""
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        current = DOC.read_text() if DOC.exists() else ""
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                   "docs/cli.md", "python scripts/cli_docs.py"))
        print("docs/cli.md is out of date: run python scripts/cli_docs.py", file=sys.stderr)
        return 1
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
