"""The Round record (one target forward) and the statistics of a session of rounds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "cancelled", "repetition", "error"]


@dataclass
class Round:
    """One target forward and what it emitted.

    The prefill forward is a Round too (prefill=True, proposed=0): it emits the first token,
    and its wall time is the time to first token. `tokens` are the ids emitted this round,
    `from_draft[i]` says whether tokens[i] came from an accepted draft (False for the target's
    own token), and `accept_flags[j]` is the verdict on the j-th drafted position (so
    len(accept_flags) == proposed and sum(accept_flags) == accepted).

    `accepted` is the verifier's verdict: how many drafts the target accepted, counted BEFORE
    the burst is clipped at EOS, a stop string or max_tokens. The acceptance rate, the
    per-position acceptance and the plots measure the drafter against the target, and a run
    ending inside a burst says nothing about the drafter; counted after clipping, the last
    round would read as rejections and the statistics would depend on max_tokens. What was
    emitted is `tokens` (clipped): sum(from_draft) <= accepted, equal unless clipped.

    `text` is what may be shown after this round (stop strings held back, see stops.py), so it
    can include text of earlier rounds' tokens; `draft_spans` are the [start, end) character
    ranges of `text` that came from accepted drafts (None when the engine does not say).
    """

    index: int
    proposed: int
    accepted: int
    tokens: list[int]
    from_draft: list[bool]
    text: str
    accept_flags: list[bool]
    draft_s: float  # host time spent drafting before the verify could launch (about 0 when the
    # drafts were made ahead, an MTP step launched ahead: the drafter's device time then falls in verify_s)
    verify_s: float
    wall_s: float
    t_s: float = 0.0  # seconds since the run started, at the end of this round
    prefill: bool = False
    steps: int = 0  # drafts asked for this round (the controller's choice)
    finish: FinishReason | None = None
    note: str | None = None  # e.g. "speculation stopped: drafter raised ValueError(...)"
    draft_spans: list[tuple[int, int]] | None = None
    ranks: dict | None = None  # tensor parallel only: this step's cost on rank 0 (engines/distributed StepCost)
    draft_source: str | None = None  # who drafted this round's tokens when drafters are composed: "ngram",
    # the model drafter ("mtp", "draft"), or "mtp+ngram": its chain (the first `steps` drafts), then n-gram's
    # (engines/speculative/composed.py)
    expected_tok_s: list[float] | None = None  # --steps auto: the tok/s it expected of k = 0..7 when it chose `steps`
    expected_tokens: list[float] | None = None  # and the tokens per round (accepted + 1) it expected of each k
    launched_early: bool = False  # its verify was launched before the last round's verdict was read (MTP on
    # a full-attention target: engines/mlx_chat/engine.py)

    def __post_init__(self):
        if self.draft_spans is not None:  # read back from JSON as lists
            self.draft_spans = [(int(a), int(b)) for a, b in self.draft_spans]

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["ranks"] is None:  # one process: the records stay as they were
            del d["ranks"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Round":
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in d.items() if k in names})


# How the engines' Round.note says the drafter failed and decoding went on plainly (graceful
# degradation): "speculation stopped: ..." mid-run, "speculation unavailable: ..." at the start.
FALLBACK_NOTES = ("speculation stopped", "speculation unavailable")


def fallback_note(rnd: Round) -> str | None:
    """The round's note if it reports a drafter fallback."""
    return rnd.note if rnd.note and any(n in rnd.note for n in FALLBACK_NOTES) else None


@dataclass
class SessionStats:
    rounds: int
    decode_rounds: int
    tokens: int
    proposed: int
    accepted: int
    acceptance_rate: float  # accepted / proposed
    tau: float  # mean tokens emitted per decode round, counting the target's own token
    decode_tok_s: float  # decode tokens / decode wall time; prefill excluded
    ttft_s: float  # wall time of the prefill round
    mean_round_s: float
    mtpc_throughput: float  # tau / mean round latency (tokens per second, the MtPC ratio)
    per_position_acceptance: list[float] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    wall_s: float = 0.0
    fallbacks: int = 0  # rounds reporting that the drafter failed and decoding went on plainly
    fallback: str | None = None  # the first such report

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunningStats:
    """The sums SessionStats is made of, kept round by round: `session_stats` adds a list's
    rounds to one, the window's telemetry adds each round as it arrives (the same figures,
    without rescanning every round)."""

    rounds: int = 0
    decode_rounds: int = 0
    tokens: int = 0
    decode_tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    decode_wall: float = 0.0
    prefill_wall: float = 0.0  # the time to the first token
    draft_s: float = 0.0
    verify_s: float = 0.0
    wall_s: float = 0.0
    offered_at: list[int] = field(default_factory=list)  # per draft position: rounds that offered it
    accepted_at: list[int] = field(default_factory=list)  # and that accepted it
    fallbacks: list[str] = field(default_factory=list)  # the drafter fallbacks the rounds reported

    def add(self, r: Round) -> None:
        self.rounds += 1
        self.tokens += len(r.tokens)
        self.proposed += r.proposed
        self.accepted += r.accepted
        self.draft_s += r.draft_s
        self.verify_s += r.verify_s
        self.wall_s += r.wall_s
        if r.prefill:
            self.prefill_wall += r.wall_s
        else:
            self.decode_rounds += 1
            self.decode_tokens += len(r.tokens)
            self.decode_wall += r.wall_s
        grow = len(r.accept_flags) - len(self.offered_at)
        if grow > 0:
            self.offered_at += [0] * grow
            self.accepted_at += [0] * grow
        for j, flag in enumerate(r.accept_flags):
            self.offered_at[j] += 1
            self.accepted_at[j] += bool(flag)
        note = fallback_note(r)
        if note:
            self.fallbacks.append(note)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per decode round, counting the target's own token."""
        return self.decode_tokens / self.decode_rounds if self.decode_rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_wall if self.decode_wall > 0 else 0.0

    @property
    def mean_round_s(self) -> float:
        return self.decode_wall / self.decode_rounds if self.decode_rounds else 0.0

    def per_position(self) -> list[float]:
        return [a / o for a, o in zip(self.accepted_at, self.offered_at)]

    def stats(self) -> SessionStats:
        mean_round = self.mean_round_s
        return SessionStats(
            rounds=self.rounds,
            decode_rounds=self.decode_rounds,
            tokens=self.tokens,
            proposed=self.proposed,
            accepted=self.accepted,
            acceptance_rate=self.acceptance_rate,
            tau=self.tau,
            decode_tok_s=self.decode_tok_s,
            ttft_s=self.prefill_wall,
            mean_round_s=mean_round,
            mtpc_throughput=self.tau / mean_round if mean_round > 0 else 0.0,
            per_position_acceptance=self.per_position(),
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            wall_s=self.wall_s,
            fallbacks=len(self.fallbacks),
            fallback=self.fallbacks[0] if self.fallbacks else None,
        )


def session_stats(rounds: list[Round]) -> SessionStats:
    totals = RunningStats()
    for r in rounds:
        totals.add(r)
    return totals.stats()
