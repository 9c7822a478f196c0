"""The window at any size: at 735x800 (half a laptop screen), 1024x700, 1280x800 and 1920x1080,
in chat and in OCR mode, after a run has filled the figures: no visible widget overlaps a
visible sibling, every widget lies inside its parent, and every label's text fits (or is
elided, with the whole text in its tooltip). The window's minimum is what its content needs.

Offscreen, with the app's own style sheet and fonts (app.gui.startup.apply_style)."""

import pytest
from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QLabel, QSplitterHandle, QVBoxLayout, QWidget

from app.gui.main_window import TELEMETRY_MIN_HEIGHT
from app.gui.views.elided_label import ElidedLabel
from app.gui.startup import apply_style

RUN_TIMEOUT_MS = 240_000  # the OCR run on torch, on a busy machine

SIZES = [(735, 800), (1024, 700), (1280, 800), (1920, 1080)]


@pytest.fixture
def styled(qapp):
    apply_style(qapp)
    yield
    qapp.setStyleSheet("")


def visible_children(widget: QWidget) -> list[QWidget]:
    return [c for c in widget.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly)
            if c.isVisible() and not c.isWindow()]


def layout_problems(widget: QWidget, path: str = "") -> list[str]:
    """Overlapping siblings, children outside their parent, labels cut short, for the whole tree.
    Inside a scroll area's viewport the content may be larger than the viewport (that is what
    scrolling is); and pyqtgraph's own children are its business."""
    problems = []
    here = f"{path}/{type(widget).__name__}" + (f"#{widget.objectName()}" if widget.objectName() else "")
    scrolled = isinstance(widget.parentWidget(), QAbstractScrollArea) or widget.objectName() == "qt_scrollarea_viewport"
    children = visible_children(widget)
    inside = QRect(0, 0, widget.width(), widget.height())
    for i, child in enumerate(children):
        name = f"{here}/{type(child).__name__}" + (f"#{child.objectName()}" if child.objectName() else "")
        if not scrolled and not inside.contains(child.geometry()):
            problems.append(f"{name} {child.geometry()} lies outside its parent {inside}")
        for other in children[i + 1:]:
            if child.geometry().intersects(other.geometry()) and not overlap_is_by_design(child, other):
                problems.append(f"{name} {child.geometry()} overlaps {type(other).__name__}"
                                f"#{other.objectName()} {other.geometry()}")
    if isinstance(widget, QLabel) and widget.text() and not widget.wordWrap():
        problems += label_problems(widget, here)
    if type(widget).__module__.startswith("pyqtgraph"):
        return problems
    for child in children:
        problems += layout_problems(child, here)
    return problems


def overlap_is_by_design(a: QWidget, b: QWidget) -> bool:
    """A scroll area's own scroll bars and corner sit over its frame, and a splitter's handle
    reaches a few pixels into its neighbours to be easier to grab, as Qt lays them out."""
    if isinstance(a, QSplitterHandle) or isinstance(b, QSplitterHandle):
        return True
    parent = a.parentWidget()
    return isinstance(parent, QAbstractScrollArea) or parent.objectName() == "qt_scrollarea_hcontainer"


def label_problems(label: QLabel, where: str) -> list[str]:
    text = label.text()
    if "<" in text:  # rich text (the plots' titles are pyqtgraph's); its width is the document's
        return []
    if isinstance(label, ElidedLabel):  # paints its text elided, the whole text in its tooltip
        return [] if not label.is_elided() or label.toolTip() else [f"{where}: {text!r} elided, no tooltip"]
    needed = max(label.fontMetrics().horizontalAdvance(line) for line in text.split("\n"))
    margins = label.contentsMargins()
    room = label.contentsRect().width() - margins.left() - margins.right() - 2 * label.margin()
    if needed <= label.contentsRect().width():
        return []
    if "\u2026" in text and label.toolTip():
        return []  # elided on purpose, the whole text in its tooltip
    return [f"{where}: {text!r} needs {needed} px, has {room}"]


def run_once(qtbot, window) -> None:
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS):
        assert window.run()


def settled_at(window, width: int, height: int) -> None:
    window.resize(width, height)
    for _ in range(3):  # the resize, the reflow it causes, the layout pass that reflow posts
        QApplication.processEvents()


