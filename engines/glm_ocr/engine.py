"""The OCR engine: GLM-OCR's model host -- its runtime (fast torch, Core ML, or the Core ML
modules' torch twin), tokenizer and drafters (MtpDrafter below; n-gram or composed, `_drafter`)
-- and what makes a request's Sequence. The round loop and what one step does are
engines/speculative/loop.py's (`RowBatch.step`), on its GLM-OCR side (batch.py, `OcrBatch`); a
lone request is a batch of one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from engines.types import EngineError, Request, ShouldStop
from engines.glm_ocr.config import GlmOcrConfig
from engines.glm_ocr.positions import Positions, prompt_positions, text_rope
from engines.glm_ocr.prompts import GlmTokenizer, Prompt, prompt_ids
from engines.glm_ocr.runtime import Runtime
from engines.profiles import for_spec
from engines.speculative.composed import ComposedProposer, DraftingCosts
from engines.speculative.ngram import NGramProposer
from engines.speculative.output import Output
from engines.speculative.proposer import Context, Draft, Proposer
from engines.speculative.repetition import RepetitionDetector
from engines.speculative.rounds import Round
from engines.speculative.sequence import Sequence


# ----------------------------------------------------------------------------- drafters


@dataclass
class OcrContext(Context):
    """A GLM-OCR sequence's Context (engines/speculative/proposer.py): ctx.hidden is the target's
    final-normed hidden state that produced tokens[-1]; `rows` the verified hidden states of the
    last round (rows[i] precedes its i-th emitted token; after the prefill, every prompt row)
    and `embeds` the prompt's input embeddings (image features in place of the image tokens),
    which the MTP layer's cache is filled from."""

    rows: np.ndarray | None = None
    embeds: np.ndarray | None = None
    positions: Positions | None = None  # its mRoPE positions (the batch's rows are placed by them)


