"""A page read by region in the window's engine process: the layout stage finds the page's
regions and they are read together, as the rows of one batch (engines/glm_ocr/document.py's
read_regions_together), as `specscope ocr --layout` reads them. This module is the job and its
replies (plain, pickled records) and the engine process's side of it.

Qt-free on purpose, as app/gui/engine_process.py is: the engine process runs `read_page`.

    parent -> child   ReadPage
    child -> parent   Loaded, RegionsFound, then per batch step RegionStarted (a region's
                      first round) and BatchStepped (every row's Round of the step, as Bursts),
                      RegionRead as each region ends (the skipped ones at the page's end),
                      PageRead (the page's Markdown), then Ended or Failed (engine_process)

Stop is the job's stop flag, as for a whole page: every region still reading or waiting ends
at the next step, cancelled, and what they read so far has been sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from app.records.bursts import Burst, burst_of
from engines.types import EngineError, Request

MAX_BATCH = 8  # a page's regions read together, as `specscope ocr --max-batch` by default


@dataclass
class ReadPage:
    path: str  # the OCR model (resolved by the parent's EngineProcess)
    options: dict
    request: Request  # the page's: its image, speculation, sampling, max tokens
    layout: str  # the layout model's directory
    page: int  # the page's number in its source, from 1
    crop_dir: str  # where the regions' crops are written
    max_batch: int = MAX_BATCH


@dataclass
class RegionsFound:
    regions: list  # engines.glm_ocr.layout.Region, in reading order
    seconds: float  # how long the layout stage took
    note: str | None = None  # layout found nothing: the whole page is read as one region
    runtime_note: str | None = None  # why a converted layout model runs on PyTorch (LayoutModel.note)


@dataclass
class RegionStarted:
    index: int  # the region's place in reading order


@dataclass
class BatchStepped:
    at: float  # seconds since the page's regions began to be read
    rounds: list[tuple[int, Burst]]  # (region index, its Round of this step), one a row


@dataclass
class RegionRead:
    index: int
    text: str
    finish: str | None  # None: not read (a figure, or empty at the page's pixels)
    crop: str | None
    note: str | None


@dataclass
class PageRead:
    markdown: str  # the page's Markdown, as engines.glm_ocr.document.markdown_pages writes it


PAGE_EVENTS = (RegionsFound, RegionStarted, BatchStepped, RegionRead, PageRead)


def crop_path(crop_dir: str | Path, page: int, index: int) -> Path:
    """Where a region's crop goes (read_regions_together's own naming)."""
    return Path(crop_dir) / f"page-{page:04d}-region-{index:03d}.png"


# --- the engine process's side ----------------------------------------------------------------
def read_page(host, job: ReadPage) -> str:
    """Runs the job on `host` (engine_process.EngineHost: engine_for, layouts, send,
    should_stop); returns "finished" or "cancelled"."""
    from engines.glm_ocr.batch import OcrBatch
    from engines.glm_ocr.document import markdown_pages, read_regions_together, whole_page
    from engines.glm_ocr.image import load_image

    engine = host.engine_for("ocr", job.path, job.options)
    if not hasattr(engine, "sequence"):
        raise EngineError("this OCR engine cannot read a page by region: turn Layout off")
    layout = layout_model(host.layouts, job.layout)
    if host.should_stop():
        return "cancelled"
    image = load_image(job.request.image)
    started = time.perf_counter()
    regions = layout.regions(image)
    note = None
    if not regions:
        note = "layout found no regions: the whole page is read as text"
        regions = [whole_page(image)]
    host.send(RegionsFound(regions, time.perf_counter() - started, note, layout.note))
    events = PageEvents(host.send)
    read = read_regions_together(image, job.page, regions, job.request, Path(job.crop_dir),
                                 OcrBatch(engine, max_batch=job.max_batch), host.should_stop,
                                 events.region_read, events.stepped)
    for rr in read:
        if rr.session is None:  # not read: a figure, or a region empty at the page's pixels
            events.region_read(rr)
    host.send(PageRead(markdown_pages([read])[0]))
    cancelled = any(rr.session is not None and rr.session.finish == "cancelled" for rr in read)
    return "cancelled" if cancelled or host.should_stop() else "finished"


def layout_model(cache: dict, path: str):
    """The layout model at `path`, loaded once for the engine process's life (one at a time)."""
    if path not in cache:
        from engines.glm_ocr.layout import LayoutModel

        cache.clear()
        cache[path] = LayoutModel.load(path)
    return cache[path]


class PageEvents:
    """What read_regions_together hears, sent to the window as it happens."""

    def __init__(self, send):
        self.send = send
        self.begun = time.perf_counter()
        self.started: set[int] = set()

    def stepped(self, rounds: list) -> None:
        for region, _rnd in rounds:
            if region.index not in self.started:
                self.started.add(region.index)
                self.send(RegionStarted(region.index))
        self.send(BatchStepped(time.perf_counter() - self.begun,
                               [(region.index, burst_of(rnd)) for region, rnd in rounds]))

    def region_read(self, rr) -> None:
        self.send(RegionRead(rr.region.index, rr.text, rr.session.finish if rr.session else None, rr.crop, rr.note))
