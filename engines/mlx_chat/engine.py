"""The chat engine: an mlx-lm target, a proposer, and THE round loop (`ChatEngine.generate`).

One round = one target forward:

    launch   the schedule picks k; the proposer drafts k tokens (propose);
             the target reads [last token, drafts] in one forward (verify), and the per-position
             results -- argmax ids at T=0, accept flags + residual samples + bonus at T>0 --
             are computed in the graph and evaluated asynchronously. A proposer that can
             draft on a verdict still in the graph (MTP) is handed it now (anticipate), so
             the next round's drafts queue right behind this verify (depth-2 overlap).
    settle   wait for those few ints; accept the longest agreeing prefix plus one target token
             (verify_greedy / verify_sampled); clip at EOS and max_tokens.
    commit   roll the caches back over the rejected drafts; tell the proposer what was
             accepted.
    round    detokenize, hold back text that could still become a stop string (stops.py),
             build the Round -- while the next round's forward is already running (it was
             launched right after commit).

Plain decoding (spec off) is the same loop with k = 0, and it launches the next forward on the
still-lazy token before settling the current one, as mlx-lm's generate_step does, so the
device never waits for the host. MTP on a full-attention target does the same with whole
rounds: the next round's verify is launched on this one's verdict still in the graph (its
anticipated chain, the token after the accepted drafts, the position that follows), and
nothing is rolled back -- the target's cache keeps rejected drafts as holes its masks hide
(cache.SlotKVCache). The host builds round r+1 while the device runs round r.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from engines.types import EngineError, OnPrefill, Request, ShouldStop
from engines.mlx_chat import sampling as mxs
from engines.mlx_chat.cache import (Holes, SlotKVCache, UnsupportedCache, make_rollback_cache, make_slot_cache,
                                    rollback)
from engines.mlx_chat.options import MtpOptions
from engines.mlx_chat.loading import LoadedModel, TokenizerMismatch, check_same_tokenizer, load_model
from engines.mlx_chat.prefill import feed_prompt
from engines.mlx_chat.context import check_fits, context_length
from engines.mlx_chat.proposers import DraftModelProposer, LazyVerdict, Proposer, ProposerContext, mx_tokens
from engines.speculative.ngram import NGramProposer
from engines.speculative.output import Output
from engines.speculative.proposer import Draft
from engines.speculative.rounds import Round
from engines.speculative.schedule import DraftSchedule
from engines.speculative.sequence import Sequence
from engines.speculative.sequence import Step as BaseStep
from engines.speculative.repetition import detector_for
from engines.speculative.verify import Verdict, verify_greedy, verify_sampled
from engines.validation import validate


class DetokenizerText:
    """mlx-lm's streaming detokenizer as the Output's TokenText."""

    def __init__(self, detokenizer):
        self.detokenizer = detokenizer

    def add(self, token: int) -> str:
        self.detokenizer.add_token(token)
        return self.detokenizer.last_segment

    def finish(self) -> str:
        self.detokenizer.finalize()
        return self.detokenizer.last_segment


NO_DRAFTS = Draft(mx.array([], dtype=mx.uint32))  # a plain round's: the graph reads its drafts as an array


def holes(seq: Sequence) -> Holes | None:
    """The slot caches' holes when rounds launch before the last verdict is read, else None."""
    cache = seq.ctx.target_cache
    return cache[0].holes if cache and isinstance(cache[0], SlotKVCache) else None


@dataclass
class Step(BaseStep):
    """A launched round with the lazy results of its verify forward."""

    argmax: mx.array | None = None  # [k+1] at T=0
    sampled: mxs.SampledVerdict | None = None  # T>0 with drafts
    token: mx.array | None = None  # [1] T>0 plain sample
    hidden: mx.array | None = None  # [k+1, D] when the proposer needs it
    lazy: LazyVerdict | None = None  # its verdict in the graph, when a chain or the next round builds on it
    slots_settled: bool = False  # the batch: a plain step's slots, kept whatever its tokens (settled at launch)

    @property
    def next_token(self) -> mx.array:
        """The target's own token after the last input, lazily (plain rounds only)."""
        return self.argmax[-1:] if self.argmax is not None else self.token


