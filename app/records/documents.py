"""Documents for OCR: the files a user gives (images, multi-frame TIFFs, PDFs) become a list
of pages, each an image file the OCR engine reads; and a read document exports as Markdown,
plain text or JSON. No Qt: the CLI (`specscope ocr FILE... --pages 1-3,7`) and the window both
use it.

PDF pages are rendered with pypdfium2 at RENDER_DPI (GLM-OCR's own tooling renders at
200 DPI; its image processor then fits the page to the model's pixel budget), capped at
MAX_RENDER_SIDE so a poster-sized page does not become a 100-megapixel image."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from engines.types import EngineError
from engines.speculative.rounds import RunningStats, session_stats
from engines.speculative.session import Session

RENDER_DPI = 200
MAX_RENDER_SIDE = 4000  # pixels on the longer side of a rendered page
PDF_SUFFIXES = {".pdf"}
TIFF_SUFFIXES = {".tif", ".tiff"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"} | TIFF_SUFFIXES
DOCUMENT_SUFFIXES = IMAGE_SUFFIXES | PDF_SUFFIXES
EXPORT_FORMATS = ("md", "txt", "json")


class DocumentError(EngineError):
    """A document that cannot be turned into pages (corrupt, encrypted, empty). One line."""


@dataclass(frozen=True)
class Page:
    """One page to read: `image` is the file the engine opens (the source itself for a plain
    image, a rendered PNG for a PDF page or a TIFF frame)."""

    source: str
    number: int  # 1-based, within its source
    count: int  # pages in the source
    image: str

    @property
    def label(self) -> str:
        name = Path(self.source).name
        return f"{name} \u00b7 p. {self.number}" if self.count > 1 else name


# --------------------------------------------------------------------------- page ranges


def parse_page_ranges(spec: str) -> list[int]:
    """"1-3,7" -> [1, 2, 3, 7] (1-based, in the order given, duplicates dropped)."""
    numbers: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        first, dash, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            raise DocumentError(f"--pages: {part!r} is not a page or a range like 2-5") from None
        if lo < 1 or hi < lo:
            raise DocumentError(f"--pages: {part!r} is not a range of pages counted from 1")
        numbers += [n for n in range(lo, hi + 1) if n not in numbers]
    return numbers


# --------------------------------------------------------------------------- expanding files


def pages_of(paths: list[str], cache_dir: Path, wanted: list[int] | None = None) -> list[Page]:
    """Every page of every file, in order. `wanted` (1-based page numbers) applies to each
    file with several pages; a number past a file's end is an error, not silently skipped."""
    pages: list[Page] = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise DocumentError(f"no such file: {path}")
        suffix = p.suffix.lower()
        if suffix in PDF_SUFFIXES:
            pages += pdf_pages(p, cache_dir, wanted)
        elif suffix in TIFF_SUFFIXES:
            pages += tiff_pages(p, cache_dir, wanted)
        else:
            pages.append(Page(str(p), 1, 1, str(p)))
    return pages


def _pick(count: int, wanted: list[int] | None, source: Path) -> list[int]:
    if count == 0:
        raise DocumentError(f"{source.name} has no pages")
    if wanted is None:
        return list(range(1, count + 1))
    past = [n for n in wanted if n > count]
    if past:
        raise DocumentError(f"{source.name} has {count} page{'s' * (count != 1)}; --pages asks for {past[0]}")
    return wanted


def _render_path(cache_dir: Path, source: Path, number: int) -> Path:
    """Rendered pages are cached by the source's content, so reopening a file is free."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    folder = cache_dir / digest
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"page-{number:04d}.png"


def pdf_pages(source: Path, cache_dir: Path, wanted: list[int] | None = None) -> list[Page]:
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(str(source))
    except pdfium.PdfiumError as e:
        raise DocumentError(pdf_error(source, e)) from None
    try:
        count = len(pdf)
        pages = []
        for number in _pick(count, wanted, source):
            out = _render_path(cache_dir, source, number)
            if not out.exists():
                page = pdf[number - 1]
                width, height = page.get_size()  # points, 1/72 inch
                scale = min(RENDER_DPI / 72, MAX_RENDER_SIDE / max(width, height, 1))
                page.render(scale=scale).to_pil().convert("RGB").save(out)
            pages.append(Page(str(source), number, count, str(out)))
        return pages
    finally:
        pdf.close()


def pdf_error(source: Path, error) -> str:
    """PDFium's load error as one line for the user."""
    import pypdfium2.raw as pdfium_c

    code = getattr(error, "err_code", None)
    if code == pdfium_c.FPDF_ERR_PASSWORD:
        return f"{source.name} is encrypted (it needs a password); save an unprotected copy first"
    if code == pdfium_c.FPDF_ERR_SUCCESS:  # PDFium refuses a document whose page tree is empty
        return f"{source.name} has no pages"
    return f"{source.name} is corrupt or not a PDF ({error})"


