"""What runs read and leave behind, with no Qt, for the CLI and the window alike: documents
(files into pages, pages' text out as Markdown / text / JSON), sessions (autosave, the saved
list, export), bursts (a round's text split into accepted drafts and the target's own tokens)
and compare (two sessions side by side). See docs/architecture.md.
"""
