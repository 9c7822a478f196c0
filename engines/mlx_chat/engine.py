"""The chat engine: an mlx-lm model host -- the target, its tokenizer and drafters, and a
Sequence made from a Request. The round loop is engines/speculative/loop.py's (`RowBatch.step`),
on its chat side engines/batch/engine.py's `BatchEngine`: engines.factory sets `ChatEngine.loop` to a batch of one, so a lone request
runs through it as any row of a larger batch does.

A model whose caches the batch cannot hold (recurrent or hybrid layers, attention sinks) has no
loop: it decodes plainly, token by token through mlx-lm's own generate_step, and a request
that asked for speculation hears why in its first Round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from engines.types import EngineError, OnPrefill, PrefillProgress, Request, ShouldStop
from engines.mlx_chat import sampling as mxs
from engines.mlx_chat.options import MtpOptions
from engines.mlx_chat.loading import LoadedModel, check_same_tokenizer, load_model
from engines.mlx_chat.prefill import PREFILL_CHUNK
from engines.mlx_chat.context import check_fits, context_length
from engines.profiles import for_spec
from engines.speculative.proposer import Context, Proposer
from engines.speculative.output import Output
from engines.speculative.rounds import Round
from engines.speculative.sequence import Sequence, Step
from engines.speculative.repetition import detector_for
from engines.speculative.verify import Verdict
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


class PrefillCancelled(Exception):
    """Raised from mlx-lm's prefill progress callback: the only way to stop its prefill."""


@dataclass
class ChatEngine:
    target: LoadedModel
    draft_path: str | None = None
    mtp_options: MtpOptions = field(default_factory=MtpOptions)
    # The loop `generate` runs a request through: the batch's, as a batch of one (engines.factory
    # sets it: engines/batch/engine.py `batch_of_one`). None: plain decoding, for `plain_only`.
    loop: Any = None
    plain_only: str = "this engine was made without engines.factory, so it has no speculative loop"
    _drafts: dict[str, LoadedModel] = field(default_factory=dict)
    _hash: str | None = None

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

    # -- a request's run -------------------------------------------------------------------------
    def generate(self, request: Request, should_stop: ShouldStop | None = None, *,
                 on_prefill: OnPrefill | None = None) -> Iterator[Round]:
        if self.loop is not None:
            yield from self.loop.generate(request, should_stop, on_prefill=on_prefill)
        else:
            yield from self.generate_plainly(request, should_stop, on_prefill)

    def generate_plainly(self, request: Request, should_stop: ShouldStop | None = None,
                         on_prefill: OnPrefill | None = None) -> Iterator[Round]:
        """Plain decoding through mlx-lm's generate_step (its prefill chunks, its cache): one
        Round per token, the first after the prompt."""
        note = f"speculation unavailable: {self.plain_only}" if request.spec.enabled else None
        seq = self.sequence(request, should_stop, lambda _request: (None, note))
        if request.sampling.seed is not None:
            mx.random.seed(request.sampling.seed)
        started = time.perf_counter()

        def progress(done: int, total: int) -> None:
            if on_prefill is not None and 0 < done < total:  # (it also reports 0 first and the whole prompt last)
                on_prefill(PrefillProgress(done, total, time.perf_counter() - started))
            if done < total and seq.should_stop():
                raise PrefillCancelled

        sampling = request.sampling
        tokens = generate_step(mx.array(seq.ctx.tokens, dtype=mx.uint32), self.model, max_tokens=seq.remaining,
                               sampler=lambda logprobs: mxs.pick(logprobs, sampling),
                               prompt_cache=make_prompt_cache(self.model), prefill_step_size=PREFILL_CHUNK,
                               prompt_progress_callback=progress)
        try:
            for token, _logprobs in tokens:
                step, verdict = Step(0), Verdict(0, [int(token)])
                seq.settled(step)
                step.verify_s = step.wall_s
                prefill = seq.out.index == 0
                emitted, finish = seq.start(verdict) if prefill else seq.commit(step, verdict)
                rnd = seq.report(step, verdict, emitted, finish, prefill)
                yield rnd
                if rnd.finish:
                    return
        except PrefillCancelled:
            yield seq.out.stopped("cancelled", prefill=True)
        finally:
            tokens.close()

    def sequence(self, request: Request, should_stop: ShouldStop | None,
                 proposer_for: Callable[[Request], tuple[Proposer | None, str | None]]) -> Sequence:
        """A Sequence for `request` (checked first: EngineError), with the proposer
        `proposer_for` gives it (or plain decoding and the reason: the first Round's note)
        and its schedule. The loop holds its cache rows and RNG key."""
        validate(request, self.context_length)
        prompt_ids = self.prompt_ids(request)
        if not prompt_ids:
            raise EngineError("empty prompt")
        check_fits(len(prompt_ids), request.max_tokens, self.context_length)  # before any forward
        proposer, note = proposer_for(request)
        return Sequence.begin(request, Context(prompt_ids, request.sampling), proposer, self.output(request),
                              profile=for_spec(request.spec, self.model_path), notes=(note,), should_stop=should_stop)

    def output(self, request: Request) -> Output:
        """What a run of `request` emits: its text through mlx-lm's streaming detokenizer."""
        return Output(DetokenizerText(self.tokenizer.detokenizer), set(self.tokenizer.eos_token_ids),
                      request.max_tokens, request.stop, detector_for(request.max_repeat))

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
