"""The OCR engine: GLM-OCR decoding with chained MTP drafts, one Round per target forward.

Where things happen (read `OcrEngine.generate` top to bottom):
  prefill        the prompt (image tokens included) in seq_len chunks -> the first token
  draft          MtpDrafter.propose: catch up the MTP cache, then chain k MTP steps
  verify         one target forward over [token, draft_1 .. draft_k] -> verify_greedy /
                 rejection sampling -> accepted drafts + exactly one target token
  roll back      nothing to undo in the main cache: the next chunk is written right after
                 the accepted rows (stale rows are masked, then overwritten); the MTP layer
                 is told which rows were verified (MtpDrafter.accept)

Sequence bookkeeping: `length` rows of the main KV cache hold verified tokens; `hidden` is the
final-normed hidden state of the last of them; `token` is the newest emitted token, not yet in
the cache. Each round feeds [token, drafts...] at rows length.. and keeps 1 + accepted rows.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import numpy as np

from engines import EngineError, Request, ShouldStop
from engines.glm_ocr.config import GlmOcrConfig
from engines.glm_ocr.positions import prompt_positions, text_positions, text_rope
from engines.glm_ocr.prompts import GlmTokenizer, IncrementalDecoder, prompt_ids
from engines.glm_ocr.runtime import Runtime
from engines.speculative.rounds import Round
from engines.speculative.sampling import rejection_verify, target_probs
from engines.speculative.schedule import DraftSchedule
from engines.speculative.verify import Verdict, accept_flags, clip_emitted, verify_greedy


# ----------------------------------------------------------------------------- positions


@dataclass
class Positions:
    """mRoPE positions by sequence index: the prompt's own (image tokens are 3-D), then text
    positions shifted by the prompt's delta."""

    prompt: np.ndarray  # (3, P)
    delta: int

    def rows(self, start: int, count: int) -> np.ndarray:
        p = self.prompt.shape[1]
        if start + count <= p:
            return self.prompt[:, start : start + count]
        head = self.prompt[:, start:p] if start < p else np.zeros((3, 0), np.int64)
        tail_start = max(start, p)
        return np.concatenate([head, text_positions(tail_start, start + count - tail_start, self.delta)], axis=1)


# ----------------------------------------------------------------------------- drafters


class Drafter(Protocol):
    """Proposes drafts; never touches the main model. The engine calls `start` after the
    prefill (prompt hidden states and ids), `propose(hidden, token, k)` every round with the
    last verified hidden state and the newest token (k may be 0: a plain round), and
    `accept(hiddens, drafts)` with the accepted drafts and the verified hidden state before
    each of them. The target's own token of the round comes back in the next `propose`."""

    def start(self, hiddens: np.ndarray, ids: list[int]) -> None: ...

    def propose(self, hidden: np.ndarray, token: int, k: int) -> list[int]: ...

    def accept(self, hiddens: np.ndarray, tokens: list[int]) -> None: ...


