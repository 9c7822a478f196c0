"""docs/cli.md is what scripts/cli_docs.py makes of the command line's parsers now, so `--help`
and the reference never drift apart; and the README and docs/ keep the shape issue 49 gave
them: a README read in five minutes, benchmarks as current tables, no session diaries (in any
tracked file: code and comments too), links that lead somewhere."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def cli_docs():
    spec = importlib.util.spec_from_file_location("cli_docs", ROOT / "scripts" / "cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_what_the_parsers_say_now():
    assert (ROOT / "docs" / "cli.md").read_text() == cli_docs().render(), \
        "docs/cli.md is out of date: run python scripts/cli_docs.py"


def test_every_command_and_option_is_in_the_reference():
    from app.cli.main import COMMANDS

    module = cli_docs()
    text = module.render()
    parsers = dict(module.command_parsers())
    assert list(parsers) == list(COMMANDS)
    for name, parser in list(parsers.items()):
        assert f"## `{parser.prog}`" in text
        for sub_name, _, sub in module.subcommands(parser):
            assert f"### `{sub.prog}`" in text
            parsers[f"{name} {sub_name}"] = sub
    for parser in parsers.values():
        for action in parser._actions:
            if action.dest == "help":
                continue
            for option in action.option_strings:
                assert f"`{option}" in text or f", {option}" in text, (parser.prog, option)


def test_the_reference_sees_a_new_option():
    """The check has teeth: an option added to a parser changes what the script writes."""
    module = cli_docs()
    from app.cli import chat

    before = module.render()
    original = chat.chat_parser

    def with_one_more():
        p = original()
        p.add_argument("--an-option-nobody-wrote", help="new")
        return p

    chat.chat_parser = with_one_more
    try:
        after = module.render()
    finally:
        chat.chat_parser = original
    assert before != after and "`--an-option-nobody-wrote`" in after


def test_readme_and_benchmarks_stay_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
    assert len((ROOT / "docs" / "benchmarks.md").read_text().splitlines()) <= 600


SESSION = re.compile(r"\bsession[ -]?[0-9]", re.I)  # "session N", N a number, spaced or hyphenated


def tracked_text_files() -> list[Path]:
    """The repository's tracked files that are text (code, comments, docs, scripts, settings)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no tracked files to read")
    paths = [ROOT / name for name in listed.decode().split("\0") if name]
    return [p for p in paths if p.is_file() and b"\0" not in p.read_bytes()[:8192]]


def test_no_session_diaries_anywhere():
    """History lives in git and the CHANGELOG (by version): no "session N" in any tracked code,
    comment, doc, script or setting -- README, CHANGELOG and docs/ included."""
    assert SESSION.search("(docs/benchmarks.md, Session %d)" % 9) and SESSION.search("the session-%d drafter" % 12)
    assert not SESSION.search("a saved chat session, 12 rounds")
    files = tracked_text_files()
    assert ROOT / "CHANGELOG.md" in files and ROOT / "engines" / "training" / "train.py" in files
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for path in files
             for n, line in enumerate(path.read_bytes().decode("utf-8", "replace").splitlines(), 1)
             if SESSION.search(line)]
    assert found == [], "\n".join(found)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    found = set()
    for line in path.read_text().splitlines():
        if m := re.match(r"#{1,6} (.*)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = 1
            base = slug
            while slug in found:
                slug = f"{base}-{n}"
                n += 1
            found.add(slug)
    return found


def test_links_between_the_docs_lead_somewhere():
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
