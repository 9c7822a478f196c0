"""Many sequences, one target forward per step: continuous batching with per-sequence
speculation (THE batch loop is `BatchEngine.step`).

One step:

    admit     sequences waiting for a slot read their prompts, up to one prefill chunk's worth
              of tokens per step (so a long prompt never stalls the running streams, and
              several short ones join at once); a sequence whose prompt is read reports its
              first token and joins.
    draft     every running sequence asks its own schedule for k (0..7), within the batch-aware
              controller's cap (controller.py), and drafts: its own n-gram index, its row of a
              draft model shared by the batch (drafter.py), or its row of an MTP drafter shared
              by the batch (mtp.py: the Gemma 4 assistant, a drafter trained here, reading the
              row's own target K/V) -- rows may differ in k.
    verify    one target forward over [pending token, drafts, padding] of every row; each
              row's verdict from its own slice: greedy at T=0, rejection sampling at T>0 on
              the sequence's own RNG key, so what a request receives never depends on who
              shares its batch.
    rollback  each row keeps its pending token and accepted drafts; its rejected drafts and
              padding die in the cache's slot table (engines/batch/cache.py), nothing moves;
              an MTP row keeps the target's hidden state at its last accepted position.
    report    each row's Round, built by the same code as a lone run's (its Output clips at EOS,
              max_tokens and a repetition loop and holds back stop strings; mlx_chat's
              round_of builds the Round); rows that finished, were cancelled or whose client
              left, leave; their slots free.

A lone request is a batch of one (`generate`).
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx

from engines.types import EngineError, OnPrefill, PrefillProgress, Request, Sampling, ShouldStop
from engines.batch.cache import BatchCache, check_batchable
from engines.batch.controller import DraftBudget, row_odds
from engines.batch.drafter import BatchDrafter, DraftRow
from engines.batch.mtp import BatchMTP, MTPRow
from engines.batch.prompt_cache import PromptCache
from engines.mlx_chat import sampling as mxs
from engines.mlx_chat.context import check_fits
from engines.mlx_chat.engine import ChatEngine, Run, Step, round_of, settle
from engines.mlx_chat.prefill import PREFILL_CHUNK
from engines.mlx_chat.proposers import EMPTY, Draft, ProposerContext
from engines.speculative.rounds import Round
from engines.speculative.schedule import MAX_STEPS, DraftSchedule
from engines.speculative.verify import Verdict, verify_greedy, verify_sampled
from engines.validation import validate

@dataclass(eq=False)  # a sequence is itself: compared (and removed from queues) by identity
class Sequence:
    """One request in the batch: its run state (as a lone run keeps it), its own RNG, and,
    until it joins, the cache its prompt is read into."""

    id: int
    run: Run
    should_stop: ShouldStop
    key: mx.array | None  # T>0: this sequence's RNG; split once per step
    on_prefill: OnPrefill | None = None
    read: int = 0  # prompt tokens read so far (all but the last go through prefill chunks)
    own_cache: BatchCache | None = None  # its one-row cache while it reads its prompt
    prefill_started: float = 0.0
    finished: bool = False
    accepted: int = 0  # drafts accepted so far, and rounds that ended in a rejection: the
    rejections: int = 0  # controller's estimate of this row's per-position acceptance
    asked: int = 0  # rounds it was asked for drafts, and rounds it offered some: how often
    offered: int = 0  # its proposer has anything to offer (an n-gram miss offers nothing)
    capped_at: int | None = None  # the controller's cap last said to this sequence
    twin_of: "Sequence | None" = None  # another choice of the same request: its prefill is shared

    @property
    def prompt(self) -> list[int]:
        return self.run.ctx.tokens

    def next_key(self) -> mx.array | None:
        if self.key is None:
            return None
        self.key, sub = mx.random.split(self.key)
        return sub


@dataclass
class RowStep:
    """One row's part of a step: its drafts and the lazy results of its slice of the forward."""

    seq: Sequence | None
    step: Step
    sampling: Sampling
    argmax: mx.array | None = None  # [k+1] at T=0
    sampled: mxs.SampledVerdict | None = None  # T>0 with drafts
    token: mx.array | None = None  # T>0 plain: [1]
    hidden: mx.array | None = None  # [width, D] the target's final hidden states (MTP rows)


