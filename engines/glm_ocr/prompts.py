"""GLM-OCR's chat format, task prompts and tokenizer (the `tokenizers` library reading the
checkpoint's tokenizer.json: no transformers needed at run time).

    [gMASK]<sop><|user|>\n<|begin_of_image|>{image tokens}<|end_of_image|>{task prompt}<|assistant|>\n
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.types import EngineError
from engines.glm_ocr.positions import Positions

# The task prompts GLM-OCR was trained with.
TASK_PROMPTS = {
    "text": "Text Recognition:",
    "table": "Table Recognition:",
    "formula": "Formula Recognition:",
}

PROMPT_PREFIX = "[gMASK]<sop><|user|>\n<|begin_of_image|>"
PROMPT_SUFFIX = "<|end_of_image|>{task}<|assistant|>\n"


class GlmTokenizer:
    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise EngineError(f"{model_dir} has no tokenizer.json")
        self.tokenizer = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def stream(self) -> "DecodeText":
        return DecodeText(self.tokenizer)


def task_prompt(task: str) -> str:
    if task not in TASK_PROMPTS:
        raise EngineError(f"unknown OCR task {task!r} (expected one of {', '.join(TASK_PROMPTS)})")
    return TASK_PROMPTS[task]


def prompt_ids(tokenizer: GlmTokenizer, task: str, num_image_tokens: int, image_token_id: int) -> list[int]:
    """The token ids of the OCR prompt, the image placeholder repeated once per image token."""
    suffix = PROMPT_SUFFIX.format(task=task_prompt(task))
    return tokenizer.encode(PROMPT_PREFIX) + [image_token_id] * num_image_tokens + tokenizer.encode(suffix)


class DecodeText:
    """Text deltas of a growing token list, from the tokenizers library's streaming decoder
    (DecodeStream): each token is decoded once, and a multi-byte character split across
    tokens comes out whole with the token that completes it (the Output's TokenText)."""

    def __init__(self, tokenizer):
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.stream = DecodeStream(skip_special_tokens=True)
        self.ids: list[int] = []
        self.shown = 0  # characters returned so far

    def add(self, token: int) -> str:
        """The text this token completes ("" while a character is still incomplete)."""
        self.ids.append(int(token))
        piece = self.stream.step(self.tokenizer, int(token)) or ""
        self.shown += len(piece)
        return piece

    def finish(self) -> str:
        """At the end: what an incomplete last character decodes to (U+FFFD), as a one-shot
        decode of the whole output would show it."""
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        rest, self.shown = full[self.shown:], len(full)
        return rest


@dataclass
class Prompt:
    ids: list[int]
    embeds: np.ndarray  # (P, hidden): token embeddings, image features in place of image tokens
    positions: Positions
    note: str | None  # set when the image was read at a lower resolution to fit the context
