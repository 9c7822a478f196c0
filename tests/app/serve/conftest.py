"""The serve tests' model: a tiny random Llama loaded through the product's loader, once per
session (the one-at-a-time and the batched servers share it)."""

import pytest


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    pytest.importorskip("mlx.core")
    from engines.mlx_chat.engine import ChatEngine
    from tests.engines.mlx_chat.checkpoints import make_tiny_llama

    return ChatEngine.load(str(make_tiny_llama(tmp_path_factory.mktemp("serve") / "llama")))
