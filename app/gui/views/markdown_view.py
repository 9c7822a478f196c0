"""The document read by region, rendered: its Markdown (headings, formulas as $$ blocks, tables as
GLM-OCR writes them, figures as image references) as QTextDocument renders Markdown, updated
as each region is read. Copy puts the Markdown source on the clipboard."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication, QHBoxLayout, QLabel, QTextBrowser, QToolButton, QVBoxLayout, QWidget


class MarkdownView(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("markdownView")
        self.markdown = ""  # the source shown
        self.title = QLabel("Markdown", objectName="paneTitle")
        self.status = QLabel(objectName="muted")
        self.copy_button = QToolButton(text="Copy", autoRaise=True, toolTip="Copy the document as Markdown")
        self.copy_button.clicked.connect(lambda: QApplication.clipboard().setText(self.markdown))
        self.browser = QTextBrowser(openExternalLinks=True)
        self.browser.setFrameShape(QTextBrowser.Shape.NoFrame)
        self.browser.document().setDocumentMargin(12)
        bar = QHBoxLayout()
        bar.setContentsMargins(12, 8, 8, 6)
        bar.addWidget(self.title)
        bar.addSpacing(8)
        bar.addWidget(self.status, 1)
        bar.addWidget(self.copy_button)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(0)
        col.addLayout(bar)
        col.addWidget(self.browser, 1)

    def show_markdown(self, markdown: str, status: str = "") -> None:
        self.markdown = markdown
        self.status.setText(status)
        bar = self.browser.verticalScrollBar()
        at = bar.value()
        self.browser.setMarkdown(markdown)
        bar.setValue(at)  # a document growing under the reader keeps their place

    def clear(self) -> None:
        self.show_markdown("")