@dataclass
class BatchEngine:
    """Continuous batching over a loaded ChatEngine's target (its model, tokenizer, drafters)."""

    chat: ChatEngine
    max_batch: int = 8
    prefill_chunk: int = PREFILL_CHUNK
    running: list[Sequence] = field(default_factory=list)  # in cache row order
    joining: deque = field(default_factory=deque)  # reading their prompts, in arrival order
    cache: BatchCache | None = None
    compact_min_slots: int = 64  # compact a table once this many columns are dead in every row
    budget: DraftBudget | None = field(default_factory=DraftBudget.new)  # None: rows draft what they ask
    drafters: dict[str, BatchDrafter] = field(default_factory=dict)  # draft model path -> its batch
    mtps: dict[str, BatchMTP] = field(default_factory=dict)  # MTP drafter path -> its batch
    prompt_cache: PromptCache | None = None  # prompts read before (None: every prompt is read)
    _ids: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self):
        check_batchable(self.chat.model)  # UnbatchableModel names the cache it cannot hold

    @property
    def model(self):
        return self.chat.model

    @property
    def model_path(self) -> str:
        return self.chat.model_path

    def decode(self, token_ids: list[int]) -> str:
        return self.chat.decode(token_ids)

    def model_info(self) -> dict:
        return {**self.chat.model_info(), "max_batch": self.max_batch}

    @property
    def busy(self) -> bool:
        return bool(self.running or self.joining)

    @property
    def size(self) -> int:
        return len(self.running)

    # -- entering -----------------------------------------------------------------------------
    def submit(self, request: Request, should_stop: ShouldStop | None = None,
               on_prefill: OnPrefill | None = None, twin_of: Sequence | None = None) -> Sequence:
        """Check the request (an invalid one never enters the batch: EngineError) and queue
        it to read its prompt as soon as a row is free. `twin_of`: a sequence queued before
        with the same prompt (another of a request's n choices): this one copies its prefill."""
        validate(request, self.chat.context_length)
        prompt = self.chat.prompt_ids(request)
        if not prompt:
            raise EngineError("empty prompt")
        check_fits(len(prompt), request.max_tokens, self.chat.context_length)
        proposer, note = self._proposer(request)
        spec = request.spec
        schedule = DraftSchedule.of(spec, self.model_path) if proposer is not None else DraftSchedule(0)
        out = self.chat.output(request)
        for said in (note, schedule.note):
            if said:
                out.say(said)
        run = Run(request=request, ctx=ProposerContext(prompt, request.sampling, self.model, []), proposer=proposer,
                  schedule=schedule, out=out)
        seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(63)
        key = None if request.sampling.greedy else mx.random.key(seed)
        seq = Sequence(next(self._ids), run, should_stop or (lambda: False), key, on_prefill)
        if twin_of is not None and twin_of.prompt == prompt and twin_of in self.joining:
            seq.twin_of = twin_of
        self.joining.append(seq)
        return seq

    def _proposer(self, request: Request):
        if not request.spec.enabled:
            return None, None
        alone = ("composed drafting runs in a lone run only: in the batch this request drafts with "
                 f"{request.spec.method} alone") if request.spec.compose_ngram else None
        try:
            if request.spec.method == "mtp":  # one MTP drafter drafts for all its rows at once
                from engines.mlx_chat.mtp import make_mtp_proposer

                lone = make_mtp_proposer(self.chat, request)  # loads and checks the drafter
                path = request.spec.draft_model or self.chat.draft_path
                if path not in self.mtps:
                    self.mtps[path] = BatchMTP.of(lone)
                return self.mtps[path].row(), alone
            if request.spec.method == "draft":  # one draft model drafts for all its rows at once
                path = request.spec.draft_model or self.chat.draft_path
                if not path:
                    raise EngineError("spec method 'draft' needs a draft model (--draft-model PATH)")
                if path not in self.drafters:
                    self.drafters[path] = BatchDrafter(self.chat.draft_model(path).model)
                return self.drafters[path].row(), alone
            return self.chat.make_proposer(request), None
        except EngineError as e:
            return None, f"speculation unavailable: {e}"

    # -- THE step ----------------------------------------------------------------------------
    def step(self) -> list[tuple[Sequence, Round]]:
        """Up to one prefill chunk of joining prompts, and one target forward over every
        running sequence. Returns each sequence's Round of this step."""
        out = self._admit()
        cancelled = [(s, self._cancelled_round(s)) for s in self.running if s.should_stop()]
        self._leave([s for s, _ in cancelled])  # a cancel or a gone client: out before the forward
        out += cancelled
        rows = list(self.running)
        if rows:
            t0 = time.perf_counter()
            plans = self._draft(rows, self._cap(rows))
            self._verify_forward(plans)
            verdicts = self._verdicts(plans)
            forward_s = time.perf_counter() - t0
            kept = []
            for plan, verdict in zip(plans, verdicts):
                kept.append(1 + verdict.accepted)
                out.append((plan.seq, self._report(plan, verdict, forward_s)))
            self.cache.settle(kept)
        self._leave([s for s, r in out if r.finish])
        return out

    # -- the step's helpers, in the order they run --------------------------------------------
    def _admit(self) -> list[tuple[Sequence, Round]]:
        """Read joining prompts, in arrival order, while rows are free and this step's prefill
        budget (one chunk's worth of tokens) lasts: a long prompt reads one chunk per step, so
        it never stalls the running streams for more than a chunk; several short prompts join
        in one step. Chunks start where a lone run's do, so a prompt is read in the same
        forwards as alone (the same floating-point result)."""
        gone = [s for s in self.joining if s.should_stop()]  # clients that left while waiting
        out = [(s, self._cancelled_round(s)) for s in gone]
        for s in gone:
            self.joining.remove(s)
            s.finished = True
        budget = self.prefill_chunk
        while self.joining and len(self.running) < self.max_batch and budget > 0:
            seq = self.joining[0]
            body = seq.prompt[:-1]  # as a lone run reads it: chunks, then the last token alone
            if seq.own_cache is None:
                seq.own_cache, seq.prefill_started = self._start_prompt(seq, body), time.perf_counter()
            if seq.read < len(body):
                chunk = body[seq.read:seq.read + self.prefill_chunk]
                if len(chunk) > budget:
                    break  # the next step reads it
                self._forward(seq.own_cache, [chunk], [])
                mx.eval(seq.own_cache.arrays())
                seq.own_cache.settle([len(chunk)])
                seq.read += len(chunk)
                budget -= len(chunk)
                if seq.on_prefill is not None:
                    seq.on_prefill(PrefillProgress(seq.read, len(body), time.perf_counter() - seq.prefill_started))
                if seq.read < len(body):
                    break  # more chunks: one per step
                if self.prompt_cache is not None:
                    self.prompt_cache.insert(body, seq.own_cache, self.model)
            for twin in self.joining:  # the request's other choices start from this prefill
                if twin.twin_of is seq and twin.own_cache is None:
                    twin.own_cache, twin.read, twin.prefill_started = seq.own_cache.clone(self.model), seq.read, seq.prefill_started
            self.joining.popleft()
            out.append((seq, self._first_token(seq)))
            budget -= 1
        return out

    def _start_prompt(self, seq: Sequence, body: list[int]) -> BatchCache:
        """A joining sequence's own cache: what the prompt cache holds of its prompt, or empty."""
        if self.prompt_cache is not None and body:
            cache, seq.read = self.prompt_cache.fetch(body, self.model)
            if cache is not None:
                return cache
        return self.new_cache(1)

    def _first_token(self, seq: Sequence) -> Round:
        """The prompt's last token through the target: the first token; then the sequence
        joins the batch (its cache rows appended below the running ones)."""
        run = seq.run
        logits, hidden = self._forward(seq.own_cache, [seq.prompt[-1:]], [seq])
        step = Step(0, EMPTY, 0.0, token=mxs.pick(logits[0, -1:], run.ctx.sampling, seq.next_key()))
        seq.own_cache.settle([1])
        verdict = settle(run, step)
        tokens, finish = run.out.clip(verdict)
        run.ctx.tokens = run.ctx.tokens + tokens
        run.ctx.hidden = hidden[0, -1] if hidden is not None else None
        if run.proposer is not None:
            try:
                run.proposer.start(run.ctx)
            except Exception as e:  # graceful degradation, for this sequence only
                run.stop_speculating(e)
        step.verify_s = step.wall_s = time.perf_counter() - seq.prefill_started
        if finish is None and seq.should_stop():
            finish = "cancelled"
        rnd = round_of(run, step, verdict, tokens, finish, prefill=True)
        if not rnd.finish:
            if self.cache is None:
                self.cache = seq.own_cache
            else:
                self.cache.append_rows(seq.own_cache)
            self.running.append(seq)
        seq.own_cache = None
        return rnd

    def _cap(self, rows: list[Sequence]) -> int:
        """The batch-aware controller's cap on drafts per row for this step."""
        if self.budget is None:
            return MAX_STEPS
        drafting = lambda s: s.run.proposer is not None and s.run.schedule.enabled  # noqa: E731
        return self.budget.choose([row_odds(s.accepted, s.rejections, s.asked, s.offered) if drafting(s) else None
                                   for s in rows])

    def _draft(self, rows: list[Sequence], cap: int = MAX_STEPS) -> list[RowStep]:
        """Each row's k (its schedule's, within the controller's cap) and drafts: rows of a
        shared draft model or MTP drafter draft together, the others with their own proposer.
        A failing drafter stops speculation for its sequence(s) only."""
        steps = [self._steps(s, cap) for s in rows]
        drafts: dict[int, Draft] = {}
        t0 = time.perf_counter()
        for drafter in self.drafters.values():
            asks = [(s.run.proposer, k, s.next_key()) for s, k in zip(rows, steps)
                    if k and isinstance(s.run.proposer, DraftRow) and s.run.proposer.drafter is drafter]
            if asks:
                drafts |= self._draft_together(drafter, asks, rows)
        for mtp in self.mtps.values():
            asks = [(b, s, k) for b, (s, k) in enumerate(zip(rows, steps))
                    if k and isinstance(s.run.proposer, MTPRow) and s.run.proposer.drafter is mtp]
            if asks:
                drafts |= self._mtp_together(mtp, asks)
        shared_s = time.perf_counter() - t0
        plans = []
        for seq, k in zip(rows, steps):
            t1 = time.perf_counter()
            if seq.id not in drafts and not seq.run.schedule.enabled:
                k = 0  # its shared drafter failed above: plain from here, and its note says why
            draft = drafts[seq.id] if seq.id in drafts else (self._propose(seq.run, k) if k else EMPTY)
            if draft.size:
                mx.eval(draft.tokens)
            spent = shared_s if seq.id in drafts else time.perf_counter() - t1
            plans.append(RowStep(seq, Step(k, draft, spent), seq.run.ctx.sampling))
        return plans

    def _steps(self, seq: Sequence, cap: int) -> int:
        run = seq.run
        if run.proposer is None or not run.schedule.enabled:
            return 0
        asked = run.schedule.next_steps(run.remaining)
        # A seeded sampled request keeps its k: its draws depend on the drafts offered, and the
        # cap on this machine's timings, so capping it would make its seed unrepeatable.
        sampling = run.ctx.sampling
        steps = asked if (not sampling.greedy and sampling.seed is not None) else min(asked, cap)
        if steps < asked and cap != seq.capped_at:  # said once per change of the cap
            run.out.say(f"batch of {self.size}: drafts capped at {cap} per round "
                        "(this machine's measured step costs)")
            seq.capped_at = cap
        return steps

    def _draft_together(self, drafter: BatchDrafter, asks: list, rows: list[Sequence]) -> dict[int, Draft]:
        by_row = {id(s.run.proposer): s for s in rows if s.run.proposer is not None}
        try:
            return {by_row[id(row)].id: d for (row, _, _), d in zip(asks, drafter.propose(asks))}
        except Exception as e:  # graceful degradation for every sequence of this draft model
            for row, _, _ in asks:
                seq = by_row[id(row)]
                seq.run.stop_speculating(e)
                row.leave()
            return {}

    def _mtp_together(self, mtp: BatchMTP, asks: list) -> dict[int, Draft]:
        """asks: (row index, sequence, k) of every row drafting with this MTP drafter."""
        try:
            drafts = mtp.propose(self.cache, [(b, s.run.ctx, k, s.next_key()) for b, s, k in asks])
            return {s.id: d for (_, s, _), d in zip(asks, drafts)}
        except Exception as e:  # graceful degradation for every sequence of this drafter
            for _, seq, _ in asks:
                seq.run.stop_speculating(e)
            return {}

    def _propose(self, run: Run, steps: int) -> Draft:
        try:
            return run.proposer.propose(run.ctx, steps)
        except Exception as e:
            run.stop_speculating(e)
            return EMPTY

    def _verify_forward(self, plans: list[RowStep]) -> None:
        """One target forward over every row's [pending token, drafts], right-padded to the
        longest row; each row's verify results from its own slice, evaluated together."""
        rows = [[s.seq.run.ctx.tokens[-1], *s.step.draft.tokens.tolist()] for s in plans]
        t0 = time.perf_counter()
        logits, hidden = self._forward(self.cache, rows, [p.seq for p in plans])
        outputs = verify_rows(logits, plans, [p.seq.next_key() for p in plans])
        if hidden is not None:
            for b, plan in enumerate(plans):
                plan.hidden = hidden[b] if plan.seq.run.needs_hidden else None
            outputs.append(hidden)
        mx.eval(outputs)
        if self.budget is not None:
            self.budget.observe(len(rows), max(len(r) for r in rows), time.perf_counter() - t0)

    def new_cache(self, rows: int) -> BatchCache:
        """A cache for `rows` sequences. (Tensor parallel, engines/distributed, overrides it and
        _forward: its caches and forwards are mirrored on every rank.)"""
        return BatchCache(self.model, rows)

    def _forward(self, cache: BatchCache, rows: list[list[int]],
                 seqs: list[Sequence]) -> tuple[mx.array, mx.array | None]:
        """The target over ragged rows (right-padded with each row's last input; the padding's
        slots die at settle): logits [B, width, V], and the final hidden states [B, width, D]
        when one of `seqs` drafts with MTP (which reads them), else None."""
        width = max(len(r) for r in rows)
        padded = mx.array([r + [r[-1]] * (width - len(r)) for r in rows], dtype=mx.uint32)
        cache.begin(width)
        reader = next((s.run.proposer for s in seqs if s.run.needs_hidden), None)
        if reader is not None:
            return reader.target_forward(padded, cache.layers)
        return self.model(padded, cache=cache.layers), None

    def _verdicts(self, plans: list[RowStep]) -> list[Verdict]:
        """Each row's own verdict: its accepted drafts plus one target token."""
        return [settle_row(p) for p in plans]

    def _report(self, plan: RowStep, verdict: Verdict, forward_s: float) -> Round:
        """The row's Round, by the lone run's own helpers (clip, commit, detokenize, stops)."""
        seq, run, step = plan.seq, plan.seq.run, plan.step
        now = time.perf_counter()
        step.verify_s = forward_s
        step.wall_s, run.last_settled = now - (run.last_settled or run.out.started), now
        tokens, finish = run.out.clip(verdict)
        run.ctx.tokens = run.ctx.tokens + tokens
        if plan.hidden is not None:  # MTP: the hidden state that produced the row's new token
            run.ctx.hidden = plan.hidden[verdict.accepted]
        # the row's round as its request waits for it, settle to settle, drafting apart: what
        # --steps auto prices a round of this k at in a batch of this size (as a lone run does)
        run.schedule.record(step.k, verdict.accepted, step.wall_s - step.draft_s, step.draft_s, asked=step.steps)
        seq.accepted += verdict.accepted
        seq.rejections += 1 if verdict.accepted < step.k else 0
        seq.asked += 1 if step.steps else 0
        seq.offered += 1 if step.k else 0
        if run.proposer is not None and run.schedule.enabled and not finish:
            try:
                run.proposer.commit(run.ctx)
            except Exception as e:
                run.stop_speculating(e)
        if finish is None and seq.should_stop():
            finish = "cancelled"
        return round_of(run, step, verdict, tokens, finish)

    def _cancelled_round(self, seq: Sequence) -> Round:
        return seq.run.out.stopped("cancelled")

    def _leave(self, done: list[Sequence]) -> None:
        """Finished, cancelled and disconnected sequences leave; their rows are freed now."""
        for seq in done:
            seq.finished = True
            if isinstance(seq.run.proposer, DraftRow):
                seq.run.proposer.leave()
        keep = [b for b, s in enumerate(self.running) if not s.finished]
        if len(keep) == len(self.running):
            if self.cache is not None:
                self.cache.compact_if_sparse(min_slots=self.compact_min_slots)
            return
        self.running = [self.running[b] for b in keep]
        if self.running:
            self.cache.select(keep)
        else:
            self.cache = None

    # -- a batch of one -------------------------------------------------------------------------
    def generate(self, request: Request, should_stop: ShouldStop | None = None, *,
                 on_prefill: OnPrefill | None = None) -> Iterator[Round]:
        """A lone request through the batch loop (the Engine protocol)."""
        seq = self.submit(request, should_stop, on_prefill)
        while not seq.finished and self.busy:
            for s, rnd in self.step():
                if s is seq:
                    yield rnd
                    if rnd.finish:
                        seq.finished = True


