"""Specscope: on-device OCR and chat with speculative decoding, shown live."""

APP_NAME = "Specscope"
APP_ID = "app.specscope.Specscope"
__version__ = "0.1.0"
