"""A tiny chat checkpoint with a short context (256 tokens), so prompts past it are cheap to make."""

import json

import pytest

CONTEXT = 256


@pytest.fixture(scope="session")
def short_context_llama(tmp_path_factory):
    pytest.importorskip("mlx.core")
    from tests.engines.mlx_chat.checkpoints import make_tiny_llama

    path = make_tiny_llama(tmp_path_factory.mktemp("short-context") / "llama")
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = CONTEXT
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


@pytest.fixture(scope="session")
def short_engine(short_context_llama):
    from engines.factory import load_engine

    return load_engine("chat", str(short_context_llama))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """The tiny Llama with its 4096-token context: long runs to interrupt."""
    pytest.importorskip("mlx.core")
    from tests.engines.mlx_chat.checkpoints import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "llama")


@pytest.fixture(scope="session")
def tiny_llama_engine(tiny_llama):
    from engines.factory import load_engine

    return load_engine("chat", str(tiny_llama))
