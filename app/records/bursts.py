"""A burst: one Round as the transcript shows it, i.e. its text split into the parts that came
from accepted drafts and the parts the target produced itself. Qt-free.

The engine says which characters came from drafts (Round.draft_spans: it detokenizes each
token once, as it streams); nothing here decodes tokens again."""

from __future__ import annotations

from dataclasses import dataclass

from engines.speculative.rounds import Round


@dataclass
class Burst:
    round: Round
    spans: list[tuple[int, int]]  # [start, end) ranges of round.text that came from accepted drafts

    @property
    def draft_chars(self) -> int:
        return sum(end - start for start, end in self.spans)

    def segments(self) -> list[tuple[str, bool]]:
        """The text in order, as (piece, came from an accepted draft) pairs."""
        text, out, at = self.round.text, [], 0
        for start, end in self.spans:
            if start > at:
                out.append((text[at:start], False))
            out.append((text[start:end], True))
            at = end
        if at < len(text):
            out.append((text[at:], False))
        return out


def leading_draft_tokens(rnd: Round) -> int:
    """Accepted drafts come first in a round's tokens; the target's own token (if any) last."""
    n = 0
    while n < len(rnd.from_draft) and rnd.from_draft[n]:
        n += 1
    return n


def proportional_draft_chars(rnd: Round) -> int:
    """The split when the round does not say (an engine that does not report draft_spans, or a
    session file written before they existed): the drafted share of the tokens."""
    n = leading_draft_tokens(rnd)
    if not rnd.tokens or n == 0:
        return 0
    return round(len(rnd.text) * n / len(rnd.tokens))


def burst_of(rnd: Round, draft_chars: int | None = None) -> Burst:
    """The burst of a round: its own draft_spans, else a saved leading count, else a guess."""
    if rnd.draft_spans is not None:
        return Burst(rnd, [(int(a), int(b)) for a, b in rnd.draft_spans])
    chars = draft_chars if isinstance(draft_chars, int) else proportional_draft_chars(rnd)
    return Burst(rnd, [(0, chars)] if chars else [])
