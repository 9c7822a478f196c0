"""A burst: one Round as the transcript shows it, i.e. its text split into the part that came
from accepted drafts and the part the target produced itself. Qt-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engines.speculative.rounds import Round

CONTEXT_TOKENS = 8  # enough history for a tokenizer to place spaces and merge bytes right


@dataclass
class Burst:
    round: Round
    draft_chars: int  # round.text[:draft_chars] came from accepted drafts, the rest from the target

    @property
    def draft_text(self) -> str:
        return self.round.text[: self.draft_chars]

    @property
    def target_text(self) -> str:
        return self.round.text[self.draft_chars :]


def leading_draft_tokens(rnd: Round) -> int:
    """Accepted drafts come first in a round's tokens; the target's own token (if any) last."""
    n = 0
    while n < len(rnd.from_draft) and rnd.from_draft[n]:
        n += 1
    return n


def proportional_draft_chars(rnd: Round) -> int:
    """The split when no tokenizer is at hand (a session reopened from a file that lacks it)."""
    n = leading_draft_tokens(rnd)
    if not rnd.tokens or n == 0:
        return 0
    return round(len(rnd.text) * n / len(rnd.tokens))


class BurstSplitter:
    """Finds how much of each round's text came from accepted drafts by decoding the drafted
    tokens after a few tokens of context (decoding them alone would drop leading spaces of
    SentencePiece tokenizers and split multi-byte characters)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.history: list[int] = []

    def split(self, rnd: Round) -> Burst:
        n = leading_draft_tokens(rnd)
        if n == 0:
            chars = 0
        elif n == len(rnd.tokens):
            chars = len(rnd.text)
        else:
            chars = self._draft_chars(rnd, n)
        self.history = (self.history + list(rnd.tokens))[-CONTEXT_TOKENS:]
        return Burst(rnd, chars)

    def _draft_chars(self, rnd: Round, n: int) -> int:
        try:
            before = self.decode(self.history)
            after = self.decode(self.history + list(rnd.tokens[:n]))
        except Exception:  # a tokenizer that cannot decode a partial sequence
            return proportional_draft_chars(rnd)
        if not after.startswith(before):
            return proportional_draft_chars(rnd)
        piece = after[len(before) :].rstrip("\ufffd")  # a half-decoded multi-byte character
        if rnd.text.startswith(piece):
            return len(piece)
        return min(len(piece), len(rnd.text)) if piece else proportional_draft_chars(rnd)
