"""Many chat sequences, one target forward per step: continuous batching with per-sequence
speculation, over an mlx-lm target. The round loop and what one step does are
engines/speculative/loop.py's (`RowBatch.step`); this module is its chat side, each hook's
docstring saying how. A lone request is a batch of one (`generate`).

What is chat's own:
- prompts join within a prefill budget of one chunk's tokens per step (`_admit` says why);
- drafters the batch's rows share (`_proposer`: drafter.py, mtp.py), the batch-aware
  controller's cap on k (`_cap`, controller.py), the slot table each row rolls back in
  (`_settle`, cache.py);
- the next step is launched on this step's verdicts still in the graph, before they are read,
  so the device never waits for the host's verdicts, Rounds and text: when every row drafts
  with an MTP drafter (`_launch_ahead`), or on a GPU when every row decodes plainly
  (`_plain_ahead`, as mlx-lm's generate_step does); never with a sequence waiting to join.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import mlx.core as mx

from engines.types import EngineError, OnPrefill, PrefillProgress, Request, ShouldStop
from engines.batch.cache import BatchCache, check_batchable
from engines.batch.controller import DraftBudget, row_odds
from engines.batch.drafter import BatchDrafter
from engines.batch.mtp import BatchMTP
from engines.batch.prompt_cache import PromptCache
from engines.mlx_chat import sampling as mxs
from engines.mlx_chat.engine import ChatEngine
from engines.mlx_chat.loading import TokenizerMismatch
from engines.mlx_chat.mtp import mtp_drafter
from engines.mlx_chat.prefill import PREFILL_CHUNK
from engines.mlx_chat.proposers import LazyVerdict, extend_draft, mx_tokens
from engines.speculative.composed import ComposedGroup, ComposedProposer, DraftingCosts
from engines.speculative.ngram import NGramProposer
from engines.speculative.proposer import Draft, DraftGroup
from engines.speculative.rounds import Round
from engines.speculative.schedule import MAX_STEPS
from engines.speculative.sequence import Sequence
from engines.speculative.sequence import Step as BaseStep
from engines.speculative.loop import RowBatch
from engines.speculative.verify import Verdict, verify_greedy, verify_sampled

NO_DRAFTS = Draft(mx.array([], dtype=mx.uint32))  # a plain row's: the graph reads its drafts as an array


@dataclass
class Step(BaseStep):
    """A row's part of one launched forward, with the lazy results of its verify."""

    argmax: mx.array | None = None  # [k+1] at T=0
    sampled: mxs.SampledVerdict | None = None  # T>0 with drafts
    token: mx.array | None = None  # [1] T>0 plain sample
    slots_settled: bool = False  # a plain step's slots, kept whatever its tokens (settled at launch)

    @property
    def next_token(self) -> mx.array:
        """The target's own token after the last input, lazily (plain steps only)."""
        return self.argmax[-1:] if self.argmax is not None else self.token


@dataclass(eq=False)
class Joining:
    """A sequence waiting for a row: how much of its prompt is read, into a cache of its own."""

    seq: Sequence
    on_prefill: OnPrefill | None = None
    read: int = 0  # prompt tokens read so far (all but the last go through prefill chunks)
    own_cache: BatchCache | None = None  # its one-row cache while it reads its prompt
    started: float = 0.0
    twin_of: Sequence | None = None  # another choice of the same request: its prefill is shared

    @property
    def prompt(self) -> list[int]:
        return self.seq.ctx.tokens


def next_key(seq: Sequence) -> mx.array | None:
    """T>0: this step's subkey of the sequence's own RNG (so no row's draws depend on another's)."""
    if seq.key is None:
        return None
    seq.key, sub = mx.random.split(seq.key)
    return sub


