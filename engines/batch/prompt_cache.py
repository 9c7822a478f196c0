"""Prompts read before, kept: a request whose prompt starts like an earlier one's skips the
part already read (the next turn of a chat, the same system prompt, a retried request).

What is kept: after a sequence has read its prompt (all but its last token, in chunks), a copy
of its one-row cache, keyed by those tokens; least recently used first out, within a byte
budget. What is reused, and why only that: a prompt read in other chunks gives other floating-
point sums (the Lossless contract compares a batch row to its lone run, which reads its prompt
in chunks of `chunk` from position 0). So a new prompt takes from a kept one either all of it
(the same tokens exactly) or the longest common prefix rounded down to whole chunks: those
chunks were read in the very forwards a lone run makes. A kept cache longer than what is taken
is cut back (its slot table forgets the rest; engines/batch/cache.py).

mlx_lm.server keeps a prompt cache too (LRUPromptCache), also in its batch.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from engines.batch.cache import BatchCache


@dataclass
class PromptCache:
    chunk: int  # the prefill chunk: reuse is in whole chunks (or the whole prompt)
    max_bytes: int = 512 * 2**20
    entries: OrderedDict = field(default_factory=OrderedDict)  # tuple(tokens) -> BatchCache, oldest first
    asked_tokens: int = 0  # prompt tokens asked for, and tokens found
    hit_tokens: int = 0

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.entries.values())

    def fetch(self, tokens: list[int], model: Any) -> tuple[BatchCache | None, int]:
        """A cache holding the longest reusable prefix of `tokens` (a copy: the caller writes
        it), and that prefix's length; (None, 0) when nothing is reusable."""
        self.asked_tokens += len(tokens)
        best, best_len = None, 0
        for key in self.entries:
            usable = self._usable(key, tokens)
            if usable > best_len:
                best, best_len = key, usable
        if best is None:
            return None, 0
        self.entries.move_to_end(best)
        cache = self.entries[best].clone(model)
        if best_len < len(best):
            cache.rollback([len(best) - best_len])
            for table in cache.tables:  # the forgotten slots go: the layout a lone read leaves
                table.compact()
        self.hit_tokens += best_len
        return cache, best_len

    def _usable(self, key: tuple, tokens: list[int]) -> int:
        if len(key) == len(tokens) and list(key) == tokens:
            return len(tokens)
        common = 0
        for a, b in zip(key, tokens):
            if a != b:
                break
            common += 1
        return common // self.chunk * self.chunk

    def insert(self, tokens: list[int], cache: BatchCache, model: Any) -> None:
        """Keep a copy of a one-row cache that has read exactly `tokens`."""
        key = tuple(tokens)
        if not key or key in self.entries:
            return
        self.entries[key] = cache.clone(model)
        while self.entries and self.nbytes > self.max_bytes:
            self.entries.popitem(last=False)
