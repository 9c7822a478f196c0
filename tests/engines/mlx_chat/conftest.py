"""Tiny checkpoints built once per test session, and engines loaded from them through the
product's own loader (ChatEngine.load -> mlx_lm.load)."""

import pytest

from tests.engines.mlx_chat import checkpoints
from tests.engines.chat import load_chat

pytest.importorskip("mlx.core")

WINDOW = 8  # the tiny Gemma 3's sliding window: generations run far past it


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mlx_chat_ckpts")


@pytest.fixture(scope="session")
def llama_dir(ckpt_dir):
    return str(checkpoints.make_tiny_llama(ckpt_dir / "llama"))


@pytest.fixture(scope="session")
def gemma3_dir(ckpt_dir):
    return str(checkpoints.make_tiny_gemma3(ckpt_dir / "gemma3", sliding_window=WINDOW))


@pytest.fixture(scope="session")
def llama_draft_dir(ckpt_dir, llama_dir):
    return str(checkpoints.perturbed_copy(llama_dir, ckpt_dir / "llama_draft"))


@pytest.fixture(scope="session")
def gemma3_draft_dir(ckpt_dir, gemma3_dir):
    return str(checkpoints.perturbed_copy(gemma3_dir, ckpt_dir / "gemma3_draft"))


@pytest.fixture(scope="session")
def engines(llama_dir, gemma3_dir, llama_draft_dir, gemma3_draft_dir):
    """name -> (engine with its perturbed draft model loaded)."""
    return {
        "llama": load_chat(llama_dir, draft_model=llama_draft_dir),
        "gemma3": load_chat(gemma3_dir, draft_model=gemma3_draft_dir),
    }
