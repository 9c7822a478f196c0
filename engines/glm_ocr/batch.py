"""GLM-OCR sequences read together -- pages, or a page's regions, as the rows of one batch: one
target forward per step over every row's [pending token, drafts], each row verified on its own
(THE step is `OcrBatch.step`). The shape of the chat batch (engines/batch/engine.py) on GLM-OCR's
runtimes; a lone request is a batch of one (engine.OcrEngine.generate).

One step:

    admit     waiting sequences (their images read into prompts when submitted) take free rows:
              each prompt is prefilled alone -- the same forward whether the page is read alone
              or beside others, so the same first token -- which is reported, and its cache is
              copied into a new row of the batch's K/V (runtime_fast.BatchKV.join).
    stop      rows cancelled, or whose context is full, leave before the forward.
    draft     each row asks its own schedule for k and drafts with its own proposer: n-gram
              lookup, composed drafting, or its MTP drafter -- the MTP rows together
              (engine.MtpGroup): each chain step runs the MTP layer row after row, each row with
              its own MTP cache, then the LM head once over all of them.
    verify    one forward of the decoder stack over every row's [token, drafts], right-padded to
              the widest row (runtime_fast.FastRuntime.decode_rows); the LM head over the real
              rows only, in one product; each row's verdict from its own rows: greedy at T=0,
              rejection sampling at T>0 on the row's own RNG, seeded from its request, so what a
              request receives never depends on who shares its batch.
    settle    each row keeps its token and accepted drafts (the rest of its slots is overwritten
              by its next write); its Sequence commits the verdict (EOS, max_tokens, a repetition
              loop, its schedule and proposer taught) and reports the Round; finished rows leave.

Runtimes: the fast torch runtime batches. Core ML and its PyTorch twin hold one decoder state and
one MTP state, so there the batch is a batch of one (`OneRow`): sequences are read one after
another, each waiting for the row.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from engines.types import EngineError, Request, Sampling, ShouldStop
# (engine.py's OcrEngine is named in annotations only: it imports this module, for its generate)
from engines.glm_ocr.positions import Positions, text_rope
from engines.glm_ocr.prompts import Prompt
from engines.speculative.proposer import Draft, DraftGroup, Proposer
from engines.speculative.rounds import Round
from engines.speculative.sequence import Sequence, Step
from engines.speculative.sampling import rejection_verify, target_probs
from engines.speculative.verify import Verdict, verify_greedy


class Sampler:
    """The target's side: the first token, and the verdict on a round's drafts. Row i of a
    verify forward's logits follows [token, drafts[:i]]: it checks drafts[i]; the last row
    gives the bonus token. T > 0: rejection sampling (engines/speculative/sampling.py) with
    point-mass proposals, since the MTP layer drafts greedily."""

    def __init__(self, sampling: Sampling):
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)

    def first(self, logits: np.ndarray) -> int:
        return self.verify([], logits[-1:]).tokens[0]

    def verify(self, drafts: list[int], logits: np.ndarray) -> Verdict:
        s = self.sampling
        if s.greedy:
            return verify_greedy(drafts, [int(t) for t in np.argmax(logits, axis=-1)])
        p = target_probs(logits, s.temperature, s.top_p, s.top_k, s.min_p)
        return rejection_verify(p, None, drafts, self.rng)


def row_sampler(request: Request) -> Sampler:
    """A row's own verifier: greedy, or rejection sampling on an RNG of its own seeded from its
    request, so a seeded request draws what it draws alone."""
    return Sampler(request.sampling)


# ----------------------------------------------------------------------------- targets


class Rows:
    """The fast runtime's target: every row in one decoder forward over a shared BatchKV."""

    def __init__(self, engine: OcrEngine):
        from engines.glm_ocr.runtime_fast import BatchKV

        self.runtime, self.config = engine.runtime, engine.config
        self.kv = BatchKV()

    def prefill(self, prompt: Prompt):
        """The prompt alone, in a cache of its own: (hidden states of every prompt row, cache)."""
        cos, sin = text_rope(prompt.positions.rows(0, len(prompt.ids)), self.config.text)
        return self.runtime.prefill(prompt.embeds, cos, sin)

    def join(self, alone, length: int) -> None:
        self.kv.join(alone, length)

    def forward(self, inputs: list[list[int]], starts: list[int], positions: list[Positions]) -> np.ndarray:
        """[B, W, C] final-normed hidden states of every row's inputs (right-padded with the row's
        last input, at the positions after it: the padding's outputs are never read)."""
        width = max(len(r) for r in inputs)
        padded = [r + [r[-1]] * (width - len(r)) for r in inputs]
        assert starts == self.kv.lengths, (starts, self.kv.lengths)
        ropes = [text_rope(p.rows(start, width), self.config.text) for p, start in zip(positions, starts)]
        embeds = self.runtime.embeddings[np.asarray(padded)]
        return self.runtime.decode_rows(self.kv, embeds, np.stack([c for c, _ in ropes]), np.stack([s for _, s in ropes]))

    def settle(self, kept: list[int]) -> None:
        self.kv.settle(kept)

    def select(self, keep: list[int]) -> None:
        if keep:
            self.kv.select(keep)
        else:  # the last row left: its buffers go with it
            self.kv = type(self.kv)()


