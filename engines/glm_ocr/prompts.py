"""GLM-OCR's chat format, task prompts and tokenizer (the `tokenizers` library reading the
checkpoint's tokenizer.json: no transformers needed at run time).

    [gMASK]<sop><|user|>\n<|begin_of_image|>{image tokens}<|end_of_image|>{task prompt}<|assistant|>\n
"""

from __future__ import annotations

from pathlib import Path

from engines import EngineError

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

    def token_id(self, token: str) -> int:
        tid = self.tokenizer.token_to_id(token)
        if tid is None:
            raise EngineError(f"the tokenizer lacks GLM-OCR's special token {token}")
        return tid


def task_prompt(task: str) -> str:
    if task not in TASK_PROMPTS:
        raise EngineError(f"unknown OCR task {task!r} (expected one of {', '.join(TASK_PROMPTS)})")
    return TASK_PROMPTS[task]


def prompt_ids(tokenizer: GlmTokenizer, task: str, num_image_tokens: int, image_token_id: int) -> list[int]:
    """The token ids of the OCR prompt, the image placeholder repeated once per image token."""
    suffix = PROMPT_SUFFIX.format(task=task_prompt(task))
    return tokenizer.encode(PROMPT_PREFIX) + [image_token_id] * num_image_tokens + tokenizer.encode(suffix)


class IncrementalDecoder:
    """Text deltas of a growing token list. Decodes the whole list each time and holds back a
    trailing replacement character (a multi-byte character split across rounds)."""

    def __init__(self, tokenizer: GlmTokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        if not text.startswith(self.text):  # decoding is not always prefix-stable; emit what is new
            common = 0
            while common < min(len(text), len(self.text)) and text[common] == self.text[common]:
                common += 1
            self.text = text[:common]
        delta = text[len(self.text):]
        self.text = text
        return delta

    def flush(self) -> str:
        """At the end: whatever was held back (an incomplete character decodes as U+FFFD)."""
        text = self.tokenizer.decode(self.ids)
        delta = text[len(self.text):] if text.startswith(self.text) else ""
        self.text = text
        return delta
