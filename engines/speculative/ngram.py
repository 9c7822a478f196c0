"""N-gram prompt lookup: propose the tokens that followed the most recent earlier occurrence
of the context's longest suffix (n_max down to n_min) in prompt + generated text.

An index maps every n-gram to the position right after its latest occurrence, kept up to date
as tokens are appended, so a proposal costs O(n_max) dict look-ups even at 32k tokens of
context. Only accepted tokens are appended: drafts never enter the index, so nothing needs
rolling back.
"""

from __future__ import annotations


class NGramProposer:
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

    def propose(self, k: int) -> list[int]:
        """Up to k draft tokens; [] when no suffix of length n_min..n_max recurs."""
        if k <= 0:
            return []
        end = len(self.tokens)
        for n in range(self.n_max, self.n_min - 1, -1):
            if end < n:
                continue
            follow = self.index[n].get(tuple(self.tokens[end - n :]))
            if follow is not None:
                return self.tokens[follow : follow + k]
        return []
