"""THE round loop, over a batch of sequences, for every engine: chat (engines/batch/engine.py,
BatchEngine, over an mlx-lm target) and GLM-OCR (engines/glm_ocr/batch.py, OcrBatch, over its
runtimes). A lone request is a batch of one (`generate`).

One step (`RowBatch.step`):

    admit     the engine reads waiting prompts while rows are free; each reports its first
              token and joins the batch (into an idle batch: the step ends there, so a first
              token never waits for a forward)
    stop      rows cancelled (or out of room, where an engine says so) leave before the forward
    launch    each row's k and drafts (`drafts`: the rows of a shared drafter together), then one
              target forward over every row's [pending token, drafts] -- or the step the engine
              launched ahead on the last step's verdicts still in the graph
    verdicts  each row's accepted drafts plus one target token, from its own slice of the forward
              and its own RNG (engines/speculative/verify.py)
    commit    each row's Sequence takes its verdict (EOS, max_tokens, a repetition loop; its
              schedule and proposer taught) and reports its Round
    settle    the target keeps each row's pending token and accepted drafts: the rest is rolled
              back (a slot that dies, a row written over)
    leave     finished rows leave; their rows are freed

What differs per engine is behind the hooks below the step: `_admit`, `_launch`, `_verdicts`,
`_settle`, `_select` (and `_stopped`, `_kept`, where an engine adds to them).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from engines.speculative.proposer import Draft, DraftGroup
from engines.speculative.rounds import Round
from engines.speculative.sequence import Sequence, Step
from engines.speculative.verify import Verdict


@dataclass(kw_only=True)
class RowBatch:
    max_batch: int = 8
    running: list[Sequence] = field(default_factory=list)  # in row order
    joining: deque = field(default_factory=deque)  # waiting for a row (each with its .seq), in arrival order
    ahead: list[Step] | None = None  # the next step, launched on this one's verdicts still in the graph
    _ids: itertools.count = field(default_factory=itertools.count)

    @property
    def busy(self) -> bool:
        return bool(self.running or self.joining)

    @property
    def size(self) -> int:
        return len(self.running)

    # -- THE step -----------------------------------------------------------------------------
    def step(self) -> list[tuple[Sequence, Round]]:
        """Waiting prompts read (their first tokens), then one target forward over every running
        row. Returns each sequence's Round of this step."""
        idle = not self.running
        out = self._admit()
        if out and idle:  # first tokens go out now, not after the new rows' first forward
            return out
        stopped = [(seq, rnd) for seq in self.running if (rnd := self._stopped(seq)) is not None]
        self._leave([seq for seq, _ in stopped])
        out += stopped
        if self.running:
            t0 = time.perf_counter()
            rows, steps = self._launch(list(self.running))
            verdicts = self._verdicts(rows, steps)
            now = time.perf_counter()
            for b, (seq, step, verdict) in enumerate(zip(rows, steps, verdicts)):
                step.verify_s = now - t0
                seq.settled(step, now)
                ahead = self.ahead[b] if self.ahead is not None and b < len(self.ahead) else None
                tokens, finish = seq.commit(step, verdict, self._kept(seq, step, verdict), priced=seq.priced(step, ahead))
                out.append((seq, seq.report(step, verdict, tokens, finish)))
            self._settle(steps, verdicts)
        self._leave([seq for seq, rnd in out if rnd.finish and not seq.finished])
        return out

    # -- what every engine shares -------------------------------------------------------------
    def drafts(self, rows: list[Sequence], ks: list[int], target_cache: Any = None,
               key: Callable[[Sequence], Any] | None = None) -> list[tuple[int, Draft, float]]:
        """Each row's (k, drafts, drafting seconds): the rows of a shared drafter (its `group`:
        a draft model's, an MTP layer's) drafted together, the others by their own proposer. A
        failing drafter stops speculation for its rows only; a row whose shared drafter failed
        drafts nothing (k 0) and its next Round says why. `target_cache`: what a drafter reading
        the target's K/V reads; `key(seq)`: a shared drafter's row's RNG key for this step."""
        groups: dict[int, tuple[DraftGroup, list]] = {}
        for b, (seq, k) in enumerate(zip(rows, ks)):
            group = getattr(seq.proposer, "group", None) if k else None
            if group is not None:
                groups.setdefault(id(group), (group, []))[1].append((b, seq, k, key(seq) if key else None))
        t0 = time.perf_counter()
        together: dict[int, Draft] = {}
        for group, asks in groups.values():
            together |= self._draft_together(group, asks, target_cache)
        shared_s = time.perf_counter() - t0
        out = []
        for seq, k in zip(rows, ks):
            if seq.id in together:
                out.append((k, together[seq.id], shared_s))
                continue
            t1 = time.perf_counter()
            k = k if seq.schedule.enabled else 0  # (its shared drafter failed above)
            out.append((k, seq.propose(k), time.perf_counter() - t1))
        return out

    def _draft_together(self, group: DraftGroup, asks: list, target_cache: Any) -> dict[int, Draft]:
        """A shared drafter's drafts for its rows (row, sequence, k, key), by sequence id."""
        try:
            return {seq.id: d for (_, seq, _, _), d in zip(asks, group.propose_rows(target_cache, asks))}
        except Exception as e:  # graceful degradation for every sequence of this drafter
            for _, seq, _, _ in asks:
                self.stop_speculating(seq, e)
            return {}

    @staticmethod
    def stop_speculating(seq: Sequence, error: BaseException) -> None:
        """The sequence's drafter failed: it decodes plainly from here, and leaves its group."""
        seq.stop_speculating(error)
        leave_group(seq)

    def _leave(self, done: list[Sequence]) -> None:
        """Finished, cancelled and disconnected sequences leave; their rows are freed now."""
        for seq in done:
            seq.finished = True
            leave_group(seq)
        keep = [b for b, seq in enumerate(self.running) if not seq.finished]
        if len(keep) < len(self.running):
            self.running = [self.running[b] for b in keep]
            self._select(keep)

    def clear(self) -> None:
        """Drop every sequence, running or waiting (serve, when a step fails: each request has
        heard the error)."""
        self._leave(list(self.running))
        self.joining.clear()

    def auto_from_earlier_requests(self, seq: Sequence, seen: dict, drafter: str = "") -> None:
        """A batch of one's --steps auto starts from what earlier requests with this drafter
        showed (`seen`, kept by the engine): what its rounds cost by width (the machine's, not the
        prompt's, so only the first request pays to find them), its acceptance by position as
        the prior, the pace of its probes one draft deeper, and (n-gram) every fixed k's rounds
        replayed on their outputs (engines/speculative/tuning.py). A row of a larger batch learns
        from its own rounds."""
        auto = seq.schedule.auto
        if auto is None or self.max_batch != 1:
            return
        from engines.speculative.tuning import PositionAcceptance, Probes, Rounds, round_costs

        spec = seq.request.spec
        key = (spec.method, drafter, spec.compose_ngram, seq.request.sampling.greedy, auto.max_steps)
        auto.attach(*seen.setdefault(key, (round_costs(), PositionAcceptance(auto.max_steps), Probes(),
                                           Rounds(auto.max_steps))))

    # -- a batch of one -------------------------------------------------------------------------
    def generate(self, request, should_stop=None, *, on_prefill=None, **submit_options) -> Iterator[Round]:
        """A lone request through the batch loop (the Engine protocol). Left unfinished -- its
        consumer stopped reading, or a step raised -- it leaves the batch, as a cancel would."""
        seq = self.submit(request, should_stop, on_prefill=on_prefill, **submit_options)
        try:
            while not seq.finished and self.busy:
                for s, rnd in self.step():
                    if s is seq:
                        yield rnd
                        if rnd.finish:
                            seq.finished = True
        finally:
            if not seq.finished:
                self._drop(seq)

    def _drop(self, seq: Sequence) -> None:
        """`seq` out of the batch, wherever it is: waiting, or running."""
        for waiting in [w for w in self.joining if w.seq is seq]:
            self.joining.remove(waiting)
        seq.finished = True
        if seq in self.running:
            self._leave([seq])

    # -- each engine's ------------------------------------------------------------------------
    def submit(self, request, should_stop=None, *, on_prefill=None, **options) -> Sequence:
        raise NotImplementedError

    def _admit(self) -> list[tuple[Sequence, Round]]:
        """Waiting prompts read while rows are free: each one's first Round."""
        raise NotImplementedError

    def _stopped(self, seq: Sequence) -> Round | None:
        """Before the forward: the Round of a row that stops here, else None."""
        return seq.out.stopped("cancelled") if seq.should_stop() else None

    def _launch(self, rows: list[Sequence]) -> tuple[list[Sequence], list[Step]]:
        """This step's rows and Steps, their forward issued (a step launched ahead may hold
        fewer rows than run: those that joined since decode from the next)."""
        raise NotImplementedError

    def _verdicts(self, rows: list[Sequence], steps: list[Step]) -> list[Verdict]:
        raise NotImplementedError

    def _kept(self, seq: Sequence, step: Step, verdict: Verdict) -> Any:
        """The target's hidden state that produced the row's new token (an MTP drafter chains
        from it), when the forward returned it."""
        return step.hidden[verdict.accepted] if step.hidden is not None else None

    def _settle(self, steps: list[Step], verdicts: list[Verdict]) -> None:
        """The target keeps each row's pending token and accepted drafts."""
        raise NotImplementedError

    def _select(self, keep: list[int]) -> None:
        """Only these rows of the target stay (the others' sequences left)."""
        raise NotImplementedError


def leave_group(seq: Sequence) -> None:
    leave = getattr(seq.proposer, "leave", None)
    if leave is not None:
        leave()
