"""The document pane: the pages an OCR run reads. Drop images, multi-page TIFFs or PDFs (several
at once) onto it, open them from a dialog or paste an image from the clipboard; zoom, pan
(drag), fit; step through pages with the page list beside the view, which also shows how far
the reading has come (queued, reading, read, stopped). With Region on, dragging draws a
rectangle and only that part of the page is read. Files become pages in app.records.documents."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QPointF, QRect, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QImage, QPainter, QPen, QPixmap
from PySide6.QtWidgets import (
    QFileDialog, QGraphicsPixmapItem, QGraphicsRectItem, QGraphicsScene, QGraphicsView, QHBoxLayout,
    QLabel, QListWidget, QListWidgetItem, QSplitter, QStackedLayout, QToolButton, QVBoxLayout, QWidget,
)

from app.records.documents import DOCUMENT_SUFFIXES, DocumentError, Page, pages_of

PAGE_STATES = {  # page list marks: what the reading of a page came to
    "": "", "queued": "•", "reading": "▶", "read": "✓", "repetition": "⟳",
    "length": "…", "cancelled": "■", "errored": "✕",
}
PAGE_STATE_TIPS = {
    "queued": "waiting to be read", "reading": "being read", "read": "read to the end",
    "repetition": "stopped: the text repeated itself", "length": "stopped at max tokens",
    "cancelled": "stopped by you", "errored": "could not be read",
}


def upright_pixmap(path: str) -> QPixmap:
    """The page as the model sees it: the OCR engine's own loader (EXIF orientation applied by
    ImageOps.exif_transpose, transparency on white), where Qt alone would show a phone photo
    sideways. A file that loader refuses is shown as Qt reads it; the run says what is wrong."""
    from engines.types import EngineError
    from engines.glm_ocr.image import load_image

    try:
        rgb = load_image(path)
    except EngineError:
        return QPixmap(path)
    image = QImage(rgb.tobytes(), rgb.width, rgb.height, 3 * rgb.width, QImage.Format.Format_RGB888)
    return QPixmap.fromImage(image.copy())  # copy: the QImage borrows the bytes object's buffer


def document_paths_from_mime(mime) -> list[str]:
    paths = []
    for url in mime.urls() if mime.hasUrls() else []:
        if url.isLocalFile() and Path(url.toLocalFile()).suffix.lower() in DOCUMENT_SUFFIXES:
            paths.append(url.toLocalFile())
    return paths


class PageView(QGraphicsView):
    """Zoom with the wheel (or pinch), pan by dragging; `fit` shows the whole page."""

    zoom_changed = Signal(float)
    region_changed = Signal(object)  # QRect in page pixels, or None

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.item = QGraphicsPixmapItem()
        self.item.setTransformationMode(Qt.TransformationMode.SmoothTransformation)
        self.scene().addItem(self.item)
        self.region_item = QGraphicsRectItem()
        pen = QPen(QColor("#0a84ff"), 2)
        pen.setCosmetic(True)  # the same width at every zoom
        self.region_item.setPen(pen)
        self.region_item.setBrush(QColor(10, 132, 255, 40))
        self.region_item.setZValue(1)
        self.region_item.hide()
        self.scene().addItem(self.region_item)
        self.selecting = False  # Region mode: a drag draws the region instead of panning
        self.drag_start: QPointF | None = None
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.SmoothPixmapTransform)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setAcceptDrops(False)  # drops go to the DocumentView around it
        self.setFrameShape(QGraphicsView.Shape.NoFrame)
        self.fitting = True

    def set_pixmap(self, pixmap: QPixmap) -> None:
        self.item.setPixmap(pixmap)
        self.scene().setSceneRect(QRectF(pixmap.rect()))
        self.set_region(None)
        self.fit()

    # --- region ---------------------------------------------------------------------------
    def set_selecting(self, on: bool) -> None:
        self.selecting = on
        self.setDragMode(QGraphicsView.DragMode.NoDrag if on else QGraphicsView.DragMode.ScrollHandDrag)
        self.viewport().setCursor(Qt.CursorShape.CrossCursor if on else Qt.CursorShape.OpenHandCursor)

    def region(self) -> QRect | None:
        """The chosen region in page pixels, or None."""
        if not self.region_item.isVisible():
            return None
        return self.region_item.rect().toAlignedRect()

    def set_region(self, rect: QRect | QRectF | None) -> None:
        """A rectangle in page pixels (clipped to the page); None or an empty one clears it."""
        page = QRectF(self.item.pixmap().rect())
        clipped = QRectF(rect).intersected(page) if rect is not None else QRectF()
        if clipped.width() < 4 or clipped.height() < 4:  # a click, not a drag
            changed = self.region_item.isVisible()
            self.region_item.hide()
            if changed:
                self.region_changed.emit(None)
            return
        self.region_item.setRect(QRectF(clipped.toAlignedRect()))
        self.region_item.show()
        self.region_changed.emit(self.region())

    def mousePressEvent(self, event) -> None:
        if self.selecting and event.button() == Qt.MouseButton.LeftButton:
            self.drag_start = self.mapToScene(event.position().toPoint())
            self.region_item.setRect(QRectF(self.drag_start, self.drag_start))
            self.region_item.show()
            return
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event) -> None:
        if self.drag_start is not None:
            here = self.mapToScene(event.position().toPoint())
            self.region_item.setRect(QRectF(self.drag_start, here).normalized())
            return
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event) -> None:
        if self.drag_start is not None:
            here = self.mapToScene(event.position().toPoint())
            start, self.drag_start = self.drag_start, None
            self.set_region(QRectF(start, here).normalized())
            return
        super().mouseReleaseEvent(event)

    @property
    def zoom(self) -> float:
        return self.transform().m11()

    def fit(self) -> None:
        self.fitting = True
        if not self.item.pixmap().isNull():
            self.fitInView(self.item, Qt.AspectRatioMode.KeepAspectRatio)
        self.zoom_changed.emit(self.zoom)

    def set_zoom(self, zoom: float) -> None:
        self.fitting = False
        zoom = max(0.05, min(zoom, 16.0))
        self.setTransform(self.transform().fromScale(zoom, zoom))
        self.zoom_changed.emit(self.zoom)

    def zoom_by(self, factor: float) -> None:
        self.set_zoom(self.zoom * factor)

    def wheelEvent(self, event) -> None:
        if event.modifiers() & (Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.MetaModifier):
            self.zoom_by(1.0015 ** event.angleDelta().y())
        else:
            super().wheelEvent(event)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self.fitting:
            self.fit()


class ElidedLabel(QLabel):
    """A one-line label that shows as much of its text as fits, eliding the middle (so a file
    name keeps its start and its extension); the whole text is its tooltip. A plain QLabel
    would be cut at the right edge by the pane's tool buttons at 1280 px."""

    def __init__(self, text: str = "", **kwargs):
        super().__init__(**kwargs)
        self.full_text = ""
        self.setMinimumWidth(40)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self.full_text = text
        self.setToolTip(text)
        self._elide()

    def sizeHint(self):  # noqa: N802 (Qt's name)
        hint = super().sizeHint()
        hint.setWidth(self.fontMetrics().horizontalAdvance(self.full_text) + 4)
        return hint

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self.full_text, Qt.TextElideMode.ElideMiddle, self.width())
        super().setText(shown)


