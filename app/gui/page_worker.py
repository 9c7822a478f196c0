"""A page read by region, on its own QThread: the job goes to the window's engine process
(app/gui/page_job.py's ReadPage), its events come back as signals. As app/gui/worker.py's
RunWorker does for a whole page, this thread keeps what is received -- each region's Session,
and an autosave file per region, opened at its first round -- so every round that arrived is
kept whatever happens to the engine process. Exactly one of finished / cancelled / errored,
then `done`."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.gui.engine_process import EngineProcess, StopFlag
from app.gui.page_job import BatchStepped, PageRead, ReadPage, RegionRead, RegionsFound, RegionStarted, crop_path
from app.records.documents import LayoutPage, Page
from app.records.sessions import Autosave, new_autosave_path, page_record
from engines.speculative.session import Session
from engines.speculative.trace import TraceError
from engines.types import EngineError


@dataclass
class PageSpec:
    """Everything one page's reading needs, decided on the GUI thread."""

    job: ReadPage
    page: Page
    model: str = ""  # the OCR model as the controls name it ("" = the downloaded GLM-OCR)
    settings: dict = field(default_factory=dict)
    autosave: bool = True


class PageWorker(QObject):
    started = Signal()
    engine_loaded = Signal(object)  # the model info
    regions_found = Signal(object)  # RegionsFound
    region_started = Signal(int)
    batch_stepped = Signal(object)  # BatchStepped
    region_read = Signal(object)  # RegionRead
    finished = Signal(object)  # the LayoutPage
    cancelled = Signal(object)  # the LayoutPage up to the stop
    errored = Signal(str)  # one line
    autosave_failed = Signal(str)
    done = Signal()  # always last

    def __init__(self, spec: PageSpec, engines: EngineProcess):
        super().__init__()
        self.spec, self.engines = spec, engines
        self.stop = StopFlag()
        self.model: dict = {}
        self.found: RegionsFound | None = None
        self.sessions: dict[int, Session] = {}
        self.read: dict[int, RegionRead] = {}
        self.autosaves: dict[int, Autosave] = {}
        self.markdown: str | None = None
        self.read_s = 0.0  # the last batch step's time: how long the regions took to read together

    def request_stop(self) -> None:
        """From the GUI thread: every region still reading ends at the next step."""
        self.engines.request_stop(self.stop)

    @Slot()
    def run(self) -> None:
        self.started.emit()
        try:
            outcome = self.engines.read_page(self.spec.job, self.spec.model, self.stop, self._loaded, self._event)
        except EngineError as e:  # the engine's own, or the engine process died
            self._end("errored", str(e))
            self.errored.emit(str(e))
        except Exception as e:  # a bug here must not take the window down
            traceback.print_exc()
            self._end("errored", f"{type(e).__name__}: {e}")
            self.errored.emit(f"{type(e).__name__}: {e}")
        else:
            self._end(outcome)
            (self.cancelled if outcome == "cancelled" else self.finished).emit(self.layout_page())
        finally:
            self.done.emit()

    def layout_page(self) -> LayoutPage:
        """The page as read so far: its regions in reading order, each with its Session."""
        from engines.glm_ocr.document import ReadRegion

        regions = []
        for region in self.found.regions if self.found else []:
            session, read = self.sessions.get(region.index), self.read.get(region.index)
            text = session.text if session is not None else ""
            regions.append(ReadRegion(self.spec.page.number, region, text, session, read.crop if read else None,
                                      read.note if read else None))
        found = self.found
        return LayoutPage(self.spec.page, regions, Path(self.spec.job.layout).name, found.note if found else None,
                          layout_s=found.seconds if found else 0.0, read_s=self.read_s)

    def read_to_its_end(self) -> bool:
        """Whether every region of the page ended on its own (read, or skipped), none cancelled or
        still waiting: such a page is read whatever the run's outcome (a Stop that came after its
        last step), as a whole page whose last round ended on its own is."""
        if self.found is None:
            return False
        ended = [self.read.get(region.index) for region in self.found.regions]
        return all(event is not None and event.finish != "cancelled" for event in ended)

    # --- the events (this thread) ------------------------------------------------------------
    def _loaded(self, model: dict) -> None:
        self.model = model
        self.engine_loaded.emit(model)

    def _event(self, event) -> None:
        if isinstance(event, RegionsFound):
            self.found = event
            self.regions_found.emit(event)
        elif isinstance(event, RegionStarted):
            self._region_started(event.index)
            self.region_started.emit(event.index)
        elif isinstance(event, BatchStepped):
            for index, burst in event.rounds:
                self.sessions[index].add(burst.round)
                if index in self.autosaves:
                    self.autosaves[index].write_burst(burst)
            self.read_s = event.at
            self.batch_stepped.emit(event)
        elif isinstance(event, RegionRead):
            self.read[event.index] = event
            self._close_autosave(event.index, "finished" if event.finish != "cancelled" else "cancelled")
            self.region_read.emit(event)
        elif isinstance(event, PageRead):
            self.markdown = event.markdown

    def _region_started(self, index: int) -> None:
        job = self.spec.job
        region = next(r for r in self.found.regions if r.index == index)
        request = replace(job.request, image=str(crop_path(job.crop_dir, job.page, index)), task=region.task)
        self.sessions[index] = session = Session(request=request.to_dict(), model=self.model)
        if not self.spec.autosave:
            return
        try:
            self.autosaves[index] = Autosave(new_autosave_path("ocr"), session, self.spec.settings,
                                             on_error=self.autosave_failed.emit,
                                             page=page_record(self.spec.page, region))
        except (TraceError, OSError) as e:
            self.autosave_failed.emit(str(e))

    def _close_autosave(self, index: int, outcome: str, message: str | None = None) -> None:
        autosave = self.autosaves.pop(index, None)
        if autosave is not None:
            autosave.write_end(outcome, message)
            autosave.close()

    def _end(self, outcome: str, message: str | None = None) -> None:
        for index in list(self.autosaves):  # regions that had not ended: cut short with the page
            self._close_autosave(index, outcome if outcome != "finished" else "cancelled", message)
