"""The window (the only room that imports Qt): startup (QApplication, arguments, style),
main_window (composes the panes and drives one run), views/ (the widgets), worker and
model_jobs (the QThreads that drive runs, downloads and conversions), engine_process (the child
process the engines run in; Qt-free, as the child must not load Qt). See docs/architecture.md.
"""