@dataclass
class BatchEngine(RowBatch):
    """Continuous batching over a loaded ChatEngine's target (its model, tokenizer, drafters)."""

    chat: ChatEngine
    prefill_chunk: int = PREFILL_CHUNK
    cache: BatchCache | None = None
    compact_min_slots: int = 64  # compact a table once this many columns are dead in every row
    budget: DraftBudget | None = field(default_factory=DraftBudget)  # None: rows draft what they ask
    drafters: dict[str, BatchDrafter] = field(default_factory=dict)  # draft model path -> its batch
    mtps: dict[str, tuple] = field(default_factory=dict)  # MTP drafter path -> (its maker, its batch)
    composed: dict[tuple, tuple] = field(default_factory=dict)  # (method, path) -> (ComposedGroup, DraftingCosts)
    prompt_cache: PromptCache | None = None  # prompts read before (None: every prompt is read)
    # --steps auto, a batch of one: (method, drafter, ...) -> (StepCosts of whole rounds,
    # PositionAcceptance, Probes, Rounds) over the requests so far
    auto_seen: dict[tuple, tuple] = field(default_factory=dict)
    # plain steps launch the next forward before reading their tokens, as mlx-lm's stream_generate
    # does: the host builds the next graph while the device runs this one. On MLX's CPU backend,
    # where the "device" is the host's own cores, it still pays on a small op-bound model (a small
    # Gemma 4: +2-11% pass by pass on three CPU families) and leaves a BLAS-bound one alike (SmolLM2:
    # -7% to +5% pass by pass, medians -3% to +2%); bench/chat_plain_vs_mlx_lm.py --after measures
    # both. On Metal: unchecked.
    launches_ahead: bool = True
    # MTP rows launch the next step on this one's verdicts still in the graph (the chat engine's
    # mtp_options.ahead turns it off for A/B runs): bench/chat_batch_of_one.py measures it
    verifies_ahead: bool = True
    steps_run: int = 0

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

    # -- entering -----------------------------------------------------------------------------
    def submit(self, request: Request, should_stop: ShouldStop | None = None, *,
               on_prefill: OnPrefill | None = None, twin_of: Sequence | None = None) -> Sequence:
        """Check the request (an invalid one never enters the batch: EngineError) and queue
        it to read its prompt as soon as a row is free. `twin_of`: a sequence queued before
        with the same prompt (another of a request's n choices): this one copies its prefill."""
        seq = self.chat.sequence(request, should_stop, self._proposer)
        self.auto_from_earlier_requests(seq, self.auto_seen, request.spec.draft_model or self.chat.draft_path or "")
        seq.id = next(self._ids)
        seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(63)
        seq.key = None if request.sampling.greedy else mx.random.key(seed)
        joining = Joining(seq, on_prefill)
        waiting = {j.seq: j for j in self.joining}
        if twin_of in waiting and waiting[twin_of].prompt == joining.prompt:
            joining.twin_of = twin_of
        self.joining.append(joining)
        return seq

    def _proposer(self, request: Request):
        """A row's proposer: n-gram lookup its own; a draft model's or an MTP drafter's row in
        that drafter's batch (its rows draft together); composed (--with-ngram), the model
        drafter's row beside the row's own n-gram lookup, its rows' chains drafted together
        (ComposedGroup). Or plain decoding and the reason."""
        spec = request.spec
        if not spec.enabled:
            return None, None
        if spec.method == "ngram":
            return NGramProposer(spec.ngram_min, spec.ngram_max), None
        path = spec.draft_model or self.chat.draft_path
        try:  # (validation allows ngram, draft and mtp only)
            group = self._draft_group(path) if spec.method == "draft" else self._mtp_group(request, path)
        except TokenizerMismatch:
            raise  # a wrong draft model is the user's to fix, not to paper over
        except EngineError as e:
            return None, f"speculation unavailable: {e}"
        if not spec.compose_ngram:
            return group.row(), None
        # each drafter's composed rows: one group (their chains together), one cost book
        if (spec.method, path) not in self.composed or self.composed[spec.method, path][0].model_group is not group:
            self.composed[spec.method, path] = ComposedGroup(group), DraftingCosts()
        composed, costs = self.composed[spec.method, path]
        return ComposedProposer(group.row(), NGramProposer(spec.ngram_min, spec.ngram_max), costs,
                                extend=extend_draft, group=composed), None

    def _draft_group(self, path: str | None) -> BatchDrafter:
        """One draft model drafts for all its rows at once."""
        if not path:
            raise EngineError("spec method 'draft' needs a draft model (--draft-model PATH)")
        if path not in self.drafters:
            self.drafters[path] = BatchDrafter(self.chat.draft_model(path).model)
        return self.drafters[path]

    def _mtp_group(self, request: Request, path: str | None) -> BatchMTP:
        """One MTP drafter drafts for all its rows at once; remade when the drafter, its step
        (compiled or not) or the group's maker changed. `chat.mtp_group` (a maker with
        BatchMTP's signature) lets the tests and benchmarks replay a drafter of their own."""
        source = mtp_drafter(self.chat, request)  # loads and checks the drafter
        make = self.chat.__dict__.get("mtp_group", BatchMTP)
        held = self.mtps.get(path)
        if held is None or held[0] is not make or not held[1].made_from(source):
            self.mtps[path] = make, make(source.drafter, source.target, source.step)
        return self.mtps[path][1]

    # -- the loop's hooks (engines/speculative/loop.py), in the order a step runs them ---------
    def _launch(self, rows: list[Sequence]) -> tuple[list[Sequence], list[Step]]:
        """This step's drafts and forward -- or the step launched ahead on the last one's
        verdicts -- and, where it can be, the next step launched before this one's verdicts
        are read: every row plain (as mlx-lm's generate_step), or every row an MTP row
        (its chain drafted from its lazy verdict)."""
        steps, self.ahead = self.ahead, None
        if steps is None:
            steps = self._draft(rows, self._cap(rows))
            self._verify_forward(rows, steps)
        else:
            rows = rows[:len(steps)]  # rows that joined this step decode from the next
        if len(rows) == len(self.running) and self._plain_ahead(rows, steps):
            self.ahead = [Step(0, NO_DRAFTS) for _ in rows]
            inputs = mx.concatenate([step.next_token.astype(mx.uint32) for step in steps])[:, None]
            self._verify_forward(rows, self.ahead, inputs)
        elif len(rows) == len(self.running) and self._verifies_ahead(rows, steps):
            self.ahead = self._launch_ahead(rows, steps)
        return rows, steps

    def _verdicts(self, rows: list[Sequence], steps: list[Step]) -> list[Verdict]:
        """Each row's own verdict, read from its evaluated results."""
        return [settle_row(step) for step in steps]

    def _settle(self, steps: list[Step], verdicts: list[Verdict]) -> None:
        """Each row's rejected drafts and padding die in the slot table (a plain step's slots
        were settled at launch); a table compacts once sparse. MLX's buffer cache is cleared
        every 256 steps, as mlx-lm's generate_step does every 256 tokens."""
        if not steps[0].slots_settled:
            self.cache.settle([1 + v.accepted for v in verdicts])
        self.cache.compact_if_sparse(min_slots=self.compact_min_slots)
        self.steps_run += 1
        if self.steps_run % 256 == 0:
            mx.clear_cache()

    def _select(self, keep: list[int]) -> None:
        """The rows that stay, in the cache; the part of a step launched ahead of those that
        left is dropped (all of it, if its slots are not in the table yet)."""
        if self.ahead and not self.ahead[0].slots_settled:
            self.ahead = None
            self.cache.abandon()
        if self.ahead:  # (rows that joined since it launched come after its rows)
            self.ahead = [self.ahead[b] for b in keep if b < len(self.ahead)] or None
        if self.running:
            self.cache.select(keep)
        else:
            self.cache = None

    # -- the step's helpers, in the order they run --------------------------------------------
    def _admit(self) -> list[tuple[Sequence, Round]]:
        """Read joining prompts, in arrival order, while rows are free and this step's prefill
        budget (one chunk's worth of tokens) lasts: a long prompt reads one chunk per step, so
        it never stalls the running streams for more than a chunk; several short prompts join
        in one step. Chunks start where a lone run's do, so a prompt is read in the same
        forwards as alone (the same floating-point result)."""
        if not self.joining:
            return []
        gone = [j for j in self.joining if j.seq.should_stop()]  # clients that left while waiting
        out = [(j.seq, j.seq.out.stopped("cancelled", prefill=True)) for j in gone]
        for j in gone:
            self.joining.remove(j)
            j.seq.finished = True
        budget = self.prefill_chunk
        if self.ahead is not None and not self.ahead[0].slots_settled:
            budget = 0  # rows join between forwards: after the step launched ahead is read
        while self.joining and len(self.running) < self.max_batch and budget > 0:
            joining = self.joining[0]
            body = joining.prompt[:-1]  # as a lone run reads it: chunks, then the last token alone
            if joining.own_cache is None:
                joining.own_cache, joining.started = self._start_prompt(joining, body), time.perf_counter()
            if joining.read < len(body):
                chunk = body[joining.read:joining.read + self.prefill_chunk]
                if len(chunk) > budget:
                    break  # the next step reads it
                self._forward(joining.own_cache, [chunk], [])
                mx.eval(joining.own_cache.arrays())
                joining.own_cache.settle([len(chunk)])
                joining.read += len(chunk)
                budget -= len(chunk)
                if joining.on_prefill is not None:
                    joining.on_prefill(PrefillProgress(joining.read, len(body), time.perf_counter() - joining.started))
                if joining.read < len(body):
                    break  # more chunks: one per step
                if self.prompt_cache is not None:
                    self.prompt_cache.insert(body, joining.own_cache, self.model)
            for twin in self.joining:  # the request's other choices start from this prefill
                if twin.twin_of is joining.seq and twin.own_cache is None:
                    twin.own_cache, twin.read, twin.started = (joining.own_cache.clone(self.model), joining.read,
                                                               joining.started)
            self.joining.popleft()
            out.append((joining.seq, self._first_token(joining)))
            budget -= 1
        return out

    def _start_prompt(self, joining: Joining, body: list[int]) -> BatchCache:
        """A joining sequence's own cache: what the prompt cache holds of its prompt, or empty."""
        if self.prompt_cache is not None and body:
            cache, joining.read = self.prompt_cache.fetch(body, self.model)
            if cache is not None:
                return cache
        return self.new_cache(1)

    def _first_token(self, joining: Joining) -> Round:
        """The prompt's last token through the target: the first token; then the sequence
        joins the batch (its cache rows appended below the running ones)."""
        seq = joining.seq
        logits, hidden = self._forward(joining.own_cache, [joining.prompt[-1:]], [seq])
        step = Step(0, token=mxs.pick(logits[0, -1:], seq.ctx.sampling, next_key(seq)))
        joining.own_cache.settle([1])
        verdict = settle_row(step)
        seq.settled(step)
        tokens, finish = seq.start(verdict, hidden[0, -1] if hidden is not None else None)
        step.verify_s = step.wall_s = time.perf_counter() - joining.started
        rnd = seq.report(step, verdict, tokens, finish, prefill=True)
        if not rnd.finish:
            if self.cache is None:
                self.cache = joining.own_cache
            else:
                self.cache.append_rows(joining.own_cache)
            self.running.append(seq)
        joining.own_cache = None
        return rnd

    def _cap(self, rows: list[Sequence]) -> int:
        """The batch-aware controller's cap on drafts per row for this step."""
        if self.budget is None:
            return MAX_STEPS
        return self.budget.choose([row_odds(s.accepted, s.rejections, s.asked, s.offered) if s.drafting else None
                                   for s in rows])

    def _draft(self, rows: list[Sequence], cap: int = MAX_STEPS) -> list[Step]:
        """Each row's k (its schedule's, within the controller's cap) and drafts (RowBatch.drafts),
        evaluated before the verify is built on them."""
        drafted = self.drafts(rows, [self._steps(seq, cap) for seq in rows], self.cache, key=next_key)
        mx.eval([d.tokens for _, d, _ in drafted if d.size and not isinstance(d.tokens, list)])
        return [Step(k, d, spent, expected=seq.expected()) for seq, (k, d, spent) in zip(rows, drafted)]

    def _steps(self, seq: Sequence, cap: int, remaining: int | None = None) -> int:
        asked = seq.next_steps(remaining)
        # A seeded sampled request keeps its k: its draws depend on the drafts offered, and the
        # cap on this machine's timings, so capping it would make its seed unrepeatable.
        sampling = seq.ctx.sampling
        steps = asked if (not sampling.greedy and sampling.seed is not None) else min(asked, cap)
        if steps < asked and cap != seq.cap_said:  # said once per change of the cap
            seq.out.say(f"batch of {self.size}: drafts capped at {cap} per round "
                        "(this machine's measured step costs)")
            seq.cap_said = cap
        return steps

    def _plain_ahead(self, rows: list[Sequence], steps: list[Step]) -> bool:
        """Whether the next step can be launched now, on this one's tokens still in the graph:
        every row plain this step and the next (no drafter, or speculation stopped), with
        tokens left past this step's, and nobody waiting to join."""
        return (self.launches_ahead and not self.joining and steps[0].slots_settled  # (none in flight behind it)
                and all(step.k == 0 and not seq.drafting and seq.remaining > 1 for seq, step in zip(rows, steps)))

    def _verify_forward(self, rows: list[Sequence], steps: list[Step], ahead: mx.array | None = None) -> None:
        """One target forward over every row's [pending token, drafts], right-padded to the
        longest row; each row's verify results (and, for an MTP row, the final hidden states it
        chains from) from its own slice, evaluated here -- or, `ahead` (the rows' inputs still in
        the graph: a step launched before the last one's verdict is read), asynchronously: read
        by _verdicts. A plain step's rows each keep their one token, whatever it turns out to
        be, so its slots are settled at launch (unless the last step's are still deferred)."""
        inputs = ahead if ahead is not None else [[seq.ctx.tokens[-1], *step.draft.ids()]
                                                  for seq, step in zip(rows, steps)]
        t0 = time.perf_counter()
        logits, hidden = self._forward(self.cache, inputs, rows)
        outputs = verify_rows(logits, steps, [seq.ctx.sampling for seq in rows], [next_key(s) for s in rows])
        if hidden is not None:
            for b, (seq, step) in enumerate(zip(rows, steps)):
                step.hidden = hidden[b] if seq.needs_hidden else None
            outputs.append(hidden)
        if all(step.k == 0 for step in steps) and not self.cache.deferred:
            self.cache.settle([1] * len(rows))
            for step in steps:
                step.slots_settled = True
        if ahead is not None:
            mx.async_eval(outputs)
            return
        mx.eval(outputs)
        if self.budget is not None:
            self.budget.observe(len(inputs), max(len(r) for r in inputs), time.perf_counter() - t0)

    def _verifies_ahead(self, rows: list[Sequence], steps: list[Step]) -> bool:
        """Whether the next step can be launched now, before this one's verdicts are read:
        every row's drafts this step came from a drafter that can chain on a verdict still in
        the graph (MTP), with tokens left past the most this step can emit, and nobody waiting
        to join."""
        return (self.verifies_ahead and self.chat.mtp_options.ahead and not self.joining
                and all(step.k and seq.drafting and seq.remaining > step.k + 1
                        and hasattr(getattr(seq.proposer, "group", None), "propose_after")
                        for seq, step in zip(rows, steps)))

    def _launch_ahead(self, rows: list[Sequence], steps: list[Step]) -> list[Step]:
        """The next step, launched on this one's verdicts still in the graph: each row's k
        chosen now (past the most this step can emit), its chain drafted from its lazy verdict
        -- the token after its accepted drafts, the hidden state there, the position after it
        -- and the verify queued behind it; this step's kept counts deferred in the slot table."""
        verdicts = [lazy_verdict(seq, step) for seq, step in zip(rows, steps)]
        self.cache.defer(mx.stack([1 + v.accepted for v in verdicts]))
        cap = self._cap(rows)
        groups: dict[int, tuple[DraftGroup, list, list]] = {}
        for b, (seq, step, verdict) in enumerate(zip(rows, steps, verdicts)):
            k = self._steps(seq, cap, seq.remaining - step.k - 1)
            if k:
                group = seq.proposer.group
                asks = groups.setdefault(id(group), (group, [], []))
                asks[1].append((b, seq, k, next_key(seq)))
                asks[2].append(verdict)
        t0 = time.perf_counter()
        drafts: dict[int, Draft] = {}
        for group, asks, after in groups.values():
            try:
                drafts |= {seq.id: d for (_, seq, _, _), d in zip(asks, group.propose_after(self.cache, asks, after))}
            except Exception as e:  # graceful degradation: these rows decode plainly from here
                for _, seq, _, _ in asks:
                    self.stop_speculating(seq, e)
        draft_s = time.perf_counter() - t0
        ahead = [Step(d.size, d, draft_s, launched_early=True, expected=seq.expected())
                 for seq in rows for d in [drafts.get(seq.id, NO_DRAFTS)]]
        inputs = [mx.concatenate([v.token, mx_tokens(step.draft)]) for v, step in zip(verdicts, ahead)]
        width = max(row.shape[0] for row in inputs)  # right-padded with each row's last input
        padded = [mx.concatenate([row, mx.repeat(row[-1:], width - row.shape[0])]) for row in inputs]
        self._verify_forward(rows, ahead, mx.stack(padded))
        return ahead

    def new_cache(self, rows: int) -> BatchCache:
        """A cache for `rows` sequences. (Tensor parallel, engines/distributed, overrides it and
        _forward: its caches and forwards are mirrored on every rank.)"""
        return BatchCache(self.model, rows)

    def _forward(self, cache: BatchCache, rows: list[list[int]] | mx.array,
                 seqs: list[Sequence]) -> tuple[mx.array, mx.array | None]:
        """The target over ragged rows (right-padded with each row's last input; the padding's
        slots die at settle), or over [B, W] tokens still in the graph: logits [B, width, V],
        and the final hidden states [B, width, D] when one of `seqs` drafts with MTP (which
        reads them), else None."""
        if isinstance(rows, mx.array):
            padded = rows
        else:
            width = max(len(r) for r in rows)
            padded = mx.array([r + [r[-1]] * (width - len(r)) for r in rows], dtype=mx.uint32)
        cache.begin(padded.shape[1])
        reader = next((s.proposer for s in seqs if s.needs_hidden), None)
        if reader is not None:
            return reader.target_forward(padded, cache.layers)
        return self.model(padded, cache=cache.layers), None


