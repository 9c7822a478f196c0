"""A process that only chats goes without torch: transformers imports torch whenever it is
installed (configuration_utils -> modeling_rope_utils), and mlx-lm's tokenizer module imports
transformers, so a chat process paid ~2.5 s and ~250 MB for a library nothing of its calls (MLX
runs the models; transformers only tokenizes). Used by the entry point (app/launch.py) and by the
window's engine child while it runs chat jobs only (app/gui/engine_process.py); it imports
nothing of the product, so both can.
"""

from __future__ import annotations

import sys


def only_chats(argv: list[str]) -> bool:
    """Whether this command line runs chat models and nothing else (no document reading): chat,
    bench chat, tune, drafter, and serve without --ocr-model."""
    if not argv:
        return False  # the window: its engine process reads documents too
    if argv[0] == "serve":
        return not any(arg.startswith("--ocr") for arg in argv)  # (argparse takes "--ocr-m" for it too)
    return argv[0] in ("chat", "tune", "drafter") or argv[:2] == ["bench", "chat"]


def leave_torch_out() -> None:
    """Marks torch as not installed, unless torch or transformers is already loaded. A None in
    sys.modules is Python's "not installed": importlib.util.find_spec, transformers' availability
    check, answers None and `import torch` raises ImportError, so transformers runs as on a
    machine with tokenizers alone."""
    if "torch" not in sys.modules and "transformers" not in sys.modules:
        sys.modules["torch"] = None
