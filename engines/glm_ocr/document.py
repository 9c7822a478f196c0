"""Document assembly, GLM-OCR's second stage: each region the layout found (layout.py) is cut
from its page and read with its task's prompt; the texts become Markdown in reading order as
the official SDK writes it (glmocr/postprocess/result_formatter.py, 0.1.5: titles as headings,
formulas as $$ blocks with their numbers as \\tag, tables as the model emits them, figures as
image references, hyphenated lines joined, list items marked).

What is here: `crop_region` (the SDK's crop, padded when thinner than one image token),
`ReadRegion` (a region and what was read from it), `read_regions` (a page's regions -> their
results), `whole_page` (the one region a page is when layout finds nothing), `markdown_pages`
(the SDK's formatter).

`read_regions_together` reads a page's regions as the rows of one batch (engines/glm_ocr/
batch.py's OcrBatch: one decoder forward per step over every region still reading, each with its
own drafts and verdict), as the SDK reads them in parallel; `read_regions` reads them one after
another, each a run of its own through the caller's `run` (a runtime that cannot batch: Core ML).

`LayoutAhead` gives a document's pages' layouts (`find_layout`) in order, optionally each next
page's found on a worker thread while the caller reads this page's regions.

Not reproduced from the formatter: its hyphen check through the optional `wordfreq` package (the
SDK's own fallback, a pattern, is used: the SDK does not install wordfreq either).
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from engines.glm_ocr.image import MAX_ASPECT_RATIO, ImageProcessorConfig
from engines.glm_ocr.layout import Region
from engines.speculative.rounds import Round
from engines.speculative.session import Session
from engines.types import Request

# The vision encoder reads 14 px patches merged 2 x 2: a crop thinner than one merged patch
# would be stretched by the image processor; it is padded with white instead.
MIN_SIDE = ImageProcessorConfig().factor


@dataclass
class ReadRegion:
    """A region of a page and what was read from it ("" for a skipped region: a figure)."""

    page: int  # the page's number in its source, from 1
    region: Region
    text: str = ""
    session: Session | None = None  # the run that read it (None: skipped)
    crop: str | None = None  # the region's image file (a figure's Markdown refers to it)
    note: str | None = None  # padded, or why it was not read

    def record(self) -> dict:
        """The region's entry in a JSON export."""
        r = self.region
        entry = {"index": r.index, "label": r.label, "task": r.task, "bbox": list(r.box), "bbox_2d": list(r.bbox_2d),
                 "score": round(r.score, 4), "text": self.text}
        if self.crop and r.task == "skip":
            entry["image"] = self.crop
        if self.note:
            entry["note"] = self.note
        if self.session is not None:
            s = self.session.stats()
            entry["finish"] = self.session.finish
            entry["rounds"] = {"rounds": s.rounds, "tokens": s.tokens, "proposed": s.proposed, "accepted": s.accepted,
                               "acceptance_rate": round(s.acceptance_rate, 4), "tau": round(s.tau, 3),
                               "decode_tok_s": round(s.decode_tok_s, 2), "wall_s": round(s.wall_s, 4)}
        return entry


