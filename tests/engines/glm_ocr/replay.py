"""A drafter for GLM-OCR tests and benchmarks: the target's own greedy output replayed, with
errors injected at a known rate, through the Proposer protocol (engines/speculative/proposer.py)
-- accepted often but not always, as a real drafter is, so losslessness and acceptance counts
can both be checked."""

from __future__ import annotations

import numpy as np

from engines.speculative.proposer import Draft


class ReplayDrafter:
    """Replays `reference` (the target's greedy output after the prompt): each draft wrong with
    probability `error_rate`. Asserts the run is on the reference (a lossless run at T=0)."""

    def __init__(self, reference: list[int], error_rate: float, vocab: int, seed: int = 0):
        self.reference, self.error_rate, self.vocab = reference, error_rate, vocab
        self.rng = np.random.default_rng(seed)

    name = "replay"
    needs_hidden = False

    def start(self, ctx):
        self.prompt = len(ctx.tokens) - 1  # ctx.tokens: the prompt, then the emitted tokens

    def propose(self, ctx, k):
        cursor = len(ctx.tokens) - 1 - self.prompt  # index in `reference` of the newest emitted token
        assert ctx.tokens[-1] == self.reference[cursor]
        drafts = list(self.reference[cursor + 1 : cursor + 1 + k])
        return Draft([(t + 1 + int(self.rng.integers(self.vocab - 1))) % self.vocab
                      if self.rng.random() < self.error_rate else t for t in drafts])

    def commit(self, ctx):
        pass
