"""Emitted text, with stop strings held back as streaming servers hold them.

A stop string can begin in one round and end in a later one. Text that could still become the
beginning of a stop string is therefore not released until the tokens after it decide: either
they complete the stop string (the text ends before it) or they do not (the text is released).
So no emitted text ever contains any part of a stop string, and how tokens are grouped into
rounds -- one per round in plain decoding, several with speculation -- changes when text comes
out, never what comes out.

Backend-agnostic: the engine feeds each token's decoded piece (from its streaming
detokenizer) with a flag saying whether the token came from an accepted draft, and reads back
what may be shown, with the character ranges that came from drafts (the transcript tints them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

Span = tuple[int, int]  # [start, end) character offsets into a Round's text


def earliest_stop(text: str, stop: Sequence[str]) -> int | None:
    """Where the first stop string in `text` begins, or None."""
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def held_back(text: str, stop: Sequence[str]) -> int:
    """How many characters at the end of `text` could still become the beginning of a stop
    string (the longest suffix that is a proper prefix of one)."""
    longest = max((len(s) for s in stop), default=0)
    for i in range(max(0, len(text) - longest + 1), len(text)):
        if any(s.startswith(text[i:]) for s in stop):
            return len(text) - i
    return 0


def drafted_spans(flags: Sequence[bool]) -> list[Span]:
    """Runs of True in per-character flags, as [start, end) spans."""
    spans: list[Span] = []
    for i, drafted in enumerate(flags):
        if not drafted:
            continue
        if spans and spans[-1][1] == i:
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))
    return spans


@dataclass
class TextStream:
    """Decoded text not yet shown, and what of it may be shown now."""

    stop: Sequence[str]
    pending: str = ""
    drafted: list[bool] = field(default_factory=list)  # per character of `pending`

    def __post_init__(self):
        self.stop = [s for s in self.stop if s]  # an empty stop string would stop everything

    def add(self, piece: str, from_draft: bool) -> bool:
        """Append one token's text. True if it completes a stop string; the pending text then
        ends where the stop string begins (nothing of it is ever shown)."""
        self.pending += piece
        self.drafted += [from_draft] * len(piece)
        start = earliest_stop(self.pending, self.stop)
        if start is None:
            return False
        self.pending, self.drafted = self.pending[:start], self.drafted[:start]
        return True

    def release(self, final: bool) -> tuple[str, list[Span]]:
        """The text that may be shown now -- all of it when the run has ended -- and the spans
        of it that came from accepted drafts."""
        n = len(self.pending) - (0 if final else held_back(self.pending, self.stop))
        text, flags = self.pending[:n], self.drafted[:n]
        self.pending, self.drafted = self.pending[n:], self.drafted[n:]
        return text, drafted_spans(flags)
