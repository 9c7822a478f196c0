"""The command line (no Qt): one module per command (chat, ocr, bench, convert, models, serve;
connect is `--server`), the shared arguments, errors and engine loading at the bottom
(common, io), the dispatcher at the top (main). See docs/architecture.md.
"""
