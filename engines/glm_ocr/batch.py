"""GLM-OCR sequences read together -- pages, or a page's regions, as the rows of one batch: one
target forward per step over every row's [pending token, drafts], each row verified on its own.
The round loop and what one step does are engines/speculative/loop.py's (`RowBatch.step`, as
the chat batch's); this module is its GLM-OCR side, each hook's docstring saying how; a lone
request is a batch of one (engine.OcrEngine.generate).

Runtimes: the fast torch runtime batches (`Rows`, over runtime_fast.BatchKV; its MTP rows draft
together, engine.MtpGroup). Core ML and its PyTorch twin hold one decoder state and one MTP
state, so there the batch is a batch of one (`OneRow`): sequences are read one after another,
each waiting for the row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from engines.types import EngineError, Request, Sampling, ShouldStop
# (engine.py's OcrEngine is named in annotations only: it imports this module, for its generate)
from engines.glm_ocr.positions import Positions, text_rope
from engines.glm_ocr.prompts import Prompt
from engines.speculative.proposer import Proposer
from engines.speculative.rounds import Round
from engines.speculative.loop import RowBatch
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
class OcrBatch(RowBatch):
    """Continuous batching of GLM-OCR requests over a loaded OcrEngine (its runtime, tokenizer,
    drafters). `prefill_budget`: prompt tokens prefilled per step once rows are running (at
    least one prompt), so joining pages stall the running ones for a bounded time."""

    engine: OcrEngine
    prefill_budget: int = 4096
    prompt_cache = None  # (the chat batch's prompt cache: a page's image prompt is not kept)
    target: Rows | OneRow | None = None

    def __post_init__(self):
        if self.max_batch < 1:
            raise EngineError(f"max_batch must be at least 1, got {self.max_batch}")
        batched = hasattr(self.engine.runtime, "decode_rows")
        self.target = Rows(self.engine) if batched else OneRow(self.engine)
        self.max_batch = self.max_batch if batched else 1

    @property
    def runtime(self):
        return self.engine.runtime

    # -- entering -----------------------------------------------------------------------------
    def submit(self, request: Request, should_stop: ShouldStop | None = None, *, on_prefill=None,
               drafter: Proposer | None = None, twin_of: Sequence | None = None) -> Sequence:
        """Check the request and read its image (an invalid one never enters: EngineError), and
        queue it for a row. `drafter` replaces its MTP drafter (benchmarks, tests), as in
        OcrEngine.generate. `on_prefill` and `twin_of` (another choice of the same request, in
        serve) are taken for the batch interface's sake: a page's prefill, bounded by the
        converted cache length, reports no progress, and each choice reads its own page."""
        seq, prompt = self.engine.sequence(request, should_stop, drafter)
        self.auto_from_earlier_requests(seq, self.engine.auto_seen)  # a document's pages, one after another
        seq.id = next(self._ids)
        seq.key = row_sampler(request)
        self.joining.append(Waiting(seq, prompt))
        return seq

    # -- the loop's hooks (engines/speculative/loop.py), in the order a step runs them ---------
    def _launch(self, rows: list[Sequence]) -> tuple[list[Sequence], list[Step]]:
        """Each row's k and drafts, then one decoder forward over every row: its hidden states
        kept with its step."""
        seq_len = self.runtime.seq_len
        drafted = self.drafts(rows, [min(seq.next_steps(), seq_len - 1) for seq in rows])
        steps = [Step(k, draft, spent, expected=seq.expected()) for seq, (k, draft, spent) in zip(rows, drafted)]
        hidden = self.target.forward([[s.ctx.tokens[-1], *st.draft.ids()] for s, st in zip(rows, steps)],
                                     [s.ctx.position for s in rows], [s.ctx.positions for s in rows])
        for b, step in enumerate(steps):
            step.hidden = hidden[b]
        return rows, steps

    def _verdicts(self, rows: list[Sequence], steps: list[Step]) -> list[Verdict]:
        """The LM head over every row's real rows in one product (never the padding); each row's
        verdict from its own logits on its own Sampler."""
        widths = [1 + step.k for step in steps]
        logits = self.runtime.logits(np.concatenate([step.hidden[:w] for step, w in zip(steps, widths)]))
        bounds = np.cumsum([0, *widths])
        return [seq.key.verify(step.draft.ids(), logits[bounds[b] : bounds[b + 1]])
                for b, (seq, step) in enumerate(zip(rows, steps))]

    def _kept(self, seq: Sequence, step: Step, verdict: Verdict):
        """The rows of the fed token and the accepted drafts are kept: the MTP layer learns them."""
        seq.ctx.rows = step.hidden[: verdict.accepted + 1]
        return step.hidden[verdict.accepted]

    def _settle(self, steps: list[Step], verdicts: list[Verdict]) -> None:
        self.target.settle([1 + v.accepted for v in verdicts])

    def _select(self, keep: list[int]) -> None:
        self.target.select(keep)

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
            seq.ctx.positions = w.prompt.positions
            self.running.append(seq)
        return rnd

    def _stopped(self, seq: Sequence) -> Round | None:
        """Before the forward: cancelled, or the context has no room for another round."""
        if seq.should_stop():
            return seq.out.stopped("cancelled")
        if seq.ctx.position + self.runtime.seq_len > self.runtime.cache_length:
            return seq.out.stopped("length", f"stopped: the context of {self.runtime.cache_length} tokens is full")
        return None