class MtpDrafter:
    """Chained drafts from GLM-OCR's MTP layer, with its own KV cache.

    MTP cache row i holds the pair (main model's final-normed hidden at row i, embedding of
    token i+1), at the mRoPE position of row i; its output predicts token i+2. Two ways to
    keep the cache in step with the main model:

      "aligned" (default): rows below `slot` only ever hold verified pairs. Pairs whose hidden
        state is known but not yet written (the prompt after prefill, the accepted drafts of
        the last round) wait in `pending` and go into the same MTP call as the next chain's
        first step. Chain steps past the first write speculative rows that the next round
        overwrites.
      "rollback": the design notes' rule: every MTP step advances the position, and after
        verification it moves back by the number of rejected drafts. The cache then falls one
        row behind the main model every round (the pair holding the target's own token never
        reaches the MTP layer, and accepted rows keep the MTP's own hidden state instead of
        the target's). Kept to measure against (bench/ocr_mtp.py).
    """

    def __init__(self, runtime: Runtime, positions: Positions, eos_ids: list[int], scheme: str = "aligned"):
        if scheme not in ("aligned", "rollback"):
            raise ValueError(f"unknown MTP cache scheme {scheme!r}")
        self.runtime = runtime
        self.positions = positions
        self.eos = set(eos_ids)
        self.scheme = scheme
        self.slot = 0  # next MTP cache row to write; rows below hold pairs of the sequence
        self.pending_hidden: list[np.ndarray] = []
        self.pending_tokens: list[int] = []
        self.proposed = 0  # drafts of the current round
        self.mtp_rows = 0  # rows run through the MTP layer (cost accounting)

    def start(self, hiddens: np.ndarray, ids: list[int]) -> None:
        """MTP KV prefill: every prompt row i with its next token ids[i+1] (written lazily,
        with the first chain)."""
        self.pending_hidden = list(hiddens[:-1])
        self.pending_tokens = list(ids[1:])

    def propose(self, hidden: np.ndarray, token: int, k: int) -> list[int]:
        if k == 0:
            if self.scheme == "aligned":  # a verified pair: write it with the next chain
                self.pending_hidden.append(hidden)
                self.pending_tokens.append(token)
            return []
        # first step, one MTP call: the pending verified pairs, then (hidden, token)
        tokens = self.pending_tokens + [token]
        raw, head = self._run(self.slot, np.stack(self.pending_hidden + [hidden]), tokens)
        self.slot += len(tokens)
        self.pending_hidden, self.pending_tokens = [], []
        drafts = [self._greedy(head[-1])]
        # chain: the MTP's own raw hidden state and its last draft feed the next step
        raw_last = raw[-1:]
        for step in range(1, k):
            if drafts[-1] in self.eos:
                break
            raw_last, head = self._run(self.slot + step - 1, raw_last, [drafts[-1]])
            drafts.append(self._greedy(head[-1]))
        if self.scheme == "rollback":  # the notes advance the position on every MTP step
            self.slot += len(drafts) - 1
        self.proposed = len(drafts)
        return drafts

    def accept(self, hiddens: np.ndarray, tokens: list[int]) -> None:
        """The round accepted `tokens` (a prefix of the drafts); hiddens[i] is the verified
        hidden state that precedes tokens[i]."""
        if self.scheme == "aligned":
            self.pending_hidden.extend(hiddens[: len(tokens)])
            self.pending_tokens.extend(tokens)
        else:
            self.slot -= self.proposed - len(tokens)  # roll back the rejected drafts' rows
        self.proposed = 0

    def _run(self, start: int, previous_hidden: np.ndarray, tokens: list[int]):
        n = len(tokens)
        if start + n > self.runtime.cache_length:
            raise EngineError("the MTP cache is full")
        cos, sin = text_rope(self.positions.rows(start, n), self.runtime.config.text)
        embeds = self.runtime.embeddings[np.asarray(tokens)]
        self.mtp_rows += n
        return self.runtime.mtp(previous_hidden.astype(np.float32), embeds, start, cos, sin)

    def _greedy(self, head_hidden: np.ndarray) -> int:
        return int(np.argmax(self.runtime.logits(head_hidden[None])[0]))


# ----------------------------------------------------------------------------- repetition


@dataclass
class RepetitionGuard:
    """GLM-OCR's most reported failure is endless repetition. Flags a run whose last tokens
    are one block of `period` tokens repeated: at least `min_copies` copies and at least
    `min_span` tokens in all. Checked token by token (so a speculative run stops at exactly
    the token plain decoding stops at); run[p] counts trailing tokens equal to the token p
    back, so each check costs O(max_period)."""

    max_period: int = 128
    min_copies: int = 4
    min_span: int = 64
    tokens: list[int] = field(default_factory=list)
    run: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.run = [0] * (self.max_period + 1)

    def push(self, token: int) -> int | None:
        """Add a token; return the repeating period if the tail is now a repetition."""
        self.tokens.append(token)
        n = len(self.tokens)
        found = None
        for p in range(1, min(self.max_period, n - 1) + 1):
            self.run[p] = self.run[p] + 1 if self.tokens[-1] == self.tokens[-1 - p] else 0
            if found is None and self.run[p] + p >= max(self.min_copies * p, self.min_span):
                found = p
        return found


# ----------------------------------------------------------------------------- the engine


@dataclass
class RunState:
    length: int  # verified rows in the main KV cache
    hidden: np.ndarray  # final-normed hidden of the last verified row
    token: int  # the newest emitted token, not yet in the cache
    emitted: int  # tokens emitted so far