def batch_of_one(chat: ChatEngine) -> BatchEngine:
    """The loop a lone request runs through (ChatEngine.loop): the batch's, one row, drafting
    what the request asks. UnbatchableModel for a model whose caches the batch cannot hold."""
    return BatchEngine(chat, max_batch=1, budget=None)


# -- per-row verification (pure: the batch T>0 tests drive these directly) ---------------------
def verify_rows(logits: mx.array, steps: list[Step], samplings: list, keys: list[mx.array | None]) -> list[mx.array]:
    """Each row's verify results from its own slice logits[b, :k_b + 1], lazily: the argmax at
    T=0; at T>0 rejection sampling (or a plain sample) on that row's own key, so no row's
    draws depend on another's. Returns the arrays to evaluate."""
    outputs = []
    for b, (step, sampling, key) in enumerate(zip(steps, samplings, keys)):
        k = step.k
        row = logits[b, : k + 1]
        if sampling.greedy:
            step.argmax = mx.argmax(row, axis=-1)
            outputs.append(step.argmax)
        elif k:
            p = mxs.target_probs(row, sampling)
            step.sampled = mxs.rejection_verify(p, step.draft.q, mx_tokens(step.draft), key)
            outputs += [step.sampled.accept, step.sampled.residual, step.sampled.bonus]
        else:
            step.token = mxs.pick(row, sampling, key)
            outputs.append(step.token)
    return outputs


def lazy_verdict(seq: Sequence, step: Step) -> LazyVerdict:
    """A launched step's verdict for its row, still in the graph: its accepted count, the token
    after them, the hidden state that produced it, from the row's position."""
    accepted, token = mxs.verdict_in_graph(mx_tokens(step.draft), step.argmax, step.sampled, step.token)
    hidden = mx.take(step.hidden, accepted, axis=0) if step.hidden is not None else None
    return LazyVerdict(seq.ctx.position, mx_tokens(step.draft), accepted, token, hidden)


def settle_row(step: Step) -> Verdict:
    """The row's accepted drafts plus one target token, from its evaluated results."""
    drafts = step.draft.ids() if step.k else []
    if step.sampled is not None:
        s = step.sampled
        return verify_sampled(drafts, s.accept.tolist(), s.residual.tolist(), s.bonus.item())
    return verify_greedy(drafts, (step.argmax if step.argmax is not None else step.token).tolist())
