"""`specscope ocr FILE...`: every page of every file through GLM-OCR, streamed or exported."""

from __future__ import annotations

import argparse
import sys

from app.cli.common import (Parser, UsageError, add_output_arguments, add_spec_arguments, check_images, checked,
                            exit_code, open_trace, resolve_models, run_and_report, sampling, spec_config,
                            write_stdout)
from app.cli.connect import add_server_arguments, run_on_server
from app.records.documents import EXPORT_FORMATS, PageResult, export_text, pages_of, parse_page_ranges, summarize
from engines.speculative.trace import TraceWriter
from engines.types import Request


def ocr_parser() -> Parser:
    p = Parser(prog="specscope ocr", description="Read document images and PDFs with GLM-OCR, page by page.")
    p.add_argument("files", nargs="+", metavar="FILE", help="images, multi-page TIFFs or PDFs, read in order")
    p.add_argument("--model", default="glm-ocr", help="catalog id, hub repo id, GLM-OCR HF checkpoint (torch runtime) or converted directory (default: glm-ocr)")
    p.add_argument("--runtime", choices=["torch", "coreml", "coreml-twin"], default=None,
                   help="default: coreml for a converted directory on macOS, else torch (the fast PyTorch runtime); "
                        "coreml-twin runs the modules converted for Core ML in PyTorch (parity checks; slow)")
    p.add_argument("--task", choices=["text", "table", "formula"], default="text")
    p.add_argument("--pages", default=None, metavar="LIST", help="pages of each PDF / TIFF to read, e.g. 1-3,7 (default: all)")
    p.add_argument("--format", choices=EXPORT_FORMATS, default=None,
                   help="print the document at the end as Markdown, plain text or JSON (per page: text, task, "
                        "model, runtime, rounds summary) instead of streaming its text")
    add_spec_arguments(p, ["off", "mtp", "ngram"], "mtp")
    add_output_arguments(p)
    add_server_arguments(p)
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