def tiff_pages(source: Path, cache_dir: Path, wanted: list[int] | None = None) -> list[Page]:
    """A multi-frame TIFF (a scanner's multi-page output) gives a page per frame; a single
    frame stays the file itself."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(source) as tiff:
            count = getattr(tiff, "n_frames", 1)
            if count == 1 and wanted in (None, [1]):
                return [Page(str(source), 1, 1, str(source))]
            pages = []
            for number in _pick(count, wanted, source):
                out = _render_path(cache_dir, source, number)
                if not out.exists():
                    tiff.seek(number - 1)
                    tiff.convert("RGB").save(out)
                pages.append(Page(str(source), number, count, str(out)))
            return pages
    except (UnidentifiedImageError, OSError, EOFError) as e:
        raise DocumentError(f"{source.name} is not a readable TIFF ({e})") from None


# --------------------------------------------------------------------------- export


@dataclass
class PageResult:
    """A page that has been read (or partly read, when the run was stopped)."""

    page: Page
    session: Session

    def record(self) -> dict:
        """The per-page entry of a JSON export."""
        s = self.session.stats()
        model = self.session.model
        return {
            "source": self.page.source,
            "page": self.page.number,
            "text": self.session.text,
            "task": self.session.request.get("task"),
            "model": model.get("name") or Path(str(model.get("path", ""))).name,
            "runtime": model.get("runtime"),
            "finish": self.session.finish,
            "rounds": {
                "rounds": s.rounds, "tokens": s.tokens, "proposed": s.proposed, "accepted": s.accepted,
                "acceptance_rate": round(s.acceptance_rate, 4), "tau": round(s.tau, 3),
                "decode_tok_s": round(s.decode_tok_s, 2), "ttft_s": round(s.ttft_s, 4),
                "wall_s": round(s.wall_s, 4),
            },
        }


@dataclass
class DocumentSummary:
    """The figures of a multi-page session, summed over its pages."""

    pages: int
    tokens: int
    rounds: int
    proposed: int
    accepted: int
    decode_tok_s: float
    wall_s: float
    repeated: list[str] = field(default_factory=list)  # labels of the pages stopped by repetition
    regions: int = 0  # regions read, on the pages read by region (summarize_pages)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def line(self) -> str:
        loops = f" \u00b7 stopped repeating: {', '.join(self.repeated)}" if self.repeated else ""
        regions = f" \u00b7 {self.regions} region{'s' * (self.regions != 1)}" if self.regions else ""
        return (f"{self.pages} page{'s' * (self.pages != 1)}{regions} \u00b7 {self.tokens} tokens in "
                f"{self.wall_s:.1f} s \u00b7 {self.decode_tok_s:.1f} tok/s \u00b7 acceptance "
                f"{100 * self.acceptance_rate:.0f}%{loops}")


def summarize(results: list[PageResult]) -> DocumentSummary:
    s = session_stats([rnd for r in results for rnd in r.session.rounds])
    return DocumentSummary(
        pages=len(results), tokens=s.tokens, rounds=s.rounds, proposed=s.proposed, accepted=s.accepted,
        decode_tok_s=s.decode_tok_s, wall_s=s.wall_s,
        repeated=[r.page.label for r in results if r.session.finish == "repetition"],
    )


def export_text(results: list[PageResult], fmt: str) -> str:
    """Pages read whole as Markdown, plain text or JSON (export_document)."""
    return export_document(results, fmt)


# --------------------------------------------------------------------------- pages read by region


@dataclass
class LayoutPage:
    """A page read region by region (the layout stage's regions, or the whole page as one region
    when layout found nothing: `note` says so)."""

    page: Page
    regions: list  # engines.glm_ocr.document.ReadRegion, in reading order
    layout: str  # the layout model's folder name
    note: str | None = None
    layout_s: float = 0.0  # how long the page's reading waited for its layout (all of it, found in turn)
    read_s: float = 0.0  # how long its regions took to read, their crops included (the Batch strip's clock)

    @property
    def sessions(self) -> list[Session]:
        return [r.session for r in self.regions if r.session is not None]

    def record(self, markdown: str) -> dict:
        """The per-page entry of a JSON export: the page's Markdown and its regions."""
        entry = {"source": self.page.source, "page": self.page.number, "layout": self.layout, "text": markdown,
                 "regions": [r.record() for r in self.regions]}
        if self.note:
            entry["note"] = self.note
        return entry