class MtpDrafter:
    """Chained greedy drafts from GLM-OCR's MTP layer, with its own KV cache, under the
    convention of docs/glm-ocr-mtp-convention.md (vLLM's GLM-OCR MTP proposer):

      MTP cache row i holds the pair (main model's final-normed hidden at row i, input
      embedding of token i+1 -- an image feature for an image token), at row i's mRoPE
      position; its output predicts token i+2. Rows below `slot` only ever hold verified
      pairs: pairs whose hidden state is known but not yet written (the prompt after the
      prefill, the accepted drafts of the last round) wait in `pending` and go into the same
      MTP call as the next chain's first step. A chain continues from the MTP layer's own
      output before shared_head.norm, one position further per step; chain steps past the
      first write rows that the next round overwrites (rejected drafts leave nothing behind).
    """

    name = "mtp"

    def __init__(self, runtime: Runtime, positions: Positions, eos_ids: list[int], group: MtpGroup | None = None):
        self.runtime = runtime
        self.positions = positions
        self.eos = set(eos_ids)
        self.cache = runtime.new_mtp_cache()  # its own: a batch's rows draft side by side (Core ML: None, its one state)
        self.group = group  # in a batch, the rows of one runtime draft together (MtpGroup); alone, unused
        self.chained = 0  # chain steps after the first, this round
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # the chain's last MTP output (raw, head)
        self.slot = 0  # next MTP cache row to write; rows below hold verified pairs
        self.pending_hidden: list[np.ndarray] = []
        self.pending_embeds: list[np.ndarray] = []  # the prompt's rows (image features among them)
        self.pending_tokens: list[int] = []  # then the output's, embedded when a chain needs them

    needs_hidden = True

    def start(self, ctx: OcrContext) -> None:
        """MTP KV prefill: every prompt row i with the input embedding of row i+1 (written
        lazily, with the first chain), then the first token's pair."""
        self.pending_hidden = list(ctx.rows[:-1])
        self.pending_embeds = list(ctx.embeds[1:])
        self.pending_tokens = []
        self._wait(ctx.hidden, ctx.tokens[-1])

    def propose(self, ctx: OcrContext, k: int) -> Draft:
        drafts = [self._greedy(self.first())]
        for _ in range(1, k):
            if drafts[-1] in self.eos:
                break
            drafts.append(self._greedy(self.chain(drafts[-1])))
        return Draft(drafts)

    def first(self) -> np.ndarray:
        """A chain's first step, one MTP call: the pending verified pairs, the newest one last.
        Returns the shared_head-normed row whose logits give the first draft."""
        n = len(self.pending_hidden)
        embeds = self.pending_embeds + list(self._embed(self.pending_tokens))
        self.last = self._run(self.slot, np.stack(self.pending_hidden), np.stack(embeds))
        self.slot += n
        self.pending_hidden, self.pending_embeds, self.pending_tokens = [], [], []
        self.chained = 0
        return self.last[1][-1]

    def chain(self, draft: int) -> np.ndarray:
        """The chain one position further: the MTP layer's own output and the last draft."""
        self.chained += 1
        self.last = self._run(self.slot + self.chained - 1, self.chain_hidden(*self.last)[-1:], self._embed([draft]))
        return self.last[1][-1]

    def chain_hidden(self, raw: np.ndarray, head: np.ndarray) -> np.ndarray:
        """What continues a chain: the MTP layer's output before shared_head.norm, as vLLM's
        GLM-OCR proposer feeds it back (SGLang feeds the normed one; bench/ocr_mtp.py
        measures both)."""
        return raw

    def commit(self, ctx: OcrContext) -> None:
        """The round's verified pairs: each emitted token with the hidden state before it."""
        for hidden, token in zip(ctx.rows, ctx.tokens[-len(ctx.rows):]):
            self._wait(hidden, token)

    def _wait(self, hidden: np.ndarray, token: int) -> None:
        """Queue a verified pair; its token is embedded with the others at the next chain (one
        lookup there, not one per round: composed rounds that draft from n-gram queue pairs
        for many rounds, and on a tiny model a lookup is a share of the round)."""
        self.pending_hidden.append(hidden)
        self.pending_tokens.append(token)

    def _embed(self, tokens: list[int]) -> np.ndarray:
        return self.runtime.embeddings[np.asarray(tokens)]

    def _run(self, start: int, previous_hidden: np.ndarray, embeds: np.ndarray):
        n = len(embeds)
        if start + n > self.runtime.cache_length:
            raise EngineError("the MTP cache is full")
        cos, sin = text_rope(self.positions.rows(start, n), self.runtime.config.text)
        return self.runtime.mtp(previous_hidden.astype(np.float32), embeds, start, cos, sin, self.cache)

    def _greedy(self, head_hidden: np.ndarray) -> int:
        return int(np.argmax(self.runtime.logits(head_hidden[None])[0]))


