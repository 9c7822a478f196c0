"""The serve tests' model: a tiny random Llama loaded through the product's loader, once per
session (the one-at-a-time and the batched servers share it)."""

import pytest
from tests.engines.chat import load_chat


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    pytest.importorskip("mlx.core")
    from tests.engines.mlx_chat.checkpoints import make_tiny_llama

    return load_chat(str(make_tiny_llama(tmp_path_factory.mktemp("serve") / "llama")))
