"""The window (the only room that imports Qt): startup (QApplication, arguments, style),
main_window (composes the panes and drives one run), views/ (the widgets), worker and
model_jobs (the QThreads that run engines, downloads and conversions). See docs/architecture.md.
"""
