"""What a sequence has emitted, and the Round of each of its target forwards: one for the chat
loop, the batch's rows and GLM-OCR alike.

A round's verdict (the accepted drafts plus one target token) is clipped at EOS, max_tokens and
a repetition loop (`clip`), then its text is streamed (`round`): token by token through the
model's own streaming decoder (`TokenText`), held back while it could still become a stop
string, and marked where accepted drafts wrote it. Round.accepted is the verifier's count,
before clipping (rounds.py); from_draft marks the emitted tokens that came from accepted drafts.
"""

from __future__ import annotations

import time
from typing import Protocol

from engines.speculative.repetition import RepetitionDetector, clip_at_repetition
from engines.speculative.rounds import Round
from engines.speculative.stops import TextStream
from engines.speculative.verify import Verdict, accept_flags, clip_emitted


class TokenText(Protocol):
    """A model's streaming decoder: mlx-lm's detokenizer (chat), the tokenizers library's
    DecodeStream (GLM-OCR)."""

    def add(self, token: int) -> str:
        """The text this token completes ("" while a character is still incomplete)."""

    def finish(self) -> str:
        """At the end: what is left (an incomplete last character, as a one-shot decode shows it)."""


class Output:
    def __init__(self, token_text: TokenText, eos: set[int], max_tokens: int, stop: list[str] | None = None,
                 repetition: RepetitionDetector | None = None):
        self.token_text = token_text
        self.eos = eos
        self.max_tokens = max_tokens
        self.text = TextStream(list(stop or []))
        self.repetition = repetition
        self.emitted = 0
        self.index = 0  # the next Round's
        self.started = time.perf_counter()
        self.note: str | None = None  # said once, by the next Round

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.emitted

    def say(self, note: str) -> None:
        """A note for the next Round (speculation stopped, a cap, a fallback)."""
        self.note = f"{self.note}; {note}" if self.note else note

    def clip(self, verdict: Verdict) -> tuple[list[int], str | None]:
        """The verdict's tokens cut at EOS, max_tokens and a repetition loop (fed token by token
        to the detector, so plain and speculative runs stop at the same token). The tokens kept
        are emitted from here on: they enter the context, and the next round's k sees them."""
        tokens, finish = clip_emitted(verdict.tokens, self.eos, self.remaining)
        tokens, loop = clip_at_repetition(self.repetition, tokens)
        if loop is not None:
            finish = "repetition"
            self.say(loop)
        self.emitted += len(tokens)
        return tokens, finish

    def round(self, verdict: Verdict, tokens: list[int], finish: str | None, *, proposed: int, draft_s: float,
              verify_s: float, wall_s: float, steps: int = 0, prefill: bool = False, **details) -> Round:
        """Stream the clipped tokens' text and build the Round. A stop string completed by a token
        ends the round there (the tokens after it are dropped). `details`: the Round's other
        fields (draft_source, expected_tok_s, launched_early, ...); a `note` joins this output's."""
        from_draft = [i < verdict.accepted for i in range(len(tokens))]
        for i, token in enumerate(tokens):
            if token in self.eos:
                continue
            if self.text.add(self.token_text.add(token), from_draft[i]):
                tokens, finish = tokens[: i + 1], "stop"
                break
        else:
            if finish and self.text.add(self.token_text.finish(), False):
                finish = "stop"
        text, spans = self.text.release(final=finish is not None)
        note = "; ".join(n for n in (details.pop("note", None), self.note) if n) or None
        rnd = Round(index=self.index, proposed=proposed, accepted=verdict.accepted, tokens=tokens,
                    from_draft=from_draft[: len(tokens)], text=text, draft_spans=spans,
                    accept_flags=accept_flags(proposed, verdict.accepted), draft_s=draft_s, verify_s=verify_s,
                    wall_s=wall_s, t_s=time.perf_counter() - self.started, prefill=prefill, steps=steps,
                    finish=finish, note=note, **details)
        self.note = None
        self.index += 1
        return rnd

    def stopped(self, finish: str, note: str | None = None, prefill: bool = False) -> Round:
        """A round that ran no forward: the run was cancelled, or the context is full.
        `prefill`: stopped before its first token (the run's first Round is its prefill's)."""
        if note:
            self.say(note)
        return self.round(Verdict(0, []), [], finish, proposed=0, draft_s=0.0, verify_s=0.0, wall_s=0.0,
                          prefill=prefill)