def check_sizes(window, mode: str) -> None:
    for width, height in SIZES:
        settled_at(window, width, height)
        assert (window.width(), window.height()) == (width, height)
        problems = layout_problems(window)
        assert problems == [], f"{mode} at {width}x{height}:\n" + "\n".join(problems)


def test_chat_at_any_size(qtbot, make_window, styled):
    window = make_window(max_tokens=24)
    window.chat.prompt.setPlainText("Count: one two three four five six seven")
    run_once(qtbot, window)
    assert window.telemetry.figures()["rounds"] not in ("", "\u2013")
    check_sizes(window, "chat")


def test_ocr_at_any_size(qtbot, styled, tiny_ocr):
    from app.gui.main_window import MainWindow
    from app.settings import AppSettings

    model, images = tiny_ocr
    window = MainWindow(AppSettings(engine="ocr", ocr_model=str(model), ocr_method="mtp", steps=2, preset=None,
                                    max_tokens=8), persist=False)
    qtbot.addWidget(window)
    window.show()
    window.ensure_telemetry()
    assert window.open_documents([str(p) for p in images]) == 2
    run_once(qtbot, window)
    assert len(window.ocr.results) == 2
    check_sizes(window, "ocr")
    window.shutdown()


@pytest.mark.parametrize("mode", ["chat", "ocr"])
def test_a_window_opened_at_each_size(qtbot, styled, tiny_ocr, mode):
    """As `--window-size` opens it: sized before it is shown."""
    from app.gui.main_window import MainWindow
    from app.settings import AppSettings

    model, images = tiny_ocr
    for width, height in SIZES:
        window = MainWindow(AppSettings(engine=mode, ocr_model=str(model)), persist=False, autosave=False)
        qtbot.addWidget(window)
        window.resize(width, height)
        window.open_documents([str(p) for p in images]) if mode == "ocr" else None
        window.show()
        window.ensure_telemetry()
        for _ in range(3):
            QApplication.processEvents()
        problems = layout_problems(window)
        assert problems == [], f"{mode} opened at {width}x{height}:\n" + "\n".join(problems)
        window.shutdown()


def test_the_minimum_is_what_the_content_needs(qtbot, make_window, styled):
    window = make_window()
    for mode in ("chat", "ocr"):
        window.controls.set_engine(mode)
        settled_at(window, window.minimumWidth(), window.minimumHeight())
        problems = layout_problems(window)
        assert problems == [], f"{mode} at its minimum {window.minimumSize()}:\n" + "\n".join(problems)
    assert window.minimumWidth() <= 735 and window.minimumHeight() <= 700
    # the strip's height is reserved before pyqtgraph is imported: the plots fit in it
    assert window.telemetry.minimumSizeHint().height() <= TELEMETRY_MIN_HEIGHT


def test_the_speculation_strip_reflows(qtbot, styled):
    """Beside the plots when both fit; above them (6, then 3 columns) when narrower and tall
    enough; beside and scrolling sideways when too low: in each, nothing overlaps or is cut."""
    from app.gui.views.telemetry import SPACING, TelemetryView

    holder = QWidget()  # as in the window: a child, whose minimum is its minimumSizeHint
    QVBoxLayout(holder).setContentsMargins(0, 0, 0, 0)
    view = TelemetryView()
    holder.layout().addWidget(view)
    qtbot.addWidget(holder)
    holder.show()
    for key in view.cards:
        view.cards[key].setText("888.8 s")  # about the widest a card shows
    beside = view.cards_width(2) + SPACING + view.plots_width() + view.margins
    six, three = view.cards_width(6) + view.margins, view.cards_width(3) + view.margins
    tall = view.strip_height(3) + view.chrome_height()
    low = view.minimumSizeHint().height()
    cases = [((beside, low), 2), ((beside - 1, tall), 6 if six < beside else 3), ((three, tall), 3),
             ((three, low), 2), ((view.minimumSizeHint().width(), low), 2)]
    for (width, height), columns in cases:
        settled_at(holder, width, height)
        assert (view.width(), view.height()) == (width, height)
        assert view.columns == columns, (width, height)
        problems = layout_problems(view)
        assert problems == [], f"{width}x{height}:\n" + "\n".join(problems)
