"""How long a prompt the chat target can take, and the check made before any forward runs.

A prompt past the context makes the target run for minutes (prefill is quadratic in it) and
then produce garbage, so the length is checked on the token ids, before prefill."""

from __future__ import annotations

from engines.types import EngineError


def context_length(model) -> int | None:
    """The target's context in tokens: `max_position_embeddings` of its mlx-lm ModelArgs (read
    from config.json, or from a GGUF's `context_length`), or of its text config for multimodal
    wrappers (Gemma 4). None when the model does not say."""
    args = getattr(model, "args", None)
    for source in (args, getattr(args, "text_config", None)):
        value = source.get("max_position_embeddings") if isinstance(source, dict) else getattr(source, "max_position_embeddings", None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_fits(prompt_tokens: int, max_tokens: int, context: int | None) -> None:
    """One line when the prompt plus the answer it may grow to would overrun the context."""
    if context is None or prompt_tokens + max_tokens <= context:
        return
    if prompt_tokens >= context:
        raise EngineError(f"the prompt is {prompt_tokens} tokens, longer than the model's context of "
                          f"{context} tokens: shorten it (or start a new conversation)")
    raise EngineError(f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the "
                      f"model's context of {context} tokens: lower max_tokens to {context - prompt_tokens} "
                      f"or shorten the prompt")
