"""The tiny llama and Gemma 3 targets (real HF layout) and drafters trained on them."""

import pytest

from tests.engines.mlx_chat import checkpoints
from tests.engines.chat import load_chat

pytest.importorskip("mlx.core")

WINDOW = 8  # the tiny Gemma 3's sliding window: generations run far past it


@pytest.fixture(scope="session")
def targets(tmp_path_factory):
    """name -> (engine, target dir, drafter dir)."""
    from tests.engines.training.trained import trained_drafter

    d = tmp_path_factory.mktemp("training_targets")
    dirs = {"llama": checkpoints.make_tiny_llama(d / "llama"),
            "gemma3": checkpoints.make_tiny_gemma3(d / "gemma3", sliding_window=WINDOW)}
    out = {}
    for name, target in dirs.items():
        engine = load_chat(str(target))
        out[name] = (engine, target, trained_drafter(engine, target, checkpoints.WORDS))
    return out