class OcrEngine:
    def __init__(self, runtime: Runtime, tokenizer: GlmTokenizer, model_path: str, image_config=None):
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.config: GlmOcrConfig = runtime.config
        self.image_config = image_config
        self.repetition: RepetitionGuard | None = RepetitionGuard()  # None disables the guard
        self.mtp_scheme = "aligned"  # see MtpDrafter; bench/ocr_mtp.py measures both
        self.last_drafter: Drafter | None = None

    @classmethod
    def load(cls, model_path: str | os.PathLike, runtime: str | None = "torch", **options) -> "OcrEngine":
        from engines.glm_ocr.image import ImageProcessorConfig

        if not os.path.isdir(model_path):
            raise EngineError(f"model directory not found: {model_path}")
        if runtime is None:  # the CLI's default: by what the directory holds
            from engines.glm_ocr.runtime_coreml import default_runtime

            runtime = default_runtime(model_path)
        if runtime == "torch":
            from engines.glm_ocr.runtime_torch import TorchRuntime

            rt = TorchRuntime.load(model_path, **options)
        elif runtime == "coreml":
            from engines.glm_ocr.runtime_coreml import CoreMLRuntime

            rt = CoreMLRuntime.load(model_path, **options)
        else:
            raise EngineError(f"unknown runtime {runtime!r} (expected 'torch' or 'coreml')")
        return cls(rt, GlmTokenizer(model_path), str(model_path), ImageProcessorConfig.from_dir(model_path))

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def model_info(self) -> dict:
        t = self.config.text
        return {
            "kind": "ocr", "path": self.model_path, "runtime": self.runtime.name,
            "layers": t.num_hidden_layers, "hidden": t.hidden_size, "vocab": t.vocab_size,
            "seq_len": self.runtime.seq_len, "cache_length": self.runtime.cache_length,
            "mtp": self.runtime.mtp_unavailable is None, "mtp_note": self.runtime.mtp_unavailable,
        }

    # -- the round loop -------------------------------------------------------------------

    def generate(self, request: Request, should_stop: ShouldStop | None = None, *,
                 drafter: Drafter | None = None) -> Iterator[Round]:
        """One Round per target forward. `drafter` replaces the MTP drafter (tests, benchmarks)."""
        t_start = time.perf_counter()
        ids, embeds, positions, fit_note = self._prompt(request)
        schedule, drafter, note = self._drafting(request, positions, drafter)
        note = _join(fit_note, note)
        self.last_drafter = drafter  # for inspection (tests, benchmarks)
        rng = np.random.default_rng(request.sampling.seed)
        text = IncrementalDecoder(self.tokenizer)
        guard = RepetitionGuard(self.repetition.max_period, self.repetition.min_copies,
                                self.repetition.min_span) if self.repetition else None

        # prefill: the prompt in seq_len chunks; the last row's logits give the first token
        t0 = time.perf_counter()
        self.runtime.reset()
        hiddens = self._prefill(embeds, positions)
        first = self._sample(self.runtime.logits(hiddens[-1:]), request, rng)[0]
        if drafter is not None:
            drafter.start(hiddens, ids)
        verify_s = time.perf_counter() - t0
        state = RunState(length=len(ids), hidden=hiddens[-1], token=first, emitted=0)
        rnd = self._finish_round(0, state, [first], [], 0, 0.0, verify_s, t0, t_start, request, text, guard,
                                 prefill=True)
        rnd.note = _join(note, rnd.note)
        yield rnd
        index = 1
        while rnd.finish is None:
            if should_stop is not None and should_stop():
                yield self._cancelled(index, t_start)
                return
            if state.length + self.runtime.seq_len > self.runtime.cache_length:
                yield self._context_full(index, t_start)
                return
            t0 = time.perf_counter()
            remaining = request.max_tokens - state.emitted
            k = schedule.next_steps(remaining)
            k = min(k, self.runtime.seq_len - 1)

            # draft
            drafts, note = [], None
            if drafter is not None:
                try:
                    drafts = drafter.propose(state.hidden, state.token, k)
                except Exception as e:  # noqa: BLE001 -- graceful degradation, said in the round
                    drafter, drafts = None, []
                    schedule.disable()
                    note = f"speculation stopped: drafter raised {type(e).__name__}: {e}"
            t1 = time.perf_counter()

            # verify: one target forward over [token, drafts...]
            chunk = [state.token] + drafts
            rows = self._decode(chunk, state.length, positions)
            logits = self.runtime.logits(rows)
            verdict = self._verify(drafts, logits, request, rng)
            t2 = time.perf_counter()

            # roll forward: keep 1 + accepted rows; the MTP layer learns the verified rows
            a = verdict.accepted
            if drafter is not None:
                drafter.accept(rows[:a], drafts[:a])
            schedule.record(len(drafts), a)
            state.length += 1 + a
            state.hidden = rows[a]
            state.token = verdict.tokens[-1]
            rnd = self._finish_round(index, state, verdict.tokens, drafts, a, t1 - t0, t2 - t1, t0, t_start,
                                     request, text, guard, steps=k)
            rnd.note = _join(note, rnd.note)
            if rnd.finish is None and should_stop is not None and should_stop():
                rnd.finish = "cancelled"
            yield rnd
            index += 1

    # -- helpers, in the order the loop uses them ------------------------------------------

    def _prompt(self, request: Request) -> tuple[list[int], np.ndarray, Positions, str | None]:
        """Prompt ids, their embeddings (image features in place of the image tokens), the
        mRoPE positions, and a note if the image had to be downscaled to fit the context."""
        from engines.glm_ocr.image import load_image, num_image_tokens, preprocess

        if request.kind != "ocr":
            raise EngineError(f"the OCR engine cannot run a {request.kind!r} request")
        if not request.image:
            raise EngineError("no image given")
        if request.max_tokens < 1:
            raise EngineError(f"max_tokens must be at least 1, got {request.max_tokens}")
        image = load_image(request.image)
        config, note = self._fit_image(image, request)
        pixel_values, grid = preprocess(image, config)
        grid_thw = tuple(int(x) for x in grid[0])
        merge = self.config.vision.spatial_merge_size
        n_image = num_image_tokens(grid, merge)
        ids = prompt_ids(self.tokenizer, request.task, n_image, self.config.image_token_id)
        if len(ids) + self.runtime.seq_len > self.runtime.cache_length:
            raise EngineError(
                f"the prompt ({len(ids)} tokens for a {grid_thw[2] * 14}x{grid_thw[1] * 14} image) does not fit "
                f"the model's context of {self.runtime.cache_length}; use a smaller image")
        embeds = self.runtime.embeddings[np.asarray(ids)].copy()
        embeds[np.asarray(ids) == self.config.image_token_id] = self.runtime.encode_image(pixel_values, grid_thw)
        positions, delta = prompt_positions(ids, self.config.image_token_id, grid_thw, merge)
        return ids, embeds, Positions(positions, delta), note

    def _fit_image(self, image, request: Request):
        """A page whose image tokens would not leave room in the context for the text around
        them and for the answer is read at a lower resolution rather than refused: the pixel
        budget shrinks so that image tokens + prompt text + room to answer (up to a quarter
        of the context) fit. Returns (processor config, note or None)."""
        from dataclasses import replace

        from engines.glm_ocr.image import smart_resize

        config = self.image_config
        text_tokens = len(prompt_ids(self.tokenizer, request.task, 0, self.config.image_token_id))
        answer_room = min(request.max_tokens, self.runtime.cache_length // 4)
        budget = self.runtime.cache_length - text_tokens - answer_room - self.runtime.seq_len
        h, w = smart_resize(image.height, image.width, config)
        tokens = (h // config.factor) * (w // config.factor)
        if tokens <= budget:
            return config, None
        pixels_per_token = config.factor**2 * config.temporal_patch_size  # max_pixels counts both frames
        fitted = replace(config, max_pixels=max(budget, 1) * pixels_per_token)
        if fitted.max_pixels < config.min_pixels:
            raise EngineError(f"the model's context of {self.runtime.cache_length} tokens has no room for an image")
        h2, w2 = smart_resize(image.height, image.width, fitted)
        return fitted, (f"image read at {w2}x{h2} instead of {w}x{h} to fit the context of "
                        f"{self.runtime.cache_length} tokens (convert with a larger --cache-length for full resolution)")

    def _drafting(self, request: Request, positions: Positions, drafter: Drafter | None):
        spec = request.spec
        if spec.method not in ("off", "mtp"):
            raise EngineError(f"the OCR engine speculates with 'mtp' (or 'off'), not {spec.method!r}")
        try:
            schedule = DraftSchedule(spec.steps if spec.enabled else 0, spec.adaptive, spec.min_steps,
                                     spec.max_steps, spec.skip_streak)
        except ValueError as e:
            raise EngineError(str(e)) from e
        if drafter is not None or not spec.enabled:
            return schedule, drafter if spec.enabled else None, None
        if self.runtime.mtp_unavailable:
            schedule.disable()
            return schedule, None, f"{self.runtime.mtp_unavailable}; decoding plainly"
        return schedule, MtpDrafter(self.runtime, positions, self.config.eos_token_ids, self.mtp_scheme), None

    def _prefill(self, embeds: np.ndarray, positions: Positions) -> np.ndarray:
        s = self.runtime.seq_len
        out = []
        for start in range(0, len(embeds), s):
            n = min(s, len(embeds) - start)
            cos, sin = text_rope(positions.rows(start, n), self.config.text)
            out.append(self.runtime.decode(embeds[start : start + n], start, cos, sin))
        return np.concatenate(out)

    def _decode(self, tokens: list[int], start: int, positions: Positions) -> np.ndarray:
        cos, sin = text_rope(positions.rows(start, len(tokens)), self.config.text)
        return self.runtime.decode(self.runtime.embeddings[np.asarray(tokens)], start, cos, sin)

    def _sample(self, logits: np.ndarray, request: Request, rng: np.random.Generator) -> list[int]:
        s = request.sampling
        if s.greedy:
            return [int(t) for t in np.argmax(logits, axis=-1)]
        p = target_probs(logits, s.temperature, s.top_p, s.top_k)
        return [int(rng.choice(p.shape[-1], p=row)) for row in p]

    def _verify(self, drafts: list[int], logits: np.ndarray, request: Request, rng) -> Verdict:
        """Row i of logits follows [token, drafts[:i]]: it checks drafts[i]; the last row gives
        the bonus token. Temperature > 0: rejection sampling with point-mass proposals (the
        MTP drafts greedily), which keeps the target's distribution exactly."""
        s = request.sampling
        if s.greedy:
            return verify_greedy(drafts, [int(t) for t in np.argmax(logits, axis=-1)])
        p = target_probs(logits, s.temperature, s.top_p, s.top_k)
        return rejection_verify(p, None, drafts, rng)

    def _finish_round(self, index, state: RunState, tokens, drafts, accepted, draft_s, verify_s, t0, t_start,
                      request, text: IncrementalDecoder, guard: RepetitionGuard | None,
                      prefill: bool = False, steps: int = 0) -> Round:
        """Clip the burst at EOS / max_tokens / repetition, decode its text, build the Round."""
        kept, finish = clip_emitted(tokens, self.config.eos_token_ids, request.max_tokens - state.emitted)
        note = None
        if guard is not None:
            for i, t in enumerate(kept):
                period = guard.push(t)
                if period is not None:
                    kept, finish = kept[: i + 1], "repetition"
                    note = f"stopped: the output repeats a block of {period} tokens"
                    break
        state.emitted += len(kept)
        from_draft = [i < accepted for i in range(len(kept))]
        n_acc = sum(from_draft)
        delta = text.add(kept)
        if finish is not None:
            delta += text.flush()
        now = time.perf_counter()
        rnd = Round(
            index=index, proposed=len(drafts), accepted=n_acc, tokens=kept, from_draft=from_draft, text=delta,
            accept_flags=accept_flags(len(drafts), n_acc), draft_s=draft_s, verify_s=verify_s,
            wall_s=now - t0, t_s=now - t_start, prefill=prefill, steps=steps, finish=finish,
        )
        if note:
            rnd.note = note
        return rnd

    def _cancelled(self, index: int, t_start: float) -> Round:
        return Round(index=index, proposed=0, accepted=0, tokens=[], from_draft=[], text="", accept_flags=[],
                     draft_s=0.0, verify_s=0.0, wall_s=0.0, t_s=time.perf_counter() - t_start, finish="cancelled")

    def _context_full(self, index: int, t_start: float) -> Round:
        rnd = self._cancelled(index, t_start)
        rnd.finish = "length"
        rnd.note = f"stopped: the context of {self.runtime.cache_length} tokens is full"
        return rnd


def _join(*notes: str | None) -> str | None:
    kept = [n for n in notes if n]
    return "; ".join(kept) if kept else None
