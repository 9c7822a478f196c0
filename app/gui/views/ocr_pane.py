"""OCR mode's pane: the text read, and what OCR keeps while the window shows chat: the pages read
(in reading order), the reading in progress, the run shown, its A/B result and its status line.

A reading goes through the document's pages in order, one run per page; the pane marks each
page in the document's page list (queued, reading, read, cancelled, errored). Stop keeps the
pages already read, and the next Read goes on from the first page not read. The window starts
and ends the runs; this pane says which page comes next and what a page's end means."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from app.records.compare import CompareResult
from app.records.documents import LayoutPage, Page, PageResult, page_figures, summarize_pages
from app.gui.views.document import DocumentView
from app.gui.views.transcript import TranscriptView
from engines.speculative.session import Session
from engines.types import EngineError, Request

NO_DOCUMENT = "drop an image or a PDF onto the window (or open / paste one) to run OCR"
PAGE_STATE_OF_FINISH = {"stop": "read", None: "read", "length": "length", "repetition": "repetition",
                        "cancelled": "cancelled", "error": "errored"}


@dataclass
class Reading:
    """An OCR run over pages, in order: `queue` holds (page index, page) still to read."""

    queue: deque
    region: bool = False  # reading a region of one page, not whole pages

    @property
    def current(self) -> tuple[int, Page]:
        return self.queue[0]


class OcrPane(QWidget):
    def __init__(self, document: DocumentView, parent: QWidget | None = None):
        super().__init__(parent)
        self.document = document  # the window places it beside this pane; the pane marks its pages
        self.results: list[PageResult] = []  # the pages read whole, in reading order
        self.layout_pages: list[LayoutPage] = []  # the pages read by region (app/gui/document_run.py)
        self.reading: Reading | None = None
        self.session: Session | None = None  # the run shown
        self.session_settings: dict = {}
        self.last_compare: CompareResult | None = None
        self.status = "Ready"  # the status bar's text while OCR is not shown
        self.model_label = ""

        self.transcript = TranscriptView()
        self.transcript.title.setText("Text")
        self.split = QSplitter(Qt.Orientation.Vertical)  # the text over the document's Markdown
        self.split.setChildrenCollapsible(False)
        self.split.setHandleWidth(1)
        self.split.addWidget(self.transcript)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.split)

    def add_markdown_view(self, view: QWidget) -> None:
        """The document's Markdown under the text, shown once a page is read by region."""
        view.hide()
        self.split.addWidget(view)
        self.split.setSizes([300, 300])

    def fill(self, request: Request, image: str | None, task: str) -> None:
        """The OCR part of a Request: the image given, else the region drawn, else the page shown."""
        image = image or self.document.region_image() or self.document.current_image()
        if image is None:
            raise EngineError(NO_DOCUMENT)
        request.image = image
        request.task = task

    def plan_reading(self) -> Reading | None:
        """The pages not read yet (all of them once every page has been read), or just the region
        drawn on the current page; None (with a message) when there is no document."""
        pages = self.document.pages
        if not pages:
            self.transcript.show_message(NO_DOCUMENT, "info")
            return None
        region = self.document.region_image()
        if region is not None:
            index, page = self.document.index, self.document.current_page()
            queue = [(index, replace(page, image=region))]
            self.results, self.layout_pages = [], []
        else:
            self.results = [r for r in self.results if r.page in pages]  # a region read is no page
            self.layout_pages = [r for r in self.layout_pages if r.page in pages]
            done = {r.page for r in self.results} | {r.page for r in self.layout_pages}
            queue = [(i, p) for i, p in enumerate(pages) if p not in done]
            if not queue:  # everything was read: read it all again
                queue, self.results, self.layout_pages = list(enumerate(pages)), [], []
        if not self.results and not self.layout_pages:
            self.transcript.clear()
            for i in range(len(pages)):
                self.document.set_page_state(i, "")
        for i, _page in queue:
            self.document.set_page_state(i, "queued")
        return Reading(deque(queue), region=region is not None)

    def page_starting(self) -> tuple[str, str]:
        """The next page of the reading is shown and marked; its (label, image)."""
        index, page = self.reading.current
        if not self.reading.region:
            self.document.show_page(index)
        self.document.set_page_state(index, "reading")
        return (f"Region of {page.label}" if self.reading.region else page.label), page.image

    def run_page(self) -> Page | None:
        """The document page an OCR run reads from: the reading's page (its region drawn, or
        whole), else the page shown (an A/B compare)."""
        if self.reading is not None and self.reading.queue:
            return self.reading.current[1]
        return self.document.current_page()

    def page_not_started(self) -> None:
        self.document.set_page_state(self.reading.current[0], "errored")

    def begin(self, label: str, second_of_compare: bool) -> None:
        if self.reading is None and not second_of_compare:
            self.transcript.clear()  # an A/B compare shows its two runs alone
        self.transcript.begin_response(label or None)

    def progress_text(self) -> str | None:
        """"Reading page 2 (2 of 5)…" while a reading of several pages runs, else None."""
        if self.reading is None or len(self.reading.queue) + len(self.results) <= 1:
            return None
        index, page = self.reading.current
        return f"Reading {page.label} ({index + 1} of {len(self.document.pages)})\u2026"

    def page_ended(self, session: Session) -> PageResult | None:
        """A page's run has ended: mark it, keep it if it was read to an end (returned), go on."""
        index, page = self.reading.current
        finish = session.finish
        s = session.stats()
        self.document.set_page_state(index, PAGE_STATE_OF_FINISH.get(finish, "read"),
                                     f"{s.tokens} tokens \u00b7 {s.decode_tok_s:.1f} tok/s "
                                     f"\u00b7 acceptance {100 * s.acceptance_rate:.0f}%")
        self.reading.queue.popleft()
        if finish == "cancelled":
            return None
        result = PageResult(page, session)
        self.results.append(result)
        return result

    def layout_page_ended(self, page: LayoutPage, state: str, keep: bool) -> None:
        """A page read by region has ended: mark it, keep it when it was read to its end, go on."""
        index, _page = self.reading.current
        self.document.set_page_state(index, state, page_figures(page))
        self.reading.queue.popleft()
        if keep:
            self.layout_pages.append(page)

    def reading_ended(self) -> str | None:
        """The last page has been read: the document's summary line when it had several pages."""
        self.reading = None
        pages = self.pages_read()
        if len(pages) <= 1:
            return None
        summary = f"Read {summarize_pages(pages).line()}"
        if not self.transcript.message_text:
            self.transcript.show_message(summary, "info")
        return summary

    def reading_stopped(self) -> None:
        """Stop: the pages still queued are unmarked; the pages read are kept."""
        for i, _page in self.reading.queue:
            self.document.set_page_state(i, "")
        self.reading = None

    def reading_failed(self, message: str) -> None:
        index, _page = self.reading.current
        self.document.set_page_state(index, "errored", message)
        for i, _page in list(self.reading.queue)[1:]:
            self.document.set_page_state(i, "")
        self.reading = None

    def current_label(self) -> str | None:
        return self.reading.current[1].label if self.reading is not None else None

    def result_of(self, index: int) -> PageResult | None:
        """The result of page `index` of the document, if it has been read."""
        if not 0 <= index < len(self.document.pages):
            return None
        page = self.document.pages[index]
        return next((r for r in self.results if r.page == page), None)

    def layout_page_of(self, index: int) -> LayoutPage | None:
        """Page `index` of the document as read by region, if it has been."""
        if not 0 <= index < len(self.document.pages):
            return None
        page = self.document.pages[index]
        return next((p for p in self.layout_pages if p.page == page), None)

    def pages_read(self, reading: LayoutPage | None = None) -> list[PageResult | LayoutPage]:
        """The pages read, whole or by region, in the document's order (a page cut short and read
        again later is read after the pages that follow it), with `reading` (the page being read,
        so far) in its place."""
        order = {page: i for i, page in enumerate(self.document.pages)}
        pages = [*self.results, *self.layout_pages, *([reading] if reading is not None else [])]
        return sorted(pages, key=lambda p: order.get(p.page, len(order)))

    def document_results(self) -> list[PageResult | LayoutPage]:
        return self.pages_read()

    def suggested_name(self) -> str:
        pages = self.pages_read()
        return pages[0].page.source if pages else "specscope"
