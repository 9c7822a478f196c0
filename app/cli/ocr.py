"""`specscope ocr FILE...`: every page of every file through GLM-OCR, streamed or exported."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.common import (Parser, UsageError, add_ocr_compute_arguments, add_output_arguments, add_spec_arguments,
                            advanced, check_images, checked, exit_code, ocr_load_options, open_trace, resolve_models,
                            run_and_report, runtime_label, sampling, spec_config, stats_line, write_stdout)
from app.cli.io import Interrupt
from app.cli.connect import add_server_arguments, run_on_server
from app.records.documents import EXPORT_FORMATS, PageResult, export_text, pages_of, parse_page_ranges, summarize
from engines.speculative.trace import TraceWriter
from engines.types import Request


# --layout-ahead's default: on a 2-core CPU the layout forward and the decode share the cores, and
# overlapping them measured 0.96-0.97x with more peak RSS (bench/ocr_document.py --ahead; docs/
# benchmarks.md). A Mac decoding on Core ML's units, or more cores, may differ: unmeasured.
LAYOUT_AHEAD = "off"


def ocr_parser() -> Parser:
    p = Parser(prog="specscope ocr", description="Read document images and PDFs with GLM-OCR, page by page.")
    p.add_argument("files", nargs="+", metavar="FILE", help="images, multi-page TIFFs or PDFs, read in order")
    p.add_argument("--model", default="glm-ocr", help="catalog id, hub repo id, GLM-OCR HF checkpoint (torch runtime) or converted directory (default: glm-ocr)")
    p.add_argument("--runtime", choices=["torch", "coreml", "coreml-twin"], default=None,
                   help="default: coreml for a converted directory on macOS, else torch (the fast PyTorch runtime); "
                        "coreml-twin runs the modules converted for Core ML in PyTorch (parity checks; slow)")
    p.add_argument("--task", choices=["text", "table", "formula"], default="text",
                   help="the whole page's task; with layout each region has its own")
    p.add_argument("--layout", choices=["auto", "on", "off"], default="auto",
                   help="find each page's regions with the layout model and read them together, each with its "
                        "own task, as GLM-OCR's SDK does (auto: when the layout model is installed and --task, "
                        "--json and --server are not given; off: whole pages)")
    p.add_argument("--layout-model", default=None, metavar="ID|PATH",
                   help="a PP-DocLayoutV3 checkpoint (default: the one paired with --model, pp-doclayout-v3)")
    p.add_argument("--pages", default=None, metavar="LIST", help="pages of each PDF / TIFF to read, e.g. 1-3,7 (default: all)")
    p.add_argument("--format", choices=EXPORT_FORMATS, default=None,
                   help="print the document at the end as Markdown, plain text or JSON (per page: text, task, "
                        "model, runtime, rounds summary) instead of streaming its text")
    add_spec_arguments(p, ["off", "mtp", "ngram"], "mtp")
    add_output_arguments(p)
    add_server_arguments(p)
    advanced(p).add_argument("--max-batch", type=int, default=8, metavar="N",
                             help="with layout: a page's regions read N at a time, in one batch (1: one after "
                                  "another; Core ML reads one at a time)")
    advanced(p).add_argument("--layout-ahead", choices=["on", "off"], default=LAYOUT_AHEAD,
                             help="with layout: find the next page's layout on a worker thread while this page's "
                                  "regions are read (docs/ocr.md says where it pays)")
    add_ocr_compute_arguments(advanced(p))
    return p



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
    requested = args.model  # the catalog id, which names the layout model paired with it
    resolve_models(args, requests[0].spec, "ocr")  # a missing OCR model is the first thing to say
    layout_path = choose_layout(args, requested)
    trace = open_trace(args)
    from app.models.store import leases
    from engines.factory import load_engine

    try:
        with leases(args.model, layout_path):
            layout = load_layout(layout_path)
            engine = load_engine("ocr", args.model, **ocr_load_options(args))
            if layout is not None:
                return read_document(engine, layout, pages, requests, args, trace)
            results = read_pages(engine, pages, requests, args, trace)
    finally:
        if trace is not None:
            trace.close()
    if args.format:
        write_stdout(export_text(results, args.format))
    if len(pages) > 1:
        print(f"[document: {summarize(results).line()}]", file=sys.stderr, flush=True)
    return exit_code(results[-1].session)


# ----------------------------------------------------------------------------- layout


def choose_layout(args: argparse.Namespace, ocr_model: str) -> str | None:
    """The layout model's path, or None for whole pages. --layout on with what cannot go with
    it is a usage error; a layout model that is not installed means whole pages and a line that
    says how to get it (with --layout on, or auto on the catalog's GLM-OCR)."""
    from app.models import catalog
    from app.models.lookup import layout_for, model_path, paired_layout

    if args.layout == "off":
        return None
    conflicts = [flag for flag, given in (("--task", args.task != "text"), ("--json", args.json),
                                          ("--server", args.server)) if given]
    if conflicts:
        if args.layout == "on":
            raise UsageError(f"--layout on reads each region with its own task and prints the document; "
                             f"it does not go with {conflicts[0]}")
        return None
    if args.layout_model:
        return model_path(args.layout_model, "layout")
    path = paired_layout(ocr_model)
    if path is None and (args.layout == "on" or catalog.find(ocr_model) is not None):
        wanted = layout_for(ocr_model)
        print(f"specscope: the layout model {wanted} is not installed: reading whole pages meanwhile; "
              f"`specscope models get {wanted}` gets it", file=sys.stderr, flush=True)
    return path


def load_layout(path: str | None):
    from engines.glm_ocr.layout import LayoutModel

    if path is None:
        return None
    layout = LayoutModel.load(path)
    if layout.note:  # a Core ML conversion that runs on PyTorch here, and why
        print(f"specscope: {layout.note}", file=sys.stderr, flush=True)
    return layout


def read_document(engine, layout, pages, requests: list[Request], args: argparse.Namespace,
                  trace: TraceWriter | None) -> int:
    """Each page's regions (found by `layout`, the next page's while this one's are read with
    --layout-ahead on) read in reading order, the document printed as Markdown (by default,
    page by page as each is read), text or JSON at the end."""
    from app.records.documents import LayoutPage, export_layout, summarize_pages
    from app.settings import data_dir
    from engines.glm_ocr.document import LayoutAhead, markdown_pages

    done: list[LayoutPage] = []
    with LayoutAhead(layout, [page.image for page in pages], ahead=args.layout_ahead == "on") as layouts:
        found = iter(layouts)
        for page, request in zip(pages, requests):
            done.append(read_page_by_region(engine, layout, page, found, request, args, trace, data_dir() / "regions"))
            if not args.format:  # the page's Markdown as soon as it is read (figures numbered across pages)
                heading = f"## {page.label}\n\n" if len(pages) > 1 else ""
                markdown = markdown_pages([p.regions for p in done])[-1]
                write_stdout(("\n" if len(done) > 1 else "") + heading + markdown.strip() + "\n")
            if any(s.finish == "cancelled" for s in done[-1].sessions):
                break
    if args.format:
        write_stdout(export_layout(done, args.format))
    print(f"[document: {summarize_pages(done).line()}]", file=sys.stderr, flush=True)
    sessions = [s for p in done for s in p.sessions]
    return exit_code(sessions[-1]) if sessions else 0


def read_page_by_region(engine, layout, page, layouts, request: Request, args: argparse.Namespace,
                        trace: TraceWriter | None, crop_root):
    """One page: its layout taken from `layouts` (LayoutAhead's, in page order), its regions (or
    the whole page, said, when layout finds none) each read and said on stderr with its stats
    line; a padded or unread region is said too."""
    import hashlib
    import time

    from app.records.documents import LayoutPage
    from engines.glm_ocr.document import read_regions

    waited = time.perf_counter()
    found = next(layouts)
    waited = time.perf_counter() - waited  # the layout's time on this page's path (less when found ahead)
    regions, image = found.regions, found.image
    detected = 0 if found.note else len(regions)  # (none found: the whole page stands in)
    print(f"[{page.label} \u00b7 layout: {detected} region{'s' * (detected != 1)} in {found.seconds:.2f} s]",
          file=sys.stderr, flush=True)
    if found.note:
        print(f"specscope: {page.label}: {found.note}", file=sys.stderr, flush=True)
    crop_dir = crop_root / hashlib.sha256(Path(page.image).read_bytes()).hexdigest()[:16]
    count = len(regions)

    def run(region_request: Request, region) -> object:
        label = f"{page.label} \u00b7 region {region.index + 1}/{count} {region.label}"
        return run_and_report(engine, checked(region_request), args, trace, False, label)

    def said(rr) -> None:
        if rr.note:
            print(f"specscope: {page.label} \u00b7 region {rr.region.index + 1}/{count} {rr.region.label}: {rr.note}",
                  file=sys.stderr, flush=True)

    started = time.perf_counter()
    if args.max_batch > 1 and hasattr(engine, "sequence"):  # the regions as the rows of one batch
        read = read_together(engine, image, page, regions, request, args, trace, crop_dir, said)
    else:
        read = []
        for rr in read_regions(image, page.number, regions, request, crop_dir, run):
            said(rr)
            read.append(rr)
            if rr.session is not None and rr.session.finish == "cancelled":
                break
    return LayoutPage(page, read, Path(layout.path).name, found.note, layout_s=waited,
                      read_s=time.perf_counter() - started)


def read_together(engine, image, page, regions, request: Request, args: argparse.Namespace,
                  trace: TraceWriter | None, crop_dir, said) -> list:
    """A page's regions read together (engines/glm_ocr/document.read_regions_together): each
    region's stats line (and its trace) as it finishes; Ctrl-C cancels every region still
    reading. A note of a region's rounds (why it decodes plainly) is said once."""
    from engines.glm_ocr.batch import OcrBatch
    from engines.glm_ocr.document import read_regions_together

    count = len(regions)

    def on_read(rr) -> None:
        said(rr)
        for note in dict.fromkeys(r.note for r in rr.session.rounds if r.note):
            print(f"specscope: {note}", file=sys.stderr)
        if trace is not None:
            trace.write_header({"request": rr.session.request, "model": rr.session.model})
            for rnd in rr.session.rounds:
                trace.write(rnd)
        label = f"{page.label} \u00b7 region {rr.region.index + 1}/{count} {rr.region.label}"
        print(f"[{label}] " + stats_line(rr.session, runtime_label(engine)), file=sys.stderr, flush=True)

    batch = OcrBatch(engine, max_batch=args.max_batch)
    with Interrupt().installed() as interrupt:
        read = read_regions_together(image, page.number, regions, checked(request), crop_dir, batch, interrupt,
                                     on_read)
    for rr in read:
        if rr.session is None:
            said(rr)
    return read


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