@dataclass
class ChatEngine:
    target: LoadedModel
    draft_path: str | None = None
    mtp_options: MtpOptions = field(default_factory=MtpOptions)
    # The loop `generate` runs a request through: the batch's, as a batch of one (engines.factory
    # sets it: engines/batch/engine.py `batch_of_one`); None -- a model the batch cannot hold, or
    # an engine made without the factory -- this module's own loop below.
    loop: Any = None
    _drafts: dict[str, LoadedModel] = field(default_factory=dict)
    _hash: str | None = None
    _composed_costs: dict[tuple[str, str], Any] = field(default_factory=dict)  # (method, drafter) -> DraftingCosts
    _auto_seen: dict[tuple, tuple[Any, Any, Any, Any]] = field(default_factory=dict)  # --steps auto: (method,
    # drafter, ...) -> (StepCosts of whole rounds, PositionAcceptance, Probes, Rounds) over the requests so far

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def load(cls, model_path: str, draft_model: str | None = None, mtp_options: MtpOptions | None = None,
             **_options) -> "ChatEngine":
        engine = cls(load_model(model_path), draft_path=draft_model, mtp_options=mtp_options or MtpOptions())
        if draft_model:
            from engines.mlx_chat.mtp import is_assistant_dir, preload_drafter

            if is_assistant_dir(draft_model):  # a Gemma 4 assistant is an MTP drafter, not an LM
                preload_drafter(engine, draft_model)
            else:
                engine.draft_model(draft_model)
        return engine

    @property
    def model_path(self) -> str:
        return self.target.path

    @property
    def model(self):
        return self.target.model

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def draft_model(self, path: str) -> LoadedModel:
        """Draft models are loaded once and kept; the tokenizer must be the target's."""
        if path not in self._drafts:
            draft = load_model(path)
            check_same_tokenizer(self.target, draft)
            self._drafts[path] = draft
        return self._drafts[path]

    @property
    def context_length(self) -> int | None:
        return context_length(self.model)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def count_prompt_tokens(self, request: Request) -> int:
        """The prompt's length in tokens, chat template applied (a server reports it, and
        refuses a prompt that cannot fit)."""
        return len(self.prompt_ids(request))

    def model_info(self) -> dict:
        from engines.speculative.session import model_hash

        if self._hash is None:  # hashing reads the weights: once per engine, not per run
            self._hash = model_hash(self.target.path)
        return {
            "path": self.target.path,
            "model_type": self.target.model_type,
            "hash": self._hash,
            "vocab_size": self.target.vocab_size,
            "weights": "float32 (dequantized for MLX's CPU backend)" if self.target.dequantized else "as stored",
            "draft_model": self.draft_path,
        }

    # -- THE round loop ------------------------------------------------------------------------
    def generate(self, request: Request, should_stop: ShouldStop | None = None, *,
                 on_prefill: OnPrefill | None = None) -> Iterator[Round]:
        if self.loop is not None:
            yield from self.loop.generate(request, should_stop, on_prefill=on_prefill)
            return
        seq = self.sequence(request, should_stop)
        first = self._prefill(seq, on_prefill)
        yield first
        step = None if first.finish else self._launch(seq)
        while step is not None:
            # Plain decoding: the next forward reads this one's token while it is still lazy,
            # so the device never waits for the host (as mlx-lm's generate_step does). MTP on
            # slot caches: the next round's verify reads this one's verdict while still lazy.
            plain = step.k == 0 and not seq.schedule.enabled  # (it may have just been disabled)
            if plain and seq.remaining > 1 or self._launches_before_verdict(seq, step):
                ahead = self._launch(seq, after=step)
            else:
                ahead = None
            verdict = settle(seq, step)
            if holes(seq) is None:  # slot caches: the rejected drafts are holes already (launch)
                rollback(seq.ctx.target_cache, step.k - verdict.accepted)
            hidden = step.hidden[verdict.accepted] if step.hidden is not None else None
            tokens, finish = seq.commit(step, verdict, hidden, priced=seq.priced(step, ahead))
            if finish is None and ahead is None:
                ahead = self._launch(seq)  # the next round's forward runs while this one is reported
            rnd = report(seq, step, verdict, tokens, finish)
            yield rnd
            step = None if rnd.finish else ahead

    # -- the loop's helpers, in the order they run ------------------------------------------------
    def sequence(self, request: Request, should_stop: ShouldStop | None = None, *,
                 batch_proposer: Callable[[Request], tuple[Proposer | None, str | None]] | None = None,
                 alone: bool | None = None) -> Sequence:
        """A Sequence for `request` (checked first: EngineError), with its proposer, schedule and
        the target's cache. `batch_proposer`: a row of the batch (engines/batch) -- its proposer
        is the batch's (shared drafters), its cache rows and RNG key are the batch's. `alone`
        (default: not a batch row): its rounds cost what a lone run's do, so its --steps auto
        starts from what earlier requests measured; a row of a larger batch learns from its own
        rounds only."""
        validate(request, self.context_length)
        prompt_ids = self.prompt_ids(request)
        if not prompt_ids:
            raise EngineError("empty prompt")
        check_fits(len(prompt_ids), request.max_tokens, self.context_length)  # before any forward
        lone = batch_proposer is None
        proposer, note = self._speculation(request) if lone else batch_proposer(request)
        cache = []
        if lone:
            if request.sampling.seed is not None:
                mx.random.seed(request.sampling.seed)
            try:
                cache = self._cache_for(proposer)
            except UnsupportedCache as e:  # recurrent / hybrid layers cannot roll back exactly
                proposer, note, cache = None, f"speculation unavailable: {e}", make_prompt_cache(self.model)
        schedule = DraftSchedule.of(request.spec, self.model_path) if proposer is not None else DraftSchedule(0)
        if schedule.auto is not None and (lone if alone is None else alone):
            self._auto_from_earlier_requests(schedule.auto, request)
        if schedule.auto is not None and isinstance(proposer, NGramProposer):
            proposer.auto = schedule.auto  # n-gram's acceptance from whole continuations (tuning.py)
        if schedule.auto is not None and hasattr(proposer, "chooser"):  # composed: price widths as auto does
            auto = schedule.auto
            proposer.chooser.latency = lambda width: auto.latency().at(width) if auto.ready() else 1.0
        out = self.output(request)
        for said in (note, schedule.note):
            if said:
                out.say(said)
        ctx = ProposerContext(prompt_ids, request.sampling, self.model, cache)
        return Sequence(request, ctx, proposer, schedule, out, should_stop or (lambda: False))

    def output(self, request: Request) -> Output:
        """What a run of `request` emits: its text through mlx-lm's streaming detokenizer."""
        return Output(DetokenizerText(self.tokenizer.detokenizer), set(self.tokenizer.eos_token_ids),
                      request.max_tokens, request.stop, detector_for(request.max_repeat))

    def _auto_from_earlier_requests(self, auto, request: Request) -> None:
        """--steps auto starts from what earlier requests with this drafter showed: what its
        rounds cost by width (the machine's, not the prompt's: kept as composed drafting keeps
        DraftingCosts, so only the first request pays to find them -- the fallback's rounds at the
        spec's steps, the narrow widths tried), its acceptance by position, as the prior, the
        pace of its probes one draft deeper, and (n-gram) every fixed k's rounds replayed on their
        outputs, the prior where there is no profile (engines/speculative/tuning.py)."""
        from engines.speculative.tuning import PositionAcceptance, Probes, Rounds, round_costs

        spec = request.spec
        key = (spec.method, spec.draft_model or self.draft_path or "", spec.compose_ngram, request.sampling.greedy,
               auto.max_steps)
        auto.attach(*self._auto_seen.setdefault(key, (round_costs(), PositionAcceptance(auto.max_steps), Probes(),
                                                      Rounds(auto.max_steps))))

    def _speculation(self, request: Request) -> tuple[Proposer | None, str | None]:
        """The request's proposer, or plain decoding and the reason (the first Round's note):
        a drafter that cannot be made."""
        if not request.spec.enabled:
            return None, None
        try:
            return self.make_proposer(request), None
        except TokenizerMismatch:
            raise  # a wrong draft model is the user's to fix, not to paper over
        except EngineError as e:
            return None, f"speculation unavailable: {e}"

    def _cache_for(self, proposer: Proposer | None) -> list[Any]:
        """The target's cache for a lone run: mlx-lm's own when plain; slot caches when the
        proposer can chain on a verdict still in the graph and every target layer is full
        attention -- rounds then launch before the last verdict is read (unless
        `mtp_options.pipeline` is off, for A/B runs) --, else caches that roll back
        (recurrent / hybrid layers cannot: make_rollback_cache says so, EngineError)."""
        if proposer is None:
            return make_prompt_cache(self.model)
        if getattr(proposer, "launches_ahead", False):
            slots = make_slot_cache(self.model) if self.mtp_options.pipeline else None
            if slots is not None:
                return slots
            proposer.launches_ahead = False  # each round launched after the last verdict: say so to it
        return make_rollback_cache(self.model)

    def make_proposer(self, request: Request) -> Proposer:
        proposer = self._model_or_ngram_proposer(request)
        spec = request.spec
        if spec.compose_ngram and spec.method in ("draft", "mtp"):
            from engines.mlx_chat.proposers import extend_draft
            from engines.speculative.composed import ComposedProposer

            costs = self.composed_costs(spec.method, spec.draft_model or self.draft_path or "")
            return ComposedProposer(proposer, NGramProposer(spec.ngram_min, spec.ngram_max), costs, extend=extend_draft)
        return proposer

    def composed_costs(self, method: str, drafter: str):
        """What earlier composed runs of a lone request measured of this drafter's costs (not of
        its acceptance): a verify and a chain token cost what this machine makes them cost."""
        from engines.speculative.composed import DraftingCosts

        return self._composed_costs.setdefault((method, drafter), DraftingCosts())

    def _model_or_ngram_proposer(self, request: Request) -> Proposer:
        spec = request.spec
        if spec.method == "ngram":
            return NGramProposer(spec.ngram_min, spec.ngram_max)
        if spec.method == "draft":
            path = spec.draft_model or self.draft_path
            if not path:
                raise EngineError("spec method 'draft' needs a draft model (--draft-model PATH)")
            return DraftModelProposer(self.draft_model(path).model)
        if spec.method == "mtp":
            from engines.mlx_chat.mtp import make_mtp_proposer

            return make_mtp_proposer(self, request)
        raise EngineError(f"unknown spec method {spec.method!r}")

    def prompt_ids(self, request: Request) -> list[int]:
        tok = self.tokenizer
        if request.ignore_chat_template or not getattr(tok, "has_chat_template", False):
            return list(tok.encode(request.prompt))
        messages = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages += list(request.history)
        messages.append({"role": "user", "content": request.prompt})
        return list(tok.apply_chat_template(messages, add_generation_prompt=True))

    def _forward(self, seq: Sequence, inputs: mx.array) -> tuple[mx.array, mx.array | None]:
        """One target forward over `inputs` [n]: logits [n, V] and, if the proposer reads
        them (MTP), the final hidden states [n, D]."""
        if seq.needs_hidden:
            logits, hidden = seq.proposer.target_forward(inputs[None], seq.ctx.target_cache)
            return logits[0], hidden[0]
        return self.model(inputs[None], cache=seq.ctx.target_cache)[0], None

    def _prefill(self, seq: Sequence, on_prefill: OnPrefill | None) -> Round:
        """The prompt through the target; the first token (a Round with no drafts)."""
        t0 = time.perf_counter()
        prompt = mx.array(seq.ctx.tokens, dtype=mx.uint32)
        # all but the last prompt token, in chunks (progress, cancel); the last gives the logits
        if not feed_prompt(self.model, seq.ctx.target_cache, prompt[:-1], seq.should_stop, on_prefill):
            stopped = Step(0, verify_s=time.perf_counter() - t0, wall_s=time.perf_counter() - t0)
            return report(seq, stopped, Verdict(0, []), [], "cancelled", prefill=True)
        logits, hidden = self._forward(seq, prompt[-1:])
        step = Step(0, token=mxs.pick(logits[-1:], seq.ctx.sampling), hidden=hidden)
        verdict = settle(seq, step)
        tokens, finish = seq.start(verdict, hidden[-1] if hidden is not None else None)
        step.verify_s = step.wall_s = time.perf_counter() - t0
        seq.last_settled = time.perf_counter()
        return report(seq, step, verdict, tokens, finish, prefill=True)

    def _launches_before_verdict(self, seq: Sequence, step: Step) -> bool:
        """Whether the next round can be launched now, before `step` is settled: slot caches,
        a round with drafts whose verdict is in the graph, the proposer's chain on it ready,
        and tokens left past the most this round can emit."""
        return (holes(seq) is not None and step.k > 0 and step.lazy is not None and seq.schedule.enabled
                and seq.remaining > step.k + 1 and seq.proposer.chain_ahead())

    def _launch(self, seq: Sequence, after: Step | None = None) -> Step:
        """Draft, then issue the verify forward without waiting for it. `after` = a step not
        settled yet whose lazy token is this step's input: a plain step, or (slot caches) a
        round with drafts, whose verdict gives the token and its position."""
        ctx, gaps = seq.ctx, holes(seq)
        speculative_after = after is not None and after.k > 0
        if after is None:
            steps = seq.next_steps()
        else:  # past the most `after` can emit
            steps = seq.next_steps(seq.remaining - after.k - 1) if speculative_after else 0
        if speculative_after:
            seq.proposer.commit(ctx)  # the next round goes on from the chain anticipated on `after`
        t0 = time.perf_counter()
        draft = self._propose(seq, steps)
        t1 = time.perf_counter()
        if speculative_after:
            last, position = after.lazy.token, after.lazy.next_position
        elif after is not None:
            last, position = after.next_token, None  # plain: no chain reads the position
        else:
            last, position = mx.array(ctx.tokens[-1:], dtype=mx.uint32), ctx.position
        first_slot = ctx.target_cache[0].slot if gaps is not None else 0
        inputs = mx.concatenate([last.astype(mx.uint32), draft.tokens]) if draft.size else last.astype(mx.uint32)
        logits, hidden = self._forward(seq, inputs)
        step = Step(steps, draft, t1 - t0, hidden=hidden, launched_early=speculative_after, ahead=ctx.ahead,
                    expected=seq.expected() if after is None or speculative_after else None)
        sampling = ctx.sampling
        if sampling.greedy:
            step.argmax = mx.argmax(logits, axis=-1)
            outputs = [step.argmax]
        elif draft.size:
            p = mxs.target_probs(logits, sampling)
            step.sampled = mxs.rejection_verify(p, draft.q, draft.tokens)
            outputs = [step.sampled.accept, step.sampled.residual, step.sampled.bonus]
        else:
            step.token = mxs.pick(logits, sampling)
            outputs = [step.token]
        mx.async_eval(*outputs, *([hidden] if hidden is not None else []))
        anticipates = seq.proposer is not None and seq.proposer.drafts_ahead and seq.schedule.enabled
        if anticipates or gaps is not None and step.k:
            accepted, token = mxs.verdict_in_graph(draft.tokens, step.argmax, step.sampled, step.token)
            taken = mx.take(hidden, accepted, axis=0) if hidden is not None else None
            step.lazy = LazyVerdict(position, draft.tokens, accepted, token, taken)
            if gaps is not None and step.k:  # the drafts past `accepted` become holes
                gaps.reject(first_slot, step.k, accepted)
        step.build_s = time.perf_counter() - t1
        ctx.drafted_last, ctx.ahead = steps or ctx.drafted_last, 0
        if anticipates:
            # Depth-2 overlap: the next round's chain -- not behind a round that chose to draft
            # nothing (--steps auto pricing the drafter out: the next round likely drafts nothing
            # either, and the chain would be computed and dropped every round), unless it was a
            # skip-streak skip, after which the next round drafts again
            ahead = bool(steps or seq.schedule.skipped)
            self._anticipate(seq, step, chain=ahead)
            ctx.ahead = ctx.drafted_last if ahead else 0
        return step

    @staticmethod
    def _propose(seq: Sequence, steps: int) -> Draft:
        """The proposer's drafts as an mx.array (n-gram lookup gives a list), evaluated unless
        drafted ahead (already queued before this verify): drafting time is its own telemetry."""
        draft = seq.propose(steps)
        if not draft.size:
            return NO_DRAFTS
        if isinstance(draft.tokens, list):
            return replace(draft, tokens=mx_tokens(draft))
        if not draft.overlapped:
            mx.eval(draft.tokens)
        return draft

    def _anticipate(self, seq: Sequence, step: Step, chain: bool = True) -> None:
        """Depth-2 overlap: hand the proposer this round's verdict while it is still in the
        graph, so it can queue the next round's draft right behind the verify. `chain` False:
        a verdict without the target's hidden state, from which nothing is chained (the
        proposer drops the chain it anticipated before, which this round did not use)."""
        try:
            seq.proposer.anticipate(seq.ctx, step.lazy if chain else replace(step.lazy, hidden=None))
        except Exception as e:
            # this step's drafts are verified as usual; its Round says speculation stopped
            seq.stop_speculating(e)
            step.note, seq.out.note = seq.out.note, None


# -- a step's verdict and Round: the lone loop's and the batch's rows' -------------------------
def settle(seq: Sequence, step: Step) -> Verdict:
    """Wait for the few ints of the verify results: the accepted drafts + one target token."""
    t0 = time.perf_counter()
    drafts = step.draft.ids() if step.k else []
    if step.sampled is None:
        verdict = verify_greedy(drafts, (step.argmax if step.argmax is not None else step.token).tolist())
    else:
        s = step.sampled
        verdict = verify_sampled(drafts, s.accept.tolist(), s.residual.tolist(), s.bonus.item())
    step.verify_s = step.build_s + (time.perf_counter() - t0)
    seq.settled(step)
    return verdict


def report(seq: Sequence, step: Step, verdict: Verdict, tokens: list[int], finish: str | None,
           prefill: bool = False) -> Round:
    """The step's Round (Sequence.report), built while the next round's forward runs."""
    rnd = seq.report(step, verdict, tokens, finish, prefill)
    if (seq.out.index % 256) == 0:
        mx.clear_cache()
    return rnd
