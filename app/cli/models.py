"""`specscope models list [--json] | get ID [--revision REV] | rm ID | add PATH | path ID`.

The text the subcommands print; the work is in app.models (catalog / store / download). Errors
are EngineError / UsageError, which app.cli.main turns into one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import sys
import time

from app.cli.common import Parser
from app.models import catalog, store
from app.models.download import DownloadProgress, clock


def parser():
    p = Parser(prog="specscope models", description="The models Specscope knows: list, download, remove, add.")
    sub = p.add_subparsers(dest="action")
    ls = sub.add_parser("list", help="every known model: installed or not, size, where, its pair, what is missing")
    ls.add_argument("--json", action="store_true", help="one JSON document")
    get = sub.add_parser("get", help="download a catalog id or any hub repo id (org/name)")
    get.add_argument("id", help="catalog id or hub repo id (org/name)")
    get.add_argument("--revision", default=None, metavar="REF", help="branch, tag or commit sha (default: the catalog's pin, else main)")
    rm = sub.add_parser("rm", help="delete a downloaded model (a local entry is only forgotten)")
    rm.add_argument("id", help="catalog id (`models list` shows them)")
    add = sub.add_parser("add", help="add a local mlx-lm / Hugging Face model directory or a .gguf file")
    add.add_argument("path", help="model directory or .gguf file")
    add.add_argument("--role", choices=catalog.ROLES, default=None, help="default: read from the model's config")
    path = sub.add_parser("path", help="print where an installed model is")
    path.add_argument("id", help="catalog id")
    return p


def cmd_models(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    action = args.action or "list"
    if action == "list":
        return list_models(json_output=getattr(args, "json", False))
    if action == "get":
        return get(args.id, args.revision)
    if action == "rm":
        freed = store.remove(args.id)
        print(f"removed {args.id}" + (f" ({store.human_size(freed)} freed)" if freed else ""), file=sys.stderr)
        return 0
    if action == "add":
        entry = catalog.add_user_entry(catalog.entry_for_path(args.path, role=args.role))
        print(f"added {entry.id} ({entry.role}): {entry.path}", file=sys.stderr)
        return 0
    print(store.resolve(args.id, catalog.ROLES))  # any role: this only says where it is
    return 0


def list_models(json_output: bool = False) -> int:
    entries = catalog.load_catalog()
    rows = [(e, store.status(e, entries)) for e in entries]
    if json_output:
        json.dump([e.to_dict() | {"status": st.to_dict()} for e, st in rows], sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    for e, st in rows:
        state = f"installed {store.human_size(st.size_on_disk)}" if st.installed else "not installed"
        pair = f"  pairs with {e.pairs_with}" if e.pairs_with else ""
        print(f"{e.id:<28} {e.role:<8} {state:<22} {st.path or e.repo_id or e.package or e.path}{pair}")
        for sentence in st.missing:
            print(f"{'':<28} missing: {sentence}")
    print(f"\nmodels folder: {store.models_dir()}", file=sys.stderr)
    return 0


def get(id_or_repo: str, revision: str | None) -> int:
    from app.models.download import download

    bar = ProgressLine()
    try:
        path = download(id_or_repo, revision, on_progress=bar.show)
    finally:
        bar.close()
    entry = catalog.find(id_or_repo)
    pair = catalog.pair_of(entry) if entry else None
    if pair is not None and pair.role == "drafter" and not store.status(pair).installed:
        print(f"its drafter {pair.id} is not downloaded: specscope models get {pair.id}", file=sys.stderr)
    if pair is not None and pair.role == "layout" and not store.status(pair).installed:
        print(f"its layout model {pair.id} is not downloaded (regions in reading order, `ocr --layout on`): "
              f"specscope models get {pair.id}", file=sys.stderr)
    print(path)
    return 0


def progress_text(p: DownloadProgress, width: int = 24) -> str:
    """`[#######.........]  31%  1.2 GB / 3.9 GB  41.0 MB/s  ETA 01:06  model.safetensors`"""
    fraction = p.bytes_done / p.bytes_total if p.bytes_total else 0.0
    filled = int(round(width * fraction))
    return (f"[{'#' * filled}{'.' * (width - filled)}] {100 * fraction:3.0f}%  "
            f"{store.human_size(p.bytes_done)} / {store.human_size(p.bytes_total)}  "
            f"{store.human_size(p.rate_bytes_s)}/s  ETA {clock(p.eta_s)}  {p.file}")


class ProgressLine:
    """One self-overwriting line on stderr (a terminal) or a line per file and at most one a
    second (a pipe or a log file)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.last_file = None
        self.last_time = 0.0
        self.width = 0

    def show(self, p: DownloadProgress) -> None:
        text = progress_text(p)
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        elif p.file != self.last_file or now - self.last_time >= 1.0 or p.bytes_done == p.bytes_total:
            self.stream.write(text + "\n")
            self.last_time = now
        self.last_file = p.file
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()
