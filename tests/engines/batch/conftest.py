"""The batch tests reuse the chat engine's tiny checkpoints (a llama; a Gemma 3 with an 8-token
sliding window; perturbed copies of each as draft models), the tiny Gemma 4 pair, and MTP
drafters trained on the llama and the Gemma 3 (tests/engines/training), built once per session."""

from tests.engines.mlx_chat.conftest import (  # noqa: F401  (pytest fixtures)
    ckpt_dir, engines, gemma3_dir, gemma3_draft_dir, llama_dir, llama_draft_dir,
)
from tests.engines.mlx_chat.gemma4.conftest import dense_pair  # noqa: E402,F401  (the tiny Gemma 4 pair)
from tests.engines.training.conftest import targets  # noqa: E402,F401  (trained MTP drafters)