class OneRow:
    """Core ML and its twin: the runtime's own caches (one decoder state, one MTP state), so one
    sequence at a time -- a batch of one; its prefill in the runtime's chunks (OcrEngine.prefill)."""

    max_batch = 1

    def __init__(self, engine: OcrEngine):
        self.engine = engine

    def prefill(self, prompt: Prompt):
        return self.engine.prefill(prompt), None

    def join(self, alone, length: int) -> None:
        pass

    def forward(self, inputs, starts, positions) -> np.ndarray:
        (tokens,), (start,), (pos,) = inputs, starts, positions
        return self.engine.forward(tokens, start, pos)[None]

    def settle(self, kept: list[int]) -> None:
        pass  # the next forward writes right after the kept rows; the runtime masks the rest

    def select(self, keep: list[int]) -> None:
        pass


# ----------------------------------------------------------------------------- the batch


@dataclass(eq=False)
class Waiting:
    """A submitted sequence waiting for a row: its prompt (the image already encoded)."""

    seq: Sequence
    prompt: Prompt


@dataclass
class OcrBatch:
    """Continuous batching of GLM-OCR requests over a loaded OcrEngine (its runtime, tokenizer,
    drafters). `prefill_budget`: prompt tokens prefilled per step once rows are running (at
    least one prompt), so joining pages stall the running ones for a bounded time."""

    engine: OcrEngine
    max_batch: int = 8
    prefill_budget: int = 4096
    running: list[Sequence] = field(default_factory=list)  # in row order
    joining: deque = field(default_factory=deque)  # Waiting, in arrival order
    positions: dict[int, Positions] = field(default_factory=dict)  # sequence id -> its mRoPE positions
    prompt_cache = None  # (the chat batch's prompt cache: a page's image prompt is not kept)
    target: Rows | OneRow | None = None
    _ids: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self):
        if self.max_batch < 1:
            raise EngineError(f"max_batch must be at least 1, got {self.max_batch}")
        batched = hasattr(self.engine.runtime, "decode_rows")
        self.target = Rows(self.engine) if batched else OneRow(self.engine)
        self.max_batch = self.max_batch if batched else 1

    @property
    def runtime(self):
        return self.engine.runtime

    @property
    def busy(self) -> bool:
        return bool(self.running or self.joining)

    @property
    def size(self) -> int:
        return len(self.running)

    # -- entering -----------------------------------------------------------------------------
    def submit(self, request: Request, should_stop: ShouldStop | None = None, *,
               drafter: Proposer | None = None, twin_of: Sequence | None = None) -> Sequence:
        """Check the request and read its image (an invalid one never enters: EngineError), and
        queue it for a row. `drafter` replaces its MTP drafter (benchmarks, tests), as in
        OcrEngine.generate. `twin_of` (another choice of the same request, in serve) is taken for
        the batch interface's sake: each choice reads its own page."""
        seq, prompt = self.engine.sequence(request, should_stop, drafter)
        seq.id = next(self._ids)
        seq.key = row_sampler(request)
        self.joining.append(Waiting(seq, prompt))
        return seq

    # -- THE step ----------------------------------------------------------------------------
    def step(self) -> list[tuple[Sequence, Round]]:
        """Joining prompts (first tokens), then one target forward over every running row.
        Returns each sequence's Round of this step."""
        out = self._admit()
        stopped = [(s, self._stop(s)) for s in self.running]
        out += [(s, r) for s, r in stopped if r is not None]
        self._leave([s for s, r in stopped if r is not None])
        rows = list(self.running)
        if rows:
            steps = self._draft(rows)
            t0 = time.perf_counter()
            hidden = self.target.forward([[s.ctx.tokens[-1], *st.draft.ids()] for s, st in zip(rows, steps)],
                                         [s.ctx.position for s in rows], [self.positions[s.id] for s in rows])
            verdicts = self._verdicts(rows, steps, hidden)
            forward_s, now = time.perf_counter() - t0, time.perf_counter()
            for b, (seq, step, verdict) in enumerate(zip(rows, steps, verdicts)):
                step.verify_s = forward_s
                seq.settled(step, now)
                # the rows of the fed token and the accepted drafts are kept; the MTP layer learns them
                seq.ctx.rows = hidden[b, : verdict.accepted + 1]
                tokens, finish = seq.commit(step, verdict, hidden[b, verdict.accepted])
                out.append((seq, seq.report(step, verdict, tokens, finish)))
            self.target.settle([1 + v.accepted for v in verdicts])
        self._leave([s for s, r in out if r.finish and not s.finished])
        return out

    # -- the step's helpers, in the order they run --------------------------------------------
    def _admit(self) -> list[tuple[Sequence, Round]]:
        """Waiting sequences take free rows, in arrival order, while this step's prefill budget
        lasts (the first always goes in when no row runs). A cancelled one leaves the queue."""
        gone = [w for w in self.joining if w.seq.should_stop()]
        out = [(w.seq, w.seq.out.stopped("cancelled")) for w in gone]
        for w in gone:
            self.joining.remove(w)
            w.seq.finished = True
        budget = self.prefill_budget
        while self.joining and len(self.running) < self.max_batch:
            w = self.joining[0]
            if self.running and len(w.prompt.ids) > budget:
                break  # the next step reads it
            self.joining.popleft()
            budget -= len(w.prompt.ids)
            out.append((w.seq, self._first_token(w)))
        return out

    def _first_token(self, w: Waiting) -> Round:
        """The prompt prefilled alone; its last row gives the first token; then the sequence
        joins (its cache copied into a new row)."""
        seq, t0 = w.seq, time.perf_counter()
        hidden, alone = self.target.prefill(w.prompt)
        first = Verdict(0, [seq.key.first(self.runtime.logits(hidden[-1:]))])
        seq.ctx.rows = hidden
        tokens, finish = seq.start(first, hidden[-1])
        seq.last_settled = time.perf_counter()
        step = Step(0, verify_s=seq.last_settled - t0, wall_s=seq.last_settled - t0)
        rnd = seq.report(step, first, tokens, finish, prefill=True)
        if rnd.finish:
            seq.finished = True
        else:
            self.target.join(alone, len(w.prompt.ids))
            self.positions[seq.id] = w.prompt.positions
            self.running.append(seq)
        return rnd

    def _stop(self, seq: Sequence) -> Round | None:
        """Before the forward: cancelled, or the context has no room for another round."""
        if seq.should_stop():
            return seq.out.stopped("cancelled")
        if seq.ctx.position + self.runtime.seq_len > self.runtime.cache_length:
            return seq.out.stopped("length", f"stopped: the context of {self.runtime.cache_length} tokens is full")
        return None

    def _draft(self, rows: list[Sequence]) -> list[Step]:
        """Each row's k and drafts: rows whose drafters share a group (engine.MtpGroup: the MTP
        layer's rows) draft together, the others with their own proposer. A failing drafter
        stops speculation for its sequence(s) only. A row's drafting time is its own, or its
        group's."""
        steps = [Step(min(seq.next_steps(), self.runtime.seq_len - 1), expected=seq.expected()) for seq in rows]
        groups: dict[int, tuple[DraftGroup, list]] = {}
        for b, (seq, step) in enumerate(zip(rows, steps)):
            group = getattr(seq.proposer, "group", None) if step.steps else None
            if group is not None:
                groups.setdefault(id(group), (group, []))[1].append((b, seq, step.steps, None))
        t0 = time.perf_counter()
        drafts: dict[int, Draft] = {}
        for group, asks in groups.values():
            drafts |= self._draft_together(group, asks)
        shared_s = time.perf_counter() - t0
        for seq, step in zip(rows, steps):
            t1 = time.perf_counter()
            step.draft = drafts[seq.id] if seq.id in drafts else seq.propose(step.steps)
            step.draft_s = shared_s if seq.id in drafts else time.perf_counter() - t1
        return steps

    @staticmethod
    def _draft_together(group: DraftGroup, asks: list) -> dict[int, Draft]:
        """The drafts of a group's rows, by sequence id; a failing group stops speculation for
        each of its rows (they decode plainly from here on, their next Round says why)."""
        try:
            return {seq.id: d for (_, seq, _, _), d in zip(asks, group.propose_rows(None, asks))}
        except Exception as e:
            for _, seq, _, _ in asks:
                seq.stop_speculating(e)
            return {}

    def _verdicts(self, rows: list[Sequence], steps: list[Step], hidden: np.ndarray) -> list[Verdict]:
        """The LM head over every row's real rows in one product (never the padding); each row's
        verdict from its own logits on its own Sampler."""
        widths = [1 + step.k for step in steps]
        logits = self.runtime.logits(np.concatenate([hidden[b, :w] for b, w in enumerate(widths)]))
        bounds = np.cumsum([0, *widths])
        return [seq.key.verify(step.draft.ids(), logits[bounds[b] : bounds[b + 1]])
                for b, (seq, step) in enumerate(zip(rows, steps))]

    def _leave(self, done: list[Sequence]) -> None:
        """Finished and cancelled sequences leave; their rows are dropped now."""
        if not done:
            return
        for seq in done:
            seq.finished = True
            self.positions.pop(seq.id, None)
            leave = getattr(seq.proposer, "leave", None)
            if leave is not None:
                leave()
        keep = [b for b, s in enumerate(self.running) if not s.finished]
        if len(keep) < len(self.running):
            self.target.select(keep)
            self.running = [self.running[b] for b in keep]

    def clear(self) -> None:
        """Drop every sequence, running or joining (serve, when a step fails: each request has
        heard the error)."""
        self._leave(list(self.running))
        self.joining.clear()

    # -- a batch of one -------------------------------------------------------------------------
    def generate(self, request: Request, should_stop: ShouldStop | None = None, *, drafter: Proposer | None = None,
                 on_prefill=None) -> Iterator[Round]:
        """A lone request through the batch (the Engine protocol; OcrEngine.generate is a batch
        of one). `on_prefill` is accepted for the protocol; a page's prefill reports no progress."""
        seq = self.submit(request, should_stop, drafter=drafter)
        while self.busy:
            for s, rnd in self.step():
                if s is seq:
                    yield rnd
                    if rnd.finish:
                        return