# -- per-row verification (pure: the batch T>0 tests drive these directly) ---------------------
def verify_rows(logits: mx.array, plans: list[RowStep], keys: list[mx.array | None]) -> list[mx.array]:
    """Each row's verify results from its own slice logits[b, :k_b + 1], lazily: the argmax at
    T=0; at T>0 rejection sampling (or a plain sample) on that row's own key, so no row's
    draws depend on another's. Returns the arrays to evaluate."""
    outputs = []
    for b, (plan, key) in enumerate(zip(plans, keys)):
        k, sampling = plan.step.k, plan.sampling
        row = logits[b, : k + 1]
        if sampling.greedy:
            plan.argmax = mx.argmax(row, axis=-1)
            outputs.append(plan.argmax)
        elif k:
            p = mxs.target_probs(row, sampling)
            plan.sampled = mxs.rejection_verify(p, plan.step.draft.q, plan.step.draft.tokens, key)
            outputs += [plan.sampled.accept, plan.sampled.residual, plan.sampled.bonus]
        else:
            plan.token = mxs.pick(row, sampling, key)
            outputs.append(plan.token)
    return outputs


def settle_row(plan: RowStep) -> Verdict:
    """The row's accepted drafts plus one target token, from its evaluated results."""
    drafts = plan.step.draft.tokens.tolist() if plan.step.k else []
    if plan.sampled is not None:
        s = plan.sampled
        return verify_sampled(drafts, s.accept.tolist(), s.residual.tolist(), s.bonus.item())
    return verify_greedy(drafts, (plan.argmax if plan.argmax is not None else plan.token).tolist())
