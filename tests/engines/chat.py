"""A chat engine as the product loads it (engines.factory): a lone request runs through the
batch's loop as a batch of one."""

from __future__ import annotations

from engines.factory import load_engine


def load_chat(path, **options):
    return load_engine("chat", str(path), **options)
