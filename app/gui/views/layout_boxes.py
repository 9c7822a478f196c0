"""The layout's boxes on the page: each region the layout stage found, outlined and tinted by
its state (waiting for a row, reading, done, skipped, stopped), with a tag naming it (its place
in reading order, its label, how many tokens it has) and, under the tag, the last characters it
read, the accepted drafts tinted as in the transcript. Clicking a box (or its tag) selects the
region: the window shows its rounds.

`RegionStates` is one page's boxes as data (what the window keeps for every page read by
region); `LayoutOverlay` draws the shown page's on the page view's scene. Outlines keep their
width at every zoom, and the tags their size (they ignore the view's transform)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem, QGraphicsRectItem, QGraphicsTextItem, QStyle

from app.records.bursts import Burst

STATES = ("waiting", "reading", "done", "skipped", "stopped")
STATE_COLOURS = {"waiting": "#8e8e93", "reading": "#0a84ff", "done": "#1f9d55", "skipped": "#aeaeb2",
                 "stopped": "#ff453a"}
STATE_TIPS = {"waiting": "waiting for a row of the batch", "reading": "being read", "done": "read",
              "skipped": "not read (a figure: kept as an image reference; or empty at the page's pixels)",
              "stopped": "stopped by you"}
SELECTED = QColor("#ff9f0a")
DRAFT_FG, DRAFT_BG = "#0b6b3a", "#d9f2e3"  # the transcript's accepted-draft colours
TAIL_CHARS = 90  # how much of a region's text its tag shows, at most
TAG_MAX_WIDTH = 240


@dataclass
class RegionStates:
    """One page's regions as the window shows them: state, tokens, the tail of the text read
    (as (piece, came from an accepted draft) pairs) and which one is selected."""

    regions: list  # engines.glm_ocr.layout.Region, in reading order
    states: dict[int, str] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    tails: dict[int, list[tuple[str, bool]]] = field(default_factory=dict)
    selected: int | None = None

    def __post_init__(self):
        for region in self.regions:
            self.states.setdefault(region.index, "skipped" if region.task == "skip" else "waiting")

    def add(self, index: int, burst: Burst) -> None:
        self.tokens[index] = self.tokens.get(index, 0) + len(burst.round.tokens)
        tail = self.tails.setdefault(index, [])
        tail.extend(piece for piece in burst.segments() if piece[0])
        while sum(len(p) for p, _ in tail) > TAIL_CHARS and len(tail) > 1:
            tail.pop(0)

    def region(self, index: int):
        return next((r for r in self.regions if r.index == index), None)


class RegionTag(QGraphicsTextItem):
    """A rounded label drawn at a fixed size whatever the zoom; a click selects its region."""

    def __init__(self, overlay: "LayoutOverlay", index: int, parent: QGraphicsItem | None = None):
        super().__init__(parent)
        self.overlay, self.index = overlay, index
        self.fill = QColor("white")
        self.setFlag(QGraphicsItem.GraphicsItemFlag.ItemIgnoresTransformations, parent is None)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.document().setDocumentMargin(3)

    def paint(self, painter: QPainter, option, widget=None) -> None:  # noqa: D102 (Qt's)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(self.fill)
        painter.drawRoundedRect(self.boundingRect(), 5, 5)
        option.state &= ~(QStyle.StateFlag.State_Selected | QStyle.StateFlag.State_HasFocus)
        super().paint(painter, option, widget)

    def mousePressEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.overlay.clicked(self.index)
        event.accept()


class RegionBox(QGraphicsRectItem):
    def __init__(self, overlay: "LayoutOverlay", index: int, rect: QRectF):
        super().__init__(rect)
        self.overlay, self.index = overlay, index
        self.setZValue(2)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.tag = RegionTag(overlay, index)
        self.tag.setZValue(4)
        self.tail = RegionTag(overlay, index, parent=self.tag)
        self.tail.fill = QColor(255, 255, 255, 232)

    def mousePressEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.overlay.clicked(self.index)
        event.accept()


class LayoutOverlay(QObject):
    """Draws a RegionStates on a PageView (app/gui/views/document.py) and says which box was clicked."""

    region_clicked = Signal(int)

    def __init__(self, view):
        super().__init__(view)
        self.view = view
        self.states: RegionStates | None = None
        self.boxes: dict[int, RegionBox] = {}
        self.tag_font = QFont()
        self.tag_font.setPointSizeF(8.5)
        view.zoom_changed.connect(self._fit_tails)

    def show_states(self, states: RegionStates | None) -> None:
        """The page's boxes (None: none), replacing what was shown."""
        self.clear()
        self.states = states
        if states is None:
            return
        scene = self.view.scene()
        for region in states.regions:
            x1, y1, x2, y2 = region.box
            box = RegionBox(self, region.index, QRectF(x1, y1, max(1, x2 - x1), max(1, y2 - y1)))
            scene.addItem(box)
            scene.addItem(box.tag)
            box.tag.setPos(x1, y1)
            for tag in (box.tag, box.tail):
                tag.setFont(self.tag_font)
            self.boxes[region.index] = box
            self.update(region.index)
        self._fit_tails(self.view.zoom)

    def clear(self) -> None:
        scene = self.view.scene()
        for box in self.boxes.values():
            scene.removeItem(box.tag)
            scene.removeItem(box)
        self.boxes = {}
        self.states = None

    def clicked(self, index: int) -> None:
        self.region_clicked.emit(index)

    def update(self, index: int) -> None:
        """Redraws one box from the states (its colour, tag and tail)."""
        box = self.boxes.get(index)
        if box is None or self.states is None:
            return
        s = self.states
        region, state = s.region(index), s.states.get(index, "waiting")
        colour = QColor(STATE_COLOURS[state])
        selected = s.selected == index
        pen = QPen(SELECTED if selected else colour, 2.5 if selected else 1.5)
        pen.setCosmetic(True)
        pen.setStyle({"waiting": Qt.PenStyle.DashLine, "skipped": Qt.PenStyle.DotLine}.get(state, Qt.PenStyle.SolidLine))
        box.setPen(pen)
        fill = QColor(colour)
        fill.setAlpha(46 if state == "reading" else 22 if state != "skipped" else 10)
        box.setBrush(QBrush(fill))
        box.setZValue(2 + self._smallness(region))  # a box inside another stays clickable
        tokens = s.tokens.get(index)
        detail = f" \u00b7 {tokens} tok" if tokens else ""
        box.tag.fill = colour
        box.tag.setHtml(f"<span style='color:white'><b>{index + 1}</b>&nbsp; {html.escape(region.label)}"
                        f"<span style='color:rgba(255,255,255,0.82)'>{detail}</span></span>")
        box.tag.setZValue(6 if selected else 4 + self._smallness(region))
        tail = s.tails.get(index)
        box.tail.setVisible(bool(tail) and state in ("reading", "done", "stopped"))
        if tail:
            box.tail.setHtml("".join(self._piece(text, drafted) for text, drafted in tail))
        box.tail.setPos(0, box.tag.boundingRect().height() + 2)
        tip = f"{index + 1}. {region.label} ({region.task}) \u00b7 {STATE_TIPS[state]}"
        box.setToolTip(tip + (f" \u00b7 {tokens} tokens" if tokens else "") + "\nClick: its rounds")
        box.tag.setToolTip(box.toolTip())

    def _smallness(self, region) -> float:
        """0 for a box as large as the page, towards 1 for a tiny one."""
        page = self.view.sceneRect()
        x1, y1, x2, y2 = region.box
        area = max(1.0, page.width() * page.height())
        return max(0.0, 1.0 - (x2 - x1) * (y2 - y1) / area)

    @staticmethod
    def _piece(text: str, drafted: bool) -> str:
        escaped = html.escape(text.replace("\n", " "))
        if drafted:
            return f"<span style='color:{DRAFT_FG};background-color:{DRAFT_BG}'>{escaped}</span>"
        return f"<span style='color:#1d1d1f'>{escaped}</span>"

    def _fit_tails(self, zoom: float) -> None:
        """A tag's text is as wide as its box on screen (within limits), so tails stay in their boxes."""
        for box in self.boxes.values():
            width = box.rect().width() * zoom - 6
            box.tail.setTextWidth(max(80.0, min(TAG_MAX_WIDTH, width)))

    def state_colour(self, index: int) -> str:
        """The colour a box is drawn in (tests, screenshots)."""
        return STATE_COLOURS[self.states.states[index]] if self.states else ""
