"""The one place that picks an engine for a Request's kind (or a server URL)."""

from __future__ import annotations

from engines.types import Engine, EngineError


def load_engine(kind: str, model_path: str, **options) -> Engine:
    """Import lazily: the GUI starts without MLX or torch loaded. A server URL
    ("http://host:port#model-id") is driven as a remote engine (engines.remote)."""
    if model_path.startswith(("http://", "https://")):
        from engines.remote.engine import RemoteEngine

        return RemoteEngine.load(model_path, **options)
    if kind == "chat":
        from engines.batch.cache import UnbatchableModel
        from engines.batch.engine import batch_of_one
        from engines.mlx_chat.engine import ChatEngine

        engine = ChatEngine.load(model_path, **options)
        try:
            engine.loop = batch_of_one(engine)  # a lone request is a batch of one
        except UnbatchableModel as e:  # it decodes plainly (ChatEngine.generate_plainly), and says why
            engine.plain_only = str(e)
        return engine
    if kind == "ocr":
        from engines.glm_ocr.engine import OcrEngine

        return OcrEngine.load(model_path, **options)
    raise EngineError(f"unknown engine kind: {kind!r} (expected 'chat' or 'ocr')")