def crop_region(page, region: Region, out: Path) -> tuple[str | None, str | None]:
    """Cut `region` from the page image as the SDK does (its bbox_2d back to pixels, truncated)
    and save it to `out`. Returns (the file, a note): None and why for a region that is empty at
    this resolution; a note when the crop was padded to MIN_SIDE (and within the processor's
    aspect ratio)."""
    from PIL import Image

    b = region.bbox_2d
    x1, y1 = int(b[0] * page.width / 1000), int(b[1] * page.height / 1000)
    x2, y2 = int(b[2] * page.width / 1000), int(b[3] * page.height / 1000)
    if x2 <= x1 or y2 <= y1:
        return None, f"not read: the region is empty at this page's {page.width}x{page.height} pixels"
    crop = page.crop((x1, y1, x2, y2))
    note = None
    w, h = crop.size
    short = max(MIN_SIDE, math.ceil(max(w, h) / MAX_ASPECT_RATIO))
    if min(w, h) < short:
        width, height = (max(w, short), h) if w < h else (w, max(h, short))
        padded = Image.new("RGB", (max(width, MIN_SIDE), max(height, MIN_SIDE)), "white")
        padded.paste(crop, ((padded.width - w) // 2, (padded.height - h) // 2))
        note = f"padded from {w}x{h} to {padded.width}x{padded.height} px (the vision encoder reads at least {MIN_SIDE} px)"
        crop = padded
    out.parent.mkdir(parents=True, exist_ok=True)
    crop.save(out)
    return str(out), note


def whole_page(page) -> Region:
    """The region a page is read as when layout finds nothing: all of it, as text."""
    return Region(0, "page", "text", (0, 0, page.width, page.height), (0, 0, 1000, 1000), 1.0)


def read_regions(page, number: int, regions: list[Region], request: Request, crop_dir: Path,
                 run: Callable[[Request, Region], Session]) -> Iterator[ReadRegion]:
    """Each region of one page in reading order: cut out (crop_region) and, unless it is a
    figure ("skip": kept as an image reference), read with its task's prompt by `run` on
    `request` with the crop as its image. One region after another: see the module's note."""
    for region in regions:
        crop, note = crop_region(page, region, crop_dir / f"page-{number:04d}-region-{region.index:03d}.png")
        if crop is None or region.task == "skip":
            yield ReadRegion(number, region, crop=crop, note=note)
            continue
        session = run(replace(request, image=crop, task=region.task), region)
        yield ReadRegion(number, region, session.text, session, crop, note)


def read_regions_together(page, number: int, regions: list[Region], request: Request, crop_dir: Path, batch,
                          should_stop: Callable[[], bool] | None = None,
                          on_read: Callable[[ReadRegion], None] | None = None,
                          on_step: Callable[[list[tuple[Region, Round]]], None] | None = None) -> list[ReadRegion]:
    """Each region of one page, cut out as read_regions does, the readable ones read together
    as rows of `batch` (an OcrBatch: submit, step, busy); `on_step` hears each step's rounds
    (region, Round: the window shows them live), `on_read` each region as it is done (in the
    order they finish). Returns them in reading order."""
    crops = [(region, *crop_region(page, region, crop_dir / f"page-{number:04d}-region-{region.index:03d}.png"))
             for region in regions]
    sessions: dict[int, Session] = {}
    rows: dict[int, tuple[Region, str | None, str | None]] = {}  # sequence id -> its region, crop, note
    for region, crop, note in crops:
        if crop is None or region.task == "skip":
            continue
        region_request = replace(request, image=crop, task=region.task)
        seq = batch.submit(region_request, should_stop)
        rows[seq.id] = (region, crop, note)
        sessions[region.index] = Session(request=region_request.to_dict(), model=batch.engine.model_info())
    while batch.busy:
        stepped = batch.step()
        if on_step is not None:
            on_step([(rows[seq.id][0], rnd) for seq, rnd in stepped])
        for seq, rnd in stepped:
            region, crop, note = rows[seq.id]
            session = sessions[region.index]
            session.add(rnd)
            if rnd.finish and on_read is not None:
                on_read(ReadRegion(number, region, session.text, session, crop, note))
    out = []
    for region, crop, note in crops:
        session = sessions.get(region.index)
        out.append(ReadRegion(number, region, session.text if session else "", session, crop, note))
    return out


# ----------------------------------------------------------------------------- a document's pages


NO_REGIONS = "layout found no regions: the whole page is read as text"
LAYOUT_THREAD = "specscope-layout"  # the worker's name (a test looks for it)


@dataclass
class PageLayout:
    """A page as the layout stage leaves it: its image, its regions in reading order (the whole
    page, with `note` saying why, when layout found none) and how long the layout took."""

    image: object  # the page, an RGB PIL image (engines/glm_ocr/image.load_image)
    regions: list[Region]
    seconds: float
    note: str | None = None


def find_layout(layout, image_path: str) -> PageLayout:
    """The page at `image_path` through `layout` (a LayoutModel). EngineError when the page
    cannot be read or the layout fails."""
    from engines.glm_ocr.image import load_image

    image = load_image(image_path)
    started = time.perf_counter()
    regions = layout.regions(image)
    seconds = time.perf_counter() - started
    if not regions:
        return PageLayout(image, [whole_page(image)], seconds, NO_REGIONS)
    return PageLayout(image, regions, seconds)


class LayoutAhead:
    """A document's pages' layouts, in order: iterate to take each page's PageLayout when its
    regions are to be read. With `ahead`, one worker thread finds the next page's layout while
    the caller reads this page's (the layout forward runs beside the regions' decoding), at most
    one page ahead; without, each is found when it is taken. Either way the same layouts in the
    same order, and a page's layout error is raised when that page is taken (the pages before it
    read), with nothing started for the pages after it.

    `threads`: torch's intra-op threads on the worker (None: the creating thread's count, which
    the layout would have had in turn). They are the worker's own (torch sets OpenMP's and MKL's
    counts per thread), so the decoding thread keeps its count.

    A context manager: leaving it (the document read, stopped after a page, or an exception)
    drops a page not yet started and waits for the one in flight (a forward cannot be
    interrupted: at most one page's layout), so the worker never outlives it."""

    def __init__(self, layout, images: list[str], ahead: bool, threads: int | None = None):
        self.layout = layout
        self.images = list(images)
        if ahead and threads is None:
            import torch

            threads = torch.get_num_threads()
        self.threads = threads
        self.worker = (ThreadPoolExecutor(max_workers=1, thread_name_prefix=LAYOUT_THREAD, initializer=self._init)
                       if ahead else None)

    def __enter__(self) -> "LayoutAhead":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.shutdown(wait=True, cancel_futures=True)

    def __iter__(self) -> Iterator[PageLayout]:
        if self.worker is None:
            for image in self.images:
                yield find_layout(self.layout, image)
            return
        pending = self._start(0)
        for i in range(len(self.images)):
            found = pending.result()  # this page's layout error, raised at this page
            pending = self._start(i + 1)
            yield found

    def _start(self, i: int) -> Future | None:
        if i >= len(self.images):
            return None
        return self.worker.submit(find_layout, self.layout, self.images[i])

    def _init(self) -> None:
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)


# ----------------------------------------------------------------------------- Markdown


@dataclass
class _Block:
    """One region on its way to Markdown (the formatter's dict: native_label, label, content)."""

    native: str  # the layout's label
    kind: str  # text | table | formula | image
    content: str | None
    bbox_2d: tuple[int, int, int, int]
    crop: str | None


def markdown_pages(pages: list[list[ReadRegion]]) -> list[str]:
    """Each page's Markdown, as the SDK's ResultFormatter.process writes it; figures are
    numbered across the document ("![Image {page}-{n}](file)", page from 0)."""
    figures = 0
    out = []
    for page_index, regions in enumerate(pages):
        blocks = _merge_text_blocks(_merge_formula_numbers(_blocks(regions)))
        _mark_list_items(blocks)
        parts = []
        for block in blocks:
            if block.kind == "image":
                if block.crop:
                    parts.append(f"![Image {page_index}-{figures}]({block.crop})")
                    figures += 1
            elif block.content:
                parts.append(block.content)
        out.append("\n\n".join(parts))
    return out


def _blocks(regions: list[ReadRegion]) -> list[_Block]:
    blocks = []
    for rr in sorted(regions, key=lambda r: r.region.index):
        kind = "image" if rr.region.task == "skip" else rr.region.task
        content = None if kind == "image" else format_content(rr.text.strip(), kind, rr.region.label)
        if kind != "image" and not (content or "").strip():
            continue  # nothing read: no block
        blocks.append(_Block(rr.region.label, kind, content, rr.region.bbox_2d, rr.crop))
    return blocks


def format_content(content: str, kind: str, native: str) -> str:
    """One region's text as the SDK formats it (_format_content)."""
    if kind == "table" and content.startswith("<table") and content.endswith("</table>"):
        content = content.strip()
    elif kind == "formula" and content.startswith("$$") and content.endswith("$$"):
        content = content.strip()
    else:
        content = clean_content(content)

    if native == "doc_title":
        content = "# " + re.sub(r"^#+\s*", "", content)
    elif native == "paragraph_title":
        if content.startswith(("- ", "* ")):
            content = content[2:].lstrip()
        content = "## " + re.sub(r"^#+\s*", "", content).lstrip()

    if kind == "formula":
        if content.startswith(("$$", "\\[", "\\(")):
            content = content[2:].strip()
        if content.endswith(("$$", "\\]", "\\)")):
            content = content[:-2].strip()
        content = "$$\n" + content + "\n$$"

    if kind == "text":
        if content.startswith("```") and not content.endswith("```"):
            content += "\n```"
        if content.startswith(("·", "•", "* ")):
            content = "- " + content[1:].lstrip()
        match = re.match(r"^(\(|\（)(\d+|[A-Za-z])(\)|\）)(.*)$", content)
        if match:
            _, symbol, _, rest = match.groups()
            content = f"({symbol}) {rest.lstrip()}"
        match = re.match(r"^(\d+|[A-Za-z])(\.|\)|\）)(.*)$", content)
        if match:
            symbol, sep, rest = match.groups()
            content = f"{symbol}{')' if sep == '）' else sep} {rest.lstrip()}"
        content = re.sub(r"(?<!\n)\n(?!\n)", "\n\n", content)
    return content


def clean_content(content: str) -> str:
    """The SDK's _clean_content: literal \\t at the ends, runs of dots, middle dots and
    underscores cut to three, a long text's repeated tail dropped, inline formulas spaced."""
    content = re.sub(r"^(\\t)+", "", content).lstrip()
    content = re.sub(r"(\\t)+$", "", content).rstrip()
    for pattern in (r"(\.)\1{2,}", r"(·)\1{2,}", r"(_)\1{2,}", r"(\\_)\1{2,}"):
        content = re.sub(pattern, r"\1\1\1", content)
    if len(content) >= 2048:
        content = _drop_repeats(content)
    return _space_inline_formulas(content).strip()


def _drop_repeats(content: str, min_len: int = 10, min_repeats: int = 10, line_threshold: int = 10) -> str:
    """clean_repeated_content: a unit of min_len+ characters repeated min_repeats+ times in a
    row is kept once; else a line that makes 80% of 10+ lines, three times in a row, ends it."""
    stripped = content.strip()
    if not stripped:
        return content
    n = len(stripped)
    if n > min_len * min_repeats and n // min_repeats >= min_len:
        unit = re.compile(r"(.{" + f"{min_len},{n // min_repeats}" + r"}?)\1{" + str(min_repeats - 1) + ",}", re.DOTALL)
        match = unit.search(stripped)
        if match:
            return stripped[: match.start()] + match.group(1)
    lines = [line.strip() for line in content.split("\n") if line.strip()]
    if len(lines) >= line_threshold:
        common, count = Counter(lines).most_common(1)[0]
        if count >= line_threshold and count / len(lines) >= 0.8:
            for i, line in enumerate(lines):
                if line == common and sum(1 for j in range(i, min(i + 3, len(lines))) if lines[j] == common) >= 3:
                    kept = 0
                    original = content.split("\n")
                    for k, orig in enumerate(original):
                        if orig.strip():
                            kept += 1
                            if kept == i + 1:
                                return "\n".join(original[: k + 1])
                    break
    return content


INLINE_FORMULA = re.compile(r"(?<!\$)\$\s*((?:[^$\\]|\\.)+?)\s*\$(?!\$)")


def _space_inline_formulas(content: str) -> str:
    """normalize_inline_formula: `$ x $` -> `$x$`, a space between it and a word beside it."""
    if "$" not in content:
        return content
    parts, last = [], 0
    for m in INLINE_FORMULA.finditer(content):
        formula = m.group(1).strip()
        if not formula:
            continue
        before = content[last : m.start()]
        if before and before[-1].isalnum():
            before += " "
        parts += [before, f"${formula}$"]
        if m.end() < len(content) and content[m.end()].isalnum():
            parts.append(" ")
        last = m.end()
    if not parts:
        return content
    return "".join(parts) + content[last:]


def _formula_number(text: str) -> str:
    text = text.strip()
    if (text.startswith("(") and text.endswith(")")) or (text.startswith("（") and text.endswith("）")):
        return text[1:-1]
    return text


def _tagged(formula: _Block, number: _Block) -> _Block:
    """The formula with its number as \\tag{...} (only a formula ending in "\\n$$" takes it)."""
    content = formula.content or ""
    if content.endswith("\n$$"):
        content = content[:-3] + f" \\tag{{{_formula_number(number.content or '')}}}\n$$"
    return _Block(formula.native, formula.kind, content, formula.bbox_2d, formula.crop)


def _merge_formula_numbers(blocks: list[_Block]) -> list[_Block]:
    """A formula_number beside a formula (before or after it) becomes its \\tag; a number with
    no formula after it is dropped."""
    out, skip = [], set()
    for i, block in enumerate(blocks):
        if i in skip:
            continue
        following = blocks[i + 1] if i + 1 < len(blocks) else None
        if block.native == "formula_number":
            if following is not None and following.kind == "formula":
                out.append(_tagged(following, block))
                skip.add(i + 1)
            continue
        if block.kind == "formula" and following is not None and following.native == "formula_number":
            out.append(_tagged(block, following))
            skip.add(i + 1)
            continue
        out.append(block)
    return out


def _plausible_word(word: str) -> bool:
    """The SDK's pattern for a word joined across a hyphen (its fallback without wordfreq)."""
    token = word.strip().lower()
    return bool(re.fullmatch(r"[a-z][a-z'\-]{2,30}", token)) and "--" not in token and "''" not in token


def _merge_text_blocks(blocks: list[_Block]) -> list[_Block]:
    """A text block ending in a hyphen joins the next text block when that starts in lower
    case and the joined word looks like a word."""
    out, skip = [], set()
    for i, block in enumerate(blocks):
        if i in skip:
            continue
        text = (block.content or "").rstrip() if block.kind == "text" else ""
        merged = False
        if text.endswith("-"):
            for j in range(i + 1, len(blocks)):
                after = (blocks[j].content or "").lstrip() if blocks[j].kind == "text" else ""
                if not (after and after[0].islower()):
                    continue  # the SDK looks on, to the first text block in lower case
                before_words, after_words = text[:-1].split(), after.split()
                if before_words and after_words and _plausible_word(before_words[-1] + after_words[0]):
                    out.append(_Block(block.native, block.kind, text[:-1] + after, block.bbox_2d, block.crop))
                    skip.add(j)
                    merged = True
                break
        if not merged:
            out.append(block)
    return out


def _mark_list_items(blocks: list[_Block], left_align: float = 10.0) -> None:
    """A text block between two list items ("- ") and aligned with both becomes one too."""
    for i in range(1, len(blocks) - 1):
        before, block, after = blocks[i - 1], blocks[i], blocks[i + 1]
        if not all(b.native == "text" for b in (before, block, after)) or (block.content or "").startswith("- "):
            continue
        if not ((before.content or "").startswith("- ") and (after.content or "").startswith("- ")):
            continue
        left = block.bbox_2d[0]
        if abs(left - before.bbox_2d[0]) <= left_align and abs(left - after.bbox_2d[0]) <= left_align:
            block.content = "- " + (block.content or "")
