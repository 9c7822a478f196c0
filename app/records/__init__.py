"""What runs read and leave behind, with no Qt, for the CLI and the window alike: documents
(files into pages, pages' text out as Markdown / text / JSON), sessions (autosave, the saved
list, export), bursts (a round's text split into accepted drafts and the target's own tokens),
compare (two sessions side by side) and round_series (a run's rounds as NumPy columns, which
the telemetry strip plots). See docs/architecture.md.
"""
