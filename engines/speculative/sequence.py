"""One request in the round loop, whichever engine runs it (a row of the chat batch, or of
GLM-OCR's): what it asked for, its proposer and the k of its next round (the schedule), what it
has emitted (Output), and the Round of each of its target forwards.

A round, from the sequence's side:

    steps = seq.next_steps()            how many drafts to ask for (0: a plain round)
    draft = seq.propose(steps)          the proposer's drafts (a failing proposer: none, and
                                        speculation stops for this sequence, said once)
    ... the engine verifies them in a target forward, rolls its cache back ...
    tokens, finish = seq.commit(step, verdict, hidden)
                                        clip at EOS / max_tokens / a repetition loop, take the
                                        tokens, teach the schedule the round, commit the proposer
    rnd = seq.report(step, verdict, tokens, finish)
                                        detokenize (stop strings held back), the Round
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from engines.types import EngineError, Request
from engines.speculative.ngram import NGramProposer
from engines.speculative.output import Output
from engines.speculative.proposer import EMPTY, Context, Draft, Proposer
from engines.speculative.rounds import Round
from engines.speculative.schedule import DraftSchedule
from engines.speculative.verify import Verdict


def never() -> bool:
    return False


@dataclass
class Step:
    """A round from launch to report: what was asked and drafted, and what it cost. Engines
    add the lazy results of their verify forward (engines/batch/engine.py: Step)."""

    steps: int  # drafts asked for
    draft: Draft = field(default_factory=lambda: EMPTY)
    draft_s: float = 0.0  # host time drafting before the verify could launch
    verify_s: float = 0.0
    wall_s: float = 0.0  # settle to settle: the round as its request waits for it
    expected: tuple[list[float], list[float]] | None = None  # --steps auto: tok/s and tokens per k when k was chosen
    launched_early: bool = False  # launched on the last round's verdict still in the graph (MTP rows)
    hidden: Any = None  # the target's final hidden states of its inputs, when its proposer reads them

    @property
    def k(self) -> int:
        return self.draft.size


@dataclass(eq=False)  # a sequence is itself: compared (and removed from queues) by identity
class Sequence:
    request: Request
    ctx: Context  # tokens (prompt + emitted), sampling, the target's hidden state; the engine's own
    proposer: Proposer | None
    schedule: DraftSchedule
    out: Output  # what was emitted, its text (stop strings held back), the Rounds
    should_stop: Callable[[], bool] = never  # cancel, or a client that left
    key: Any = None  # T>0 in a batch: this sequence's own RNG (so no row's draws depend on another's)
    id: int = 0
    finished: bool = False
    last_settled: float = 0.0  # end of the previous round's settle: rounds tile the timeline
    last_k: int | None = None  # drafts of the last round committed
    # what the batch-aware controller estimates this row's odds from (engines/batch/controller.py)
    accepted: int = 0  # drafts accepted so far
    rejections: int = 0  # rounds that ended in a rejection
    asked: int = 0  # rounds it was asked for drafts
    offered: int = 0  # rounds its proposer offered some (an n-gram miss offers nothing)
    cap_said: int | None = None  # the controller's cap on its drafts, last said to it

    @classmethod
    def begin(cls, request: Request, ctx: Context, proposer: Proposer | None, out: Output, *,
              profile: tuple[Any, str | None] = (None, None), notes: tuple[str | None, ...] = (),
              should_stop: Callable[[], bool] | None = None) -> "Sequence":
        """A request's Sequence, for any engine: its schedule (plain without a proposer), --steps
        auto wired to what its proposer learns from, and the notes its first Round says.
        `profile`: the tuning profile auto starts from and why not (engines/profiles.py for_spec)."""
        try:
            schedule = DraftSchedule.of(request.spec, *profile) if proposer is not None else DraftSchedule(0)
        except ValueError as e:
            raise EngineError(str(e)) from e
        auto = schedule.auto
        if auto is not None and isinstance(proposer, NGramProposer):
            proposer.auto = auto  # n-gram's acceptance from whole continuations (tuning.py)
        if auto is not None and hasattr(proposer, "chooser"):  # composed: price its widths as auto does
            proposer.chooser.latency = lambda width: auto.latency().at(width) if auto.ready() else 1.0
        for said in (*notes, schedule.note):
            if said:
                out.say(said)
        return cls(request, ctx, proposer, schedule, out, should_stop or never)

    @property
    def remaining(self) -> int:
        return self.out.remaining

    @property
    def needs_hidden(self) -> bool:
        return self.proposer is not None and self.proposer.needs_hidden

    @property
    def drafting(self) -> bool:
        return self.proposer is not None and self.schedule.enabled

    def stop_speculating(self, error: BaseException) -> None:
        """Graceful degradation: the drafter failed; decode plainly from here on, say so once."""
        self.schedule.disable()
        self.out.say(f"speculation stopped: {type(error).__name__}: {error}")

    # -- a round, in the order it runs --------------------------------------------------------
    def start(self, first: Verdict, hidden: Any = None) -> tuple[list[int], str | None]:
        """After the prefill: the first token, and the proposer started on the prompt."""
        tokens, finish = self.out.clip(first)
        self.ctx.tokens += tokens  # in place: a copy a round is O(context) on the hot path
        self.ctx.hidden = hidden
        if self.proposer is not None:
            try:
                self.proposer.start(self.ctx)
            except Exception as e:  # graceful degradation: plain decoding from here on
                self.stop_speculating(e)
        if finish is None and self.should_stop():
            finish = "cancelled"
        return tokens, finish

    def next_steps(self, remaining: int | None = None) -> int:
        """Drafts to ask for this round. `remaining`: the tokens left to emit after what is already
        launched (chat's next round launched before this one settles)."""
        if not self.drafting:
            return 0
        return self.schedule.next_steps(self.remaining if remaining is None else remaining)

    def propose(self, steps: int) -> Draft:
        if not steps or not self.drafting:
            return EMPTY
        try:
            return self.proposer.propose(self.ctx, steps)
        except Exception as e:
            self.stop_speculating(e)
            return EMPTY

    def expected(self) -> tuple[list[float], list[float]] | None:
        """What --steps auto expected of each k as it chose this step's: kept with the step, since
        the next step is chosen (and the schedule's figures overwritten) before its Round is built."""
        if self.schedule.expected is None or not self.drafting:  # (stale once speculation stopped)
            return None
        rates, tokens = self.schedule.expected
        return [round(r, 2) for r in rates], [round(t, 3) for t in tokens]

    def commit(self, step: Step, verdict: Verdict, hidden: Any = None,
               priced: bool = True) -> tuple[list[int], str | None]:
        """The round's verdict taken: its tokens clipped (EOS, max_tokens, a repetition loop) and
        added to the context, with `hidden`, the target's hidden state that produced the last;
        the schedule taught the round (its k, its acceptance and -- `priced` -- what a round of
        its k costs, settle to settle, drafting apart); the proposer told. The engine has rolled
        its target back (or masked the rejected drafts) before."""
        tokens, finish = self.out.clip(verdict)
        self.ctx.tokens += tokens  # in place: a copy a round is O(context) on the hot path
        self.ctx.hidden = hidden
        self.schedule.record(step.k, verdict.accepted, step.wall_s - step.draft_s, step.draft_s,
                             priced=priced, asked=step.steps)
        self.last_k = step.k
        self.accepted += verdict.accepted
        self.rejections += 1 if verdict.accepted < step.k else 0
        self.asked += 1 if step.steps else 0
        self.offered += 1 if step.k else 0
        observe = getattr(self.proposer, "observe", None)
        if observe is not None:  # composed drafting prices its sources by the rounds' own times
            observe(step)
        if self.drafting and not finish:
            try:
                self.proposer.commit(self.ctx)
            except Exception as e:
                self.stop_speculating(e)
        if finish is None and self.should_stop():
            finish = "cancelled"
        return tokens, finish

    def priced(self, step: Step, next_step: Step | None) -> bool:
        """Whether this round's time, settle to settle, is what a round of its k costs (--steps
        auto prices the widths by it). Where rounds launch before the last verdict, not unless this round and the next both did and the rounds
        on either side drafted as many: the host enqueues round r+1 while the device runs round
        r, and MLX's CPU stream takes only ~50 ops ahead, so the host reaches r's settle when
        the device is well into r+1 -- part of r's time is r+1's, and part of the round before
        r's is r's (the first round after the prefill carries the second's; the last launched
        early lacks its own). Priced so, the probes made a second draft look cheap
        (docs/benchmarks.md, "Speculation that tunes itself")."""
        next_early = next_step is not None and next_step.launched_early
        if step.launched_early or next_early:
            return step.launched_early and next_early and self.last_k == step.k == next_step.k
        return True

    def report(self, step: Step, verdict: Verdict, tokens: list[int], finish: str | None,
               prefill: bool = False) -> Round:
        """The round's Round: its text streamed (stop strings held back: Output.round)."""
        expected = step.expected if not prefill else None
        return self.out.round(
            verdict, tokens, finish, proposed=step.k, draft_s=step.draft_s, verify_s=step.verify_s,
            wall_s=step.wall_s, steps=step.steps, prefill=prefill,
            draft_source=step.draft.source if step.k else None,
            expected_tok_s=expected[0] if expected else None, expected_tokens=expected[1] if expected else None,
            launched_early=step.launched_early,
        )

    def settled(self, step: Step, now: float | None = None) -> None:
        """The round's verdict is read: its wall time is settle to settle."""
        now = time.perf_counter() if now is None else now
        step.wall_s, self.last_settled = now - (self.last_settled or self.out.started), now