def summarize_pages(pages: list[PageResult | LayoutPage]) -> DocumentSummary:
    """The figures of pages read whole or by region: the window's and the CLI's document line.
    A page read by region counts the time its regions were read together (LayoutPage.read_s, the
    Batch strip's clock), not the sum of its rows' rounds: the rows of one step share that step's
    time, so the sum would count it once a row. Its tok/s is the page's aggregate: every region's
    tokens over that time."""
    whole, rows = RunningStats(), RunningStats()
    for rnd in (rnd for p in pages if isinstance(p, PageResult) for rnd in p.session.rounds):
        whole.add(rnd)
    by_region = [p for p in pages if isinstance(p, LayoutPage)]
    for rnd in (rnd for p in by_region for session in p.sessions for rnd in session.rounds):
        rows.add(rnd)
    decode_tokens = whole.decode_tokens + rows.tokens  # (a region's first token is read in the batch's time)
    decode_s = whole.decode_wall + sum(p.read_s for p in by_region)
    return DocumentSummary(
        pages=len(pages), tokens=whole.tokens + rows.tokens, rounds=whole.rounds + rows.rounds,
        proposed=whole.proposed + rows.proposed, accepted=whole.accepted + rows.accepted,
        decode_tok_s=decode_tokens / decode_s if decode_s > 0 else 0.0,
        wall_s=whole.wall_s + sum(p.layout_s + p.read_s for p in by_region),
        repeated=[p.page.label for p in pages if any(x.finish == "repetition" for x in _sessions(p))],
        regions=sum(len(p.sessions) for p in by_region),
    )


def page_figures(page: LayoutPage) -> str:
    """A page read by region in one line (the window's page list and status bar): its regions
    read, tokens, the aggregate tok/s of its batch, draft acceptance, and the time it took
    (layout and regions)."""
    s = summarize_pages([page])
    return (f"{s.regions} region{'s' * (s.regions != 1)} read \u00b7 {s.tokens} tokens \u00b7 "
            f"{s.decode_tok_s:.1f} tok/s \u00b7 acceptance {100 * s.acceptance_rate:.0f}% \u00b7 {s.wall_s:.1f} s")


def _sessions(page: PageResult | LayoutPage) -> list[Session]:
    return page.sessions if isinstance(page, LayoutPage) else [page.session]


def export_layout(pages: list[LayoutPage], fmt: str) -> str:
    """Pages read by region as Markdown, plain text or JSON (export_document)."""
    return export_document(pages, fmt)


def export_document(pages: list[PageResult | LayoutPage], fmt: str) -> str:
    """The document as Markdown (a heading per page when there are several), plain text (pages
    separated by a form feed, as `pdftotext` does) or JSON (one entry per page). A page read
    whole gives its text and its rounds summary; a page read by region its Markdown as the glmocr
    SDK's formatter writes it (figures as image references to their crops), its regions' texts in
    reading order, and pages -> regions in JSON. The CLI and the window both export through here."""
    markdown = _markdown_of(pages)
    if fmt == "json":
        entries = [p.record(md) if isinstance(p, LayoutPage) else p.record() for p, md in zip(pages, markdown)]
        return json.dumps({"pages": entries}, ensure_ascii=False, indent=1) + "\n"
    if fmt == "txt":
        return "\f".join(_plain_text(p) + "\n" for p in pages)
    if fmt == "md":
        if len(pages) == 1:
            return markdown[0].rstrip() + "\n"
        return "\n\n".join(f"## {p.page.label}\n\n{md.strip()}" for p, md in zip(pages, markdown)) + "\n"
    raise ValueError(f"unknown export format {fmt!r} (expected one of {', '.join(EXPORT_FORMATS)})")


def _markdown_of(pages: list[PageResult | LayoutPage]) -> list[str]:
    """Each page's Markdown. The pages read by region go through markdown_pages together, a page
    read whole holding its place (no regions), so that a figure's reference names its page's
    place in the document and figures are numbered across it."""
    if not any(isinstance(p, LayoutPage) for p in pages):  # (and engines.glm_ocr stays unimported)
        return [p.session.text for p in pages]
    from engines.glm_ocr.document import markdown_pages

    by_region = markdown_pages([p.regions if isinstance(p, LayoutPage) else [] for p in pages])
    return [md if isinstance(p, LayoutPage) else p.session.text for p, md in zip(pages, by_region)]


def _plain_text(page: PageResult | LayoutPage) -> str:
    if isinstance(page, LayoutPage):
        return "\n\n".join(r.text.strip() for r in page.regions if r.text.strip())
    return page.session.text.rstrip()