class PageList(QListWidget):
    """One row per page: its label and a mark for how its reading went."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("pageList")
        self.setMinimumWidth(90)
        self.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long names elide
        self.states: list[str] = []

    def set_pages(self, pages: list[Page]) -> None:
        self.blockSignals(True)
        self.clear()
        self.states = [""] * len(pages)
        one_file = len({p.source for p in pages}) == 1  # the pane's title names it already
        for page in pages:
            item = QListWidgetItem(f"Page {page.number}" if one_file else page.label)
            item.setToolTip(page.source)
            self.addItem(item)
        self.blockSignals(False)

    def set_state(self, index: int, state: str, detail: str = "") -> None:
        item = self.item(index)
        if item is None:
            return
        self.states[index] = state
        label = item.text().split("  ", 1)[-1] if item.text()[:1] in PAGE_STATES.values() else item.text()
        mark = PAGE_STATES.get(state, "")
        item.setText(f"{mark}  {label}" if mark else label)
        tip = PAGE_STATE_TIPS.get(state, "")
        item.setToolTip("\n".join(t for t in (label, tip, detail) if t))


class DocumentView(QWidget):
    pages_changed = Signal(int)
    page_changed = Signal(int)
    load_failed = Signal(str)  # one line: a file that could not become pages
    region_changed = Signal(object)  # QRect in page pixels, or None
    layout_toggled = Signal(bool)  # Layout on (pages read by region when the layout model is installed) or off

    def __init__(self, paste_dir: Path | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("document")
        self.setAcceptDrops(True)
        self.paste_dir = paste_dir
        self.pages: list[Page] = []
        self.index = -1

        self.view = PageView()
        self.view.region_changed.connect(self._on_region_changed)
        self.empty = QLabel("Drop images or PDFs here\n\nor open (Ctrl+O) \u00b7 paste (Ctrl+V)",
                            objectName="emptyState")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.page_list = PageList()
        self.page_list.currentRowChanged.connect(self.show_page)
        self.split = QSplitter(Qt.Orientation.Horizontal)
        self.split.addWidget(self.page_list)
        self.split.addWidget(self.view)
        self.split.setStretchFactor(1, 1)
        self.split.setSizes([130, 400])
        self.split.setChildrenCollapsible(False)
        self.split.setHandleWidth(1)
        self.stack = QStackedLayout()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self.split)

        self.title = ElidedLabel("Document", objectName="paneTitle")
        self.page_label = QLabel(objectName="muted")
        self.zoom_label = QLabel(objectName="muted")
        self.view.zoom_changed.connect(lambda z: self.zoom_label.setText(f"{z * 100:.0f}%"))
        bar = QHBoxLayout()
        bar.setContentsMargins(12, 8, 8, 6)
        bar.addWidget(self.title, 1)
        self.prev_button = self._tool("\u2039", "Previous page", self.previous_page)
        self.next_button = self._tool("\u203a", "Next page", self.next_page)
        for w in (self.prev_button, self.page_label, self.next_button):
            bar.addWidget(w)
        bar.addSpacing(6)
        self.layout_button = self._tool("Layout", "Find each page's regions with the layout model and read them "
                                        "together, each with its own task, as GLM-OCR's SDK does (when the layout "
                                        "model is installed); off: read whole pages", self._on_layout_clicked)
        self.layout_button.setCheckable(True)
        self.layout_button.setChecked(True)
        bar.addWidget(self.layout_button)
        self.region_button = self._tool("Region", "Drag a rectangle on the page to read just that region "
                                        "(the task applies to it); click Region again to read whole pages",
                                        self._on_region_toggled)
        self.region_button.setCheckable(True)
        bar.addWidget(self.region_button)
        bar.addWidget(self._tool("\u2212", "Zoom out", lambda: self.view.zoom_by(1 / 1.25)))
        bar.addWidget(self.zoom_label)
        bar.addWidget(self._tool("+", "Zoom in", lambda: self.view.zoom_by(1.25)))
        bar.addWidget(self._tool("Fit", "Fit the page", self.view.fit))
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(0)
        col.addLayout(bar)
        col.addLayout(self.stack, 1)
        self._update_bar()

    def _tool(self, text: str, tip: str, slot) -> QToolButton:
        b = QToolButton(text=text, toolTip=tip, autoRaise=True)
        b.clicked.connect(slot)
        return b

    # --- pages ----------------------------------------------------------------------------
    def add_files(self, paths: list[str]) -> int:
        """Adds every page of the files (PDF pages, TIFF frames, images), in order, and shows
        the first new one; returns how many pages were added. A file that cannot be read is
        reported by load_failed (one line) and the others are still added."""
        added: list[Page] = []
        for path in paths:
            try:
                pages = pages_of([str(path)], self.cache_dir())
            except DocumentError as e:
                self.load_failed.emit(str(e))
                continue
            readable = [p for p in pages if not QImage(p.image).isNull()]
            if len(readable) < len(pages):
                self.load_failed.emit(f"{Path(path).name} is not an image Specscope can read")
            added += readable
        if added:
            self.pages.extend(added)
            self.page_list.set_pages(self.pages)
            self.page_list.setVisible(len(self.pages) > 1)
            self.pages_changed.emit(len(self.pages))
            self.show_page(len(self.pages) - len(added))
        return len(added)

    add_images = add_files  # a page image is a document of one page

    def cache_dir(self) -> Path:
        from app.settings import data_dir

        return (self.paste_dir.parent if self.paste_dir else data_dir()) / "pages"

    def show_page(self, index: int) -> None:
        if not 0 <= index < len(self.pages):
            return
        self.index = index
        self.view.set_pixmap(upright_pixmap(self.pages[index].image))
        self.stack.setCurrentWidget(self.split)
        if self.page_list.currentRow() != index:
            self.page_list.blockSignals(True)
            self.page_list.setCurrentRow(index)
            self.page_list.blockSignals(False)
        self._update_bar()
        self.page_changed.emit(index)

    def next_page(self) -> None:
        self.show_page(self.index + 1)

    def previous_page(self) -> None:
        self.show_page(self.index - 1)

    def current_page(self) -> Page | None:
        return self.pages[self.index] if 0 <= self.index < len(self.pages) else None

    def current_image(self) -> str | None:
        page = self.current_page()
        return page.image if page else None

    def page_images(self) -> list[str]:
        return [p.image for p in self.pages]

    def set_page_state(self, index: int, state: str, detail: str = "") -> None:
        self.page_list.set_state(index, state, detail)

    def clear(self) -> None:
        self.pages, self.index = [], -1
        self.page_list.set_pages([])
        self.stack.setCurrentWidget(self.empty)
        self._update_bar()
        self.pages_changed.emit(0)

    def _update_bar(self) -> None:
        many = len(self.pages) > 1
        self.page_label.setText(f"{self.index + 1} / {len(self.pages)}" if self.pages else "")
        self.prev_button.setVisible(many)
        self.next_button.setVisible(many)
        self.prev_button.setEnabled(self.index > 0)
        self.next_button.setEnabled(self.index < len(self.pages) - 1)
        page = self.current_page()
        self.title.setText(Path(page.source).name if page else "Document")  # the page: "2 / 3" beside it
        self.region_button.setEnabled(page is not None)

    def _on_layout_clicked(self) -> None:
        self.layout_toggled.emit(self.layout_button.isChecked())

    # --- region ---------------------------------------------------------------------------
    def _on_region_toggled(self) -> None:
        on = self.region_button.isChecked()
        self.view.set_selecting(on)
        if not on:
            self.view.set_region(None)

    def _on_region_changed(self, rect) -> None:
        self.region_changed.emit(rect)

    def region(self) -> QRect | None:
        return self.view.region() if self.region_button.isChecked() else None

    def set_region(self, rect: QRect | None) -> None:
        """Turns Region on and selects `rect` (page pixels); None turns it off."""
        self.region_button.setChecked(rect is not None)
        self._on_region_toggled()
        if rect is not None:
            self.view.set_region(rect)

    def region_image(self) -> str | None:
        """The chosen region of the current page saved as a PNG (engines read files), or None."""
        rect, page = self.region(), self.current_page()
        if rect is None or page is None or self.paste_dir is None:
            return None
        self.paste_dir.mkdir(parents=True, exist_ok=True)
        path = self.paste_dir / (f"region-{Path(page.image).stem}-{rect.x()}-{rect.y()}-"
                                 f"{rect.width()}x{rect.height()}.png")
        # cut from the page as shown (upright), where the rectangle was drawn
        if not upright_pixmap(page.image).toImage().copy(rect).save(str(path), "PNG"):
            return None
        return str(path)

    # --- drop, open, paste ----------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:
        if document_paths_from_mime(event.mimeData()) or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dragMoveEvent(self, event) -> None:
        self.dragEnterEvent(event)

    def dropEvent(self, event) -> None:
        if self.accept_mime(event.mimeData()):
            event.acceptProposedAction()

    def accept_mime(self, mime) -> bool:
        paths = document_paths_from_mime(mime)
        if paths:
            return self.add_files(paths) > 0
        if mime.hasImage():
            return self.add_qimage(QImage(mime.imageData()))
        return False

    def open_dialog(self) -> None:
        patterns = " ".join(f"*{s}" for s in sorted(DOCUMENT_SUFFIXES))
        paths, _ = QFileDialog.getOpenFileNames(self, "Open images or PDFs", "", f"Documents ({patterns})")
        self.add_files(paths)

    def paste(self, clipboard) -> bool:
        """An image on the clipboard (or copied image / PDF files) becomes a page."""
        mime = clipboard.mimeData()
        return mime is not None and self.accept_mime(mime)

    def add_qimage(self, image: QImage) -> bool:
        """Engines read files, so a pasted image is saved as a PNG first."""
        if image.isNull() or self.paste_dir is None:
            return False
        self.paste_dir.mkdir(parents=True, exist_ok=True)
        path = self.paste_dir / f"pasted-{time.strftime('%Y%m%d-%H%M%S')}-{len(self.pages)}.png"
        return image.save(str(path), "PNG") and self.add_files([str(path)]) > 0
