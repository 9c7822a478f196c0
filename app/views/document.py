"""The document pane: the page images an OCR run reads. Drop images (or several) onto it, open
them from a dialog or paste from the clipboard; zoom, pan (drag), fit; step through pages.
It never changes while a run streams, so the page being read stays in view."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QImage, QImageReader, QPainter, QPixmap
from PySide6.QtWidgets import (
    QFileDialog, QGraphicsPixmapItem, QGraphicsScene, QGraphicsView, QHBoxLayout, QLabel,
    QStackedLayout, QToolButton, QVBoxLayout, QWidget,
)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


def upright_pixmap(path: str) -> QPixmap:
    """The page as the model sees it: the OCR engine's own loader (EXIF orientation applied by
    ImageOps.exif_transpose, transparency on white), where Qt alone would show a phone photo
    sideways. A file that loader refuses is shown as Qt reads it; the run says what is wrong."""
    from engines import EngineError
    from engines.glm_ocr.image import load_image

    try:
        rgb = load_image(path)
    except EngineError:
        return QPixmap(path)
    image = QImage(rgb.tobytes(), rgb.width, rgb.height, 3 * rgb.width, QImage.Format.Format_RGB888)
    return QPixmap.fromImage(image.copy())  # copy: the QImage borrows the bytes object's buffer


def image_paths_from_mime(mime) -> list[str]:
    paths = []
    for url in mime.urls() if mime.hasUrls() else []:
        if url.isLocalFile() and Path(url.toLocalFile()).suffix.lower() in IMAGE_SUFFIXES:
            paths.append(url.toLocalFile())
    return paths


class PageView(QGraphicsView):
    """Zoom with the wheel (or pinch), pan by dragging; `fit` shows the whole page."""

    zoom_changed = Signal(float)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.item = QGraphicsPixmapItem()
        self.item.setTransformationMode(Qt.TransformationMode.SmoothTransformation)
        self.scene().addItem(self.item)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.SmoothPixmapTransform)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setAcceptDrops(False)  # drops go to the DocumentView around it
        self.setFrameShape(QGraphicsView.Shape.NoFrame)
        self.fitting = True

    def set_pixmap(self, pixmap: QPixmap) -> None:
        self.item.setPixmap(pixmap)
        self.scene().setSceneRect(QRectF(pixmap.rect()))
        self.fit()

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


class DocumentView(QWidget):
    pages_changed = Signal(int)
    page_changed = Signal(int)

    def __init__(self, paste_dir: Path | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("document")
        self.setAcceptDrops(True)
        self.paste_dir = paste_dir
        self.pages: list[str] = []
        self.index = -1

        self.view = PageView()
        self.empty = QLabel("Drop images here\n\nor open (Ctrl+O) \u00b7 paste (Ctrl+V)", objectName="emptyState")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.stack = QStackedLayout()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self.view)

        self.title = QLabel("Document", objectName="paneTitle")
        self.page_label = QLabel(objectName="muted")
        self.zoom_label = QLabel(objectName="muted")
        self.view.zoom_changed.connect(lambda z: self.zoom_label.setText(f"{z * 100:.0f}%"))
        bar = QHBoxLayout()
        bar.setContentsMargins(12, 8, 8, 6)
        bar.addWidget(self.title)
        bar.addStretch(1)
        self.prev_button = self._tool("\u2039", "Previous page", self.previous_page)
        self.next_button = self._tool("\u203a", "Next page", self.next_page)
        for w in (self.prev_button, self.page_label, self.next_button):
            bar.addWidget(w)
        bar.addSpacing(8)
        bar.addWidget(self._tool("\u2212", "Zoom out", lambda: self.view.zoom_by(1 / 1.25)))
        bar.addWidget(self.zoom_label)
        bar.addWidget(self._tool("+", "Zoom in", lambda: self.view.zoom_by(1.25)))
        bar.addWidget(self._tool("Fit", "Fit the page", self.view.fit))
        bar.addWidget(self._tool("1:1", "Actual size", lambda: self.view.set_zoom(1.0)))
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
    def add_images(self, paths: list[str]) -> int:
        """Adds the readable images and shows the first of them; returns how many were added."""
        added = [str(Path(p)) for p in paths if not QImageReader(str(p)).read().isNull()]
        if added:
            self.pages.extend(added)
            self.pages_changed.emit(len(self.pages))
            self.show_page(len(self.pages) - len(added))
        return len(added)

    def show_page(self, index: int) -> None:
        if not 0 <= index < len(self.pages):
            return
        self.index = index
        self.view.set_pixmap(upright_pixmap(self.pages[index]))
        self.stack.setCurrentWidget(self.view)
        self._update_bar()
        self.page_changed.emit(index)

    def next_page(self) -> None:
        self.show_page(self.index + 1)

    def previous_page(self) -> None:
        self.show_page(self.index - 1)

    def current_image(self) -> str | None:
        return self.pages[self.index] if 0 <= self.index < len(self.pages) else None

    def clear(self) -> None:
        self.pages, self.index = [], -1
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
        self.title.setText(Path(self.current_image()).name if self.current_image() else "Document")

    # --- drop, open, paste ----------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:
        if image_paths_from_mime(event.mimeData()) or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dragMoveEvent(self, event) -> None:
        self.dragEnterEvent(event)

    def dropEvent(self, event) -> None:
        if self.accept_mime(event.mimeData()):
            event.acceptProposedAction()

    def accept_mime(self, mime) -> bool:
        paths = image_paths_from_mime(mime)
        if paths:
            return self.add_images(paths) > 0
        if mime.hasImage():
            return self.add_qimage(QImage(mime.imageData()))
        return False

    def open_dialog(self) -> None:
        patterns = " ".join(f"*{s}" for s in sorted(IMAGE_SUFFIXES))
        paths, _ = QFileDialog.getOpenFileNames(self, "Open images", "", f"Images ({patterns})")
        self.add_images(paths)

    def paste(self, clipboard) -> bool:
        """An image on the clipboard (or copied image files) becomes a page."""
        mime = clipboard.mimeData()
        return mime is not None and self.accept_mime(mime)

    def add_qimage(self, image: QImage) -> bool:
        """Engines read files, so a pasted image is saved as a PNG first."""
        if image.isNull() or self.paste_dir is None:
            return False
        self.paste_dir.mkdir(parents=True, exist_ok=True)
        path = self.paste_dir / f"pasted-{time.strftime('%Y%m%d-%H%M%S')}-{len(self.pages)}.png"
        return image.save(str(path), "PNG") and self.add_images([str(path)]) > 0
