"""N-gram prompt lookup: propose the tokens that followed the most recent earlier occurrence
of the context's longest suffix (n_max down to n_min) in prompt + generated text. When that
occurrence is fewer than k tokens back (a loop of period 1..k-1: "| --- | --- |", a repeated
digit), the continuation would stop at the context's end; it repeats with the match's period
instead, so a short loop is drafted k tokens at a time rather than one.

An index maps every n-gram to the position right after its latest occurrence, kept up to date
as tokens are appended, so a proposal costs O(n_max) dict look-ups even at 32k tokens of
context. Only accepted tokens are appended: drafts never enter the index, so nothing needs
rolling back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engines.speculative.proposer import EMPTY, Context, Draft


class NGramIndex:
    def __init__(self, n_min: int = 1, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        # index[n][gram] = position of the token that followed gram's latest occurrence
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}

    def reset(self, tokens: list[int]) -> None:
        self.tokens = []
        self.index = {n: {} for n in self.index}
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            pos = len(self.tokens)  # t lands here: every n-gram ending at pos-1 is followed by it
            for n in self.index:
                if pos >= n:
                    self.index[n][tuple(self.tokens[pos - n : pos])] = pos
            self.tokens.append(int(t))

    def propose(self, k: int, after: list[int] | tuple[int, ...] = ()) -> list[int]:
        """Up to k draft tokens; [] when no suffix of length n_min..n_max recurs. `after`:
        tokens taken as appended to the context for this lookup only (the drafts of a chain
        that the n-gram tokens are to continue); they are not indexed, so nothing needs
        rolling back."""
        if k <= 0:
            return []
        end = len(self.tokens) + len(after)
        tail = (self.tokens[-self.n_max:] + list(after))[-self.n_max:]
        for n in range(self.n_max, self.n_min - 1, -1):
            if end < n:
                continue
            follow = self.index[n].get(tuple(tail[len(tail) - n:]))
            if follow is not None:
                drafts = self.tokens[follow : follow + k]
                if len(drafts) < k:  # the occurrence is end - follow tokens back: the text has
                    # been repeating with that period, so the lookup reads on as if it goes on
                    drafts += list(after)
                    for j in range(len(drafts), k):
                        drafts.append(drafts[j - (end - follow)])
                return drafts[:k]
        return []


@dataclass
class NGramProposer:
    """Prompt lookup as a proposer (engines/speculative/proposer.py): drafts are a point mass
    (q = None), and only accepted tokens enter the index, so nothing rolls back."""

    n_min: int = 1
    n_max: int = 4
    name: str = "ngram"
    needs_hidden: bool = False
    index: NGramIndex = field(init=False)
    auto: Any = None  # --steps auto's AutoSteps: told each round's whole continuation (tuning.py)

    def __post_init__(self):
        self.index = NGramIndex(self.n_min, self.n_max)

    def start(self, ctx: Context) -> None:
        self.index.reset(ctx.tokens)
        if self.auto is not None:  # the first round's position: auto replays every fixed k from here
            self.auto.passed(self.index.propose(self.auto.max_steps), len(ctx.tokens))

    def propose(self, ctx: Context, k: int) -> Draft:
        if self.auto is not None:  # the k drafts are the first k of the continuation
            found = self.index.propose(self.auto.max_steps)
            self.auto.continuation(found, len(ctx.tokens))
            drafts = found[:k]
        else:
            drafts = self.index.propose(k)
        return Draft(drafts) if drafts else EMPTY

    def commit(self, ctx: Context) -> None:
        new = ctx.tokens[len(self.index.tokens):]
        if self.auto is None:
            self.index.extend(new)
            return
        for token in new:  # auto replays every fixed k: it needs the lookup at every position
            self.index.extend([token])
            self.auto.passed(self.index.propose(self.auto.max_steps), len(self.index.tokens))
        self.auto.score(ctx.tokens)