class MtpGroup:
    """The MTP drafters of a batch's rows (batch.py), drafting together (the DraftGroup of
    engines/speculative/proposer.py): each chain step runs the MTP layer row after row -- each
    row's own MTP cache -- then the LM head once over every row's output, where row after row it
    would read the head's weights once per row and step. The same drafts as each row's own propose
    (tests/engines/glm_ocr/test_batch.py checks them round by round)."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime

    def propose_rows(self, target_cache, asks) -> list[Draft]:
        drafters = [seq.proposer for _, seq, _, _ in asks]
        ks = [k for _, _, k, _ in asks]
        drafts = [[t] for t in self._greedy([d.first() for d in drafters])]
        for step in range(1, max(ks)):
            going = [i for i, d in enumerate(drafters) if ks[i] > step and drafts[i][-1] not in d.eos]
            if not going:
                break
            heads = [drafters[i].chain(drafts[i][-1]) for i in going]
            for i, token in zip(going, self._greedy(heads)):
                drafts[i].append(token)
        return [Draft(d) for d in drafts]

    def _greedy(self, heads: list[np.ndarray]) -> list[int]:
        return [int(t) for t in np.argmax(self.runtime.logits(np.stack(heads)), axis=-1)]


# ----------------------------------------------------------------------------- the engine


RUNTIMES = ("torch", "coreml", "coreml-twin")  # what OcrEngine.load and the CLI's --runtime accept


class OcrEngine:
    def __init__(self, runtime: Runtime, tokenizer: GlmTokenizer, model_path: str, image_config=None):
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.config: GlmOcrConfig = runtime.config
        self.image_config = image_config
        # the loop detector's shape (its copies come from Request.max_repeat); None turns it off
        self.repetition: RepetitionDetector | None = RepetitionDetector()
        self.draft_costs = DraftingCosts()  # composed drafting's measurements, kept across pages
        self.auto_seen: dict[tuple, tuple] = {}  # --steps auto's, kept across pages read one at a time
        self.mtp_group = MtpGroup(runtime)  # a batch's MTP rows draft through it together

    @classmethod
    def load(cls, model_path: str | os.PathLike, runtime: str | None = "torch", **options) -> "OcrEngine":
        """`runtime`: "torch" (the fast PyTorch runtime, runtime_fast.py), "coreml" (converted
        packages, macOS), "coreml-twin" (the converted modules run in PyTorch: parity checks),
        or None: by what the directory holds (runtime_coreml.default_runtime)."""
        from engines.glm_ocr.image import ImageProcessorConfig

        if not os.path.isdir(model_path):
            raise EngineError(f"model directory not found: {model_path}")
        if runtime is None:  # the CLI's default: by what the directory holds
            from engines.glm_ocr.runtime_coreml import default_runtime

            runtime = default_runtime(model_path)
        if runtime == "torch":
            from engines.glm_ocr.runtime_fast import FastRuntime

            rt = FastRuntime.load(model_path, **options)
        elif runtime == "coreml-twin":
            from engines.glm_ocr.runtime_torch import TorchRuntime

            rt = TorchRuntime.load(model_path, **options)
        elif runtime == "coreml":
            from engines.glm_ocr.runtime_coreml import CoreMLRuntime

            rt = CoreMLRuntime.load(model_path, **options)
        else:
            raise EngineError(f"unknown runtime {runtime!r} (expected one of {', '.join(RUNTIMES)})")
        return cls(rt, GlmTokenizer(model_path), str(model_path), ImageProcessorConfig.from_dir(model_path))

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def model_info(self) -> dict:
        t = self.config.text
        return {
            "kind": "ocr", "path": self.model_path, "runtime": self.runtime.name,
            "compute_units": getattr(self.runtime, "compute_units", "cpu"),  # Core ML: all | cpu_and_ne | ...; torch: the CPU
            "dtype": getattr(self.runtime, "dtype_name", None),  # the fast runtime's compute dtype
            "threads": getattr(self.runtime, "threads", None),  # the fast runtime's torch threads (None: torch's own)
            "layers": t.num_hidden_layers, "hidden": t.hidden_size, "vocab": t.vocab_size,
            "seq_len": self.runtime.seq_len, "cache_length": self.runtime.cache_length,
            "mtp": self.runtime.mtp_unavailable is None, "mtp_note": self.runtime.mtp_unavailable,
        }

    # -- the round loop -------------------------------------------------------------------

    def generate(self, request: Request, should_stop: ShouldStop | None = None, *,
                 drafter: Proposer | None = None, on_prefill=None) -> Iterator[Round]:
        """One Round per target forward: a lone request is a batch of one (batch.py's OcrBatch,
        the one round loop). `drafter` replaces the MTP drafter (tests, benchmarks). `on_prefill`
        is accepted for the Engine protocol; the image prompt's prefill, bounded by the
        converted cache length, reports no progress."""
        from engines.glm_ocr.batch import OcrBatch

        return OcrBatch(self, max_batch=1).generate(request, should_stop, drafter=drafter)

    def sequence(self, request: Request, should_stop: ShouldStop | None = None,
                 drafter: Proposer | None = None) -> tuple[Sequence, Prompt]:
        """The request checked (EngineError), its image read into the prompt, and its Sequence:
        what the batch (batch.py) starts from."""
        prompt = self._prompt(request)
        return self._sequence(request, prompt, drafter, should_stop), prompt

    def count_prompt_tokens(self, request: Request) -> int:
        """The prompt's length in tokens, one per merged image patch included, as `_prompt`
        builds it (a server reports it): from the image's size in its header, not decoded."""
        from engines.glm_ocr.image import upright_size

        self._check(request)
        size = upright_size(request.image)
        config, _ = self._fit_image(size, request)
        return len(self._prompt_ids(request, self._image_tokens(size, config)))

    # -- helpers ------------------------------------------------------------------------------

    def _prompt(self, request: Request) -> Prompt:
        """Prompt ids, their embeddings (image features in place of the image tokens), the
        mRoPE positions, and a note if the image had to be downscaled to fit the context."""
        from engines.glm_ocr.image import num_image_tokens, preprocess

        image, config, note = self._page(request)
        pixel_values, grid = preprocess(image, config)
        grid_thw = tuple(int(x) for x in grid[0])
        merge = self.config.vision.spatial_merge_size
        ids = self._prompt_ids(request, num_image_tokens(grid, merge))
        if len(ids) + self.runtime.seq_len > self.runtime.cache_length:
            raise EngineError(
                f"the prompt ({len(ids)} tokens for a {grid_thw[2] * 14}x{grid_thw[1] * 14} image) does not fit "
                f"the model's context of {self.runtime.cache_length}; use a smaller image")
        embeds = self.runtime.embeddings[np.asarray(ids)].copy()
        embeds[np.asarray(ids) == self.config.image_token_id] = self.runtime.encode_image(pixel_values, grid_thw)
        positions, delta = prompt_positions(ids, self.config.image_token_id, grid_thw, merge)
        return Prompt(ids, embeds, Positions(positions, delta), note)

    def _page(self, request: Request):
        """The request checked (EngineError) and its image read: (image, the processor config
        it is read with, a note if it was downscaled to fit the context)."""
        from engines.glm_ocr.image import load_image

        self._check(request)
        image = load_image(request.image)
        config, note = self._fit_image(image.size, request)
        return image, config, note

    @staticmethod
    def _check(request: Request) -> None:
        if request.kind != "ocr":
            raise EngineError(f"the OCR engine cannot run a {request.kind!r} request")
        if not request.image:
            raise EngineError("no image given")
        if request.max_tokens < 1:
            raise EngineError(f"max_tokens must be at least 1, got {request.max_tokens}")

    def _prompt_ids(self, request: Request, n_image: int) -> list[int]:
        return prompt_ids(self.tokenizer, request.task, n_image, self.config.image_token_id)

    @staticmethod
    def _image_tokens(size: tuple[int, int], config) -> int:
        """How many image tokens `config` reads an image of `size` (width, height) into: one
        per merged patch of its resized size (what the processor's grid gives)."""
        from engines.glm_ocr.image import smart_resize

        h, w = smart_resize(size[1], size[0], config)
        return (h // config.factor) * (w // config.factor)

    def _fit_image(self, size: tuple[int, int], request: Request):
        """A page whose image tokens would not leave room in the context for the text around
        them and for the answer is read at a lower resolution rather than refused: the pixel
        budget shrinks so that image tokens + prompt text + room to answer (up to a quarter
        of the context) fit. Returns (processor config, note or None)."""
        from dataclasses import replace

        from engines.glm_ocr.image import smart_resize

        config = self.image_config
        text_tokens = len(self._prompt_ids(request, 0))
        answer_room = min(request.max_tokens, self.runtime.cache_length // 4)
        budget = self.runtime.cache_length - text_tokens - answer_room - self.runtime.seq_len
        if self._image_tokens(size, config) <= budget:
            return config, None
        width, height = size
        h, w = smart_resize(height, width, config)
        pixels_per_token = config.factor**2 * config.temporal_patch_size  # max_pixels counts both frames
        fitted = replace(config, max_pixels=max(budget, 1) * pixels_per_token)
        if fitted.max_pixels < config.min_pixels:
            raise EngineError(f"the model's context of {self.runtime.cache_length} tokens has no room for an image")
        h2, w2 = smart_resize(height, width, fitted)
        return fitted, (f"image read at {w2}x{h2} instead of {w}x{h} to fit the context of "
                        f"{self.runtime.cache_length} tokens (convert with a larger --cache-length for full resolution)")

    def _sequence(self, request: Request, prompt: Prompt, drafter: Proposer | None,
                  should_stop: ShouldStop | None) -> Sequence:
        """The request's Sequence: its drafter (MTP, n-gram or composed), schedule and output.
        --steps auto picks k from this run's measured verify costs and acceptance (`specscope
        tune` profiles chat models; an OCR run measures itself, the adaptive controller until it
        can)."""
        spec = request.spec
        if spec.method not in ("off", "mtp", "ngram"):
            raise EngineError(f"the OCR engine speculates with 'mtp' or 'ngram' (or 'off'), not {spec.method!r}")
        note = None
        if spec.enabled and drafter is None:
            drafter, note = self._drafter(request, prompt)
        out = Output(self.tokenizer.stream(), set(self.config.eos_token_ids), request.max_tokens, request.stop,
                     self._guard(request))
        ctx = OcrContext(list(prompt.ids), request.sampling, embeds=prompt.embeds)
        return Sequence.begin(request, ctx, drafter if spec.enabled else None, out,
                              profile=for_spec(spec, self.model_path), notes=(prompt.note, note),
                              should_stop=should_stop)

    def _drafter(self, request: Request, prompt: Prompt) -> tuple[Proposer | None, str | None]:
        spec = request.spec
        ngram = NGramProposer(spec.ngram_min, spec.ngram_max)
        if spec.method == "ngram":
            return ngram, None
        if self.runtime.mtp_unavailable:
            return None, f"{self.runtime.mtp_unavailable}; decoding plainly"
        mtp = MtpDrafter(self.runtime, prompt.positions, self.config.eos_token_ids, self.mtp_group)
        if spec.compose_ngram:
            return ComposedProposer(mtp, ngram, self.draft_costs, max_drafts=self.runtime.seq_len - 1), None
        return mtp, None

    def _guard(self, request: Request) -> RepetitionDetector | None:
        """A fresh detector per run: the request's copies, the engine's span and period."""
        r = self.repetition
        if r is None or not request.max_repeat:
            return None
        return RepetitionDetector(copies=request.max_repeat, min_span=r.min_span, max_period=r.max_period)

    def prefill(self, prompt: Prompt) -> np.ndarray:
        """The prompt through the runtime's own cache in prefill_len chunks (reset first): the
        final-normed hidden state of every prompt row."""
        self.runtime.reset()
        s = self.runtime.prefill_len
        out = []
        for start in range(0, len(prompt.embeds), s):
            n = min(s, len(prompt.embeds) - start)
            cos, sin = text_rope(prompt.positions.rows(start, n), self.config.text)
            out.append(self.runtime.decode(prompt.embeds[start : start + n], start, cos, sin))
        return np.concatenate(out)

    def forward(self, tokens: list[int], start: int, positions: Positions) -> np.ndarray:
        """One target forward over `tokens` at cache rows start..: their final-normed hidden states."""
        cos, sin = text_rope(positions.rows(start, len(tokens)), self.config.text)
        return self.runtime.decode(self.runtime.embeddings[np.asarray(tokens)], start, cos, sin)
