"""Pipeline parallel: each rank holds a run of the target's layers, in order, and the hidden
state travels from rank to rank (`mx.distributed.send` / `recv`, MLX's own transport) -- for
the architectures mlx-lm cannot split by heads (Gemma 3, Gemma 4) or whose heads do not divide
by the ranks (SmolLM2's 9 / 3), and for an MTP drafter (it reads one layer's whole K/V).

The stages run 1 -> 2 -> ... -> N-1 -> 0: rank 1 embeds the tokens and runs the first layers,
rank 0 the last ones, the final norm and the head. So rank 0 -- the server, the batch loop and
the drafters (engines/distributed/engine.py) -- holds what a drafter reads: the Gemma 4
assistant cross-attends into the K/V of the last sliding and the last full layer that own a
cache (Gemma4Target.kv_layers) and reads the final hidden state; a drafter trained here reads
the last layer's. Gemma 4's KV-shared layers (E2B/E4B: the last `num_kv_shared_layers` reuse
the K/V of exactly those two layers, see mlx_lm/models/gemma4_text.py `previous_kvs`) then run
on rank 0 beside their sources. Every rank holds the token embedding (the first stage embeds,
rank 0's tied head is the embedding, and Gemma 4's per-layer inputs start from it).

A stage reuses mlx-lm's own decoder layers and attention masks; only the loop over the layers
is ours (mlx-lm's runs them all). Every forward moves one [rows, width, hidden] array from
stage to stage; rank 0's message (bus.py) still tells every rank what to run, and the caches
are mirrored as for tensor parallel (mirror.py): each rank fills only its own layers' K/V.

A rank loads only its layers: the model is built lazily (no weight read), the layers it does
not hold are replaced by empty modules before anything is evaluated, and Gemma 4's per-layer
embedding table (most of an E2B's weights) is cut to the columns of its layers."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

from engines.batch.cache import BatchCache
from engines.mlx_chat.loading import materialize
from engines.types import EngineError

# model_type -> how a stage embeds and ends (the layers themselves are mlx-lm's)
DECODERS = ("llama", "gemma3_text")
GEMMA4 = ("gemma4", "gemma4_text")
SUPPORTED = DECODERS + GEMMA4


class Unpipelinable(EngineError):
    """This model cannot be split into stages over these ranks."""


class Absent(nn.Module):
    """A layer this rank does not hold: no parameters, never called. It keeps the layer's
    plain attributes (`use_sliding`, `layer_type`...): mlx-lm's make_cache reads them."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        for key, value in vars(layer).items():
            if not key.startswith("_"):
                setattr(self, key, value)

    def __call__(self, *args, **kwargs):
        raise RuntimeError("a pipeline stage ran a layer it does not hold")


def text_model(model) -> Any:
    """The mlx-lm module whose `.model` has embed_tokens / layers / norm (the text part of a
    multimodal gemma4)."""
    inner = getattr(model, "language_model", None)
    return inner if inner is not None else model


def model_type(model) -> str:
    return getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", "")


def last_stage_from(model) -> int:
    """The first layer rank 0 must hold at the latest: for Gemma 4 the first layer whose K/V
    the assistant reads (they are also the KV-shared layers' sources); else the last layer (a
    drafter trained here reads its K/V)."""
    if model_type(model) in GEMMA4:
        from engines.mlx_chat.mtp import Gemma4Target

        return min(Gemma4Target.of(model).kv_layers.values())
    return len(text_model(model).model.layers) - 1


def plan(layers: int, last_from: int, ranks: int) -> list[tuple[int, int]]:
    """Per rank, the layers [lo, hi) it runs. Rank 0 runs the last stage, starting at
    `last_from` or earlier (a fair share of the layers); ranks 1..N-1 split the layers before
    it evenly, in rank order."""
    lo0 = min(last_from, layers - layers // ranks)
    if lo0 < ranks - 1:
        raise Unpipelinable(f"--ranks {ranks}: a pipeline needs a layer per rank before the last stage, and this "
                            f"model's last {layers - lo0} of {layers} layers must stay on rank 0")
    bounds = [round(i * lo0 / (ranks - 1)) for i in range(ranks)]
    return [(lo0, layers)] + [(bounds[i], bounds[i + 1]) for i in range(ranks - 1)]


def check_pipelinable(model, ranks: int) -> None:
    kind = model_type(model)
    if kind not in SUPPORTED:
        raise Unpipelinable(f"--ranks {ranks}: a {kind!r} model cannot be split into pipeline stages "
                            f"(here: {', '.join(SUPPORTED)})")
    plan(len(text_model(model).model.layers), last_stage_from(model), ranks)


@dataclass
class Stage:
    """This rank's part of the pipeline: layers [lo, hi) of `model`, the hidden state received
    from rank `prev` (None: this stage embeds the tokens) and sent to rank `next` (None: this
    stage ends the model -- rank 0)."""

    model: Any  # the mlx-lm Model; the layers this rank does not hold are Absent
    lo: int
    hi: int
    prev: int | None
    next: int | None
    group: mx.distributed.Group
    wire: mx.Dtype  # the hidden state's dtype at this stage's input (what one process computes there)

    @property
    def kind(self) -> str:
        return model_type(self.model)

    @property
    def inner(self):
        return text_model(self.model).model

    def __call__(self, cache: BatchCache, tokens: mx.array, h: mx.array | None = None) -> tuple[mx.array, mx.array | None]:
        """One forward of this stage, lazily: (the hidden state to send, None), or on the last
        stage (logits, final-norm hidden states). cache.begin() has been called. `h`: the
        previous stage's output when it comes from this process (tests), else received."""
        h = self._input(tokens) if h is None else h
        h = (self._gemma4 if self.kind in GEMMA4 else self._decoder)(tokens, cache, h)
        if self.next is not None:
            return h, None
        hidden = self.inner.norm(h)
        return head(self.model, hidden), hidden

    def send(self, h: mx.array) -> mx.array:
        return mx.distributed.send(h, self.next, group=self.group, stream=mx.cpu)

    def _input(self, tokens: mx.array) -> mx.array:
        if self.prev is None:
            return embed(self.model, tokens)
        shape = (*tokens.shape, text_model(self.model).args.hidden_size)
        return mx.distributed.recv(shape, self.wire, self.prev, group=self.group, stream=mx.cpu)

    def _decoder(self, tokens: mx.array, cache: BatchCache, h: mx.array) -> mx.array:
        """llama / gemma3_text: layer(h, mask, cache), the mask from the layer's own cache
        (the slot table knows its window), as mlx-lm's model loop passes it."""
        layers, masks = self.inner.layers, {}
        for i in range(self.lo, self.hi):
            table = id(cache.layers[i].table)
            if table not in masks:
                masks[table] = create_attention_mask(h, cache.layers[i])
            h = layers[i](h, masks[table], cache.layers[i])
        return h

    def _gemma4(self, tokens: mx.array, cache: BatchCache, h: mx.array) -> mx.array:
        """mlx-lm's Gemma4TextModel loop over this stage's layers: per-layer inputs (E2B/E4B),
        a mask per attention type, and the K/V a KV-shared layer reuses from its source."""
        inner = self.inner
        per_layer = self._per_layer_inputs(tokens)
        caches = cache.layers + [None] * (len(inner.layers) - len(cache.layers))
        masks, shared = {}, {}
        for i in range(self.lo, self.hi):
            layer, source = inner.layers[i], inner.previous_kvs[i]
            kind = layer.layer_type
            if kind not in masks:
                window = inner.window_size if kind == "sliding_attention" else None
                masks[kind] = create_attention_mask(h, caches[source], window_size=window)
            kvs, offset = shared.get(source, (None, None))
            pli = per_layer[:, :, i - self.lo, :] if per_layer is not None else None
            h, kvs, offset = layer(h, masks[kind], caches[i], per_layer_input=pli, shared_kv=kvs, offset=offset)
            shared[i] = (kvs, offset)
        return h

    def _per_layer_inputs(self, tokens: mx.array) -> mx.array | None:
        """Gemma 4's per-layer inputs for this stage's layers, as mlx-lm computes them for all:
        the per-layer embedding (cut to these layers' columns at load) plus a projection of the
        scaled token embedding (computed whole -- it is small -- and cut, so each value is
        the one a single process computes)."""
        inner = self.inner
        d = inner.hidden_size_per_layer_input
        if not d:
            return None
        per_layer = inner.embed_tokens_per_layer(tokens) * inner.embed_tokens_per_layer_scale
        per_layer = mx.unflatten(per_layer, -1, (-1, d))
        if per_layer.shape[2] == len(inner.layers):  # the table was not cut (a quantized one; the dtype probe)
            per_layer = per_layer[:, :, self.lo:self.hi]
        projected = inner.per_layer_model_projection(embed(self.model, tokens)) * inner.per_layer_projection_scale
        projected = mx.unflatten(projected, -1, (len(inner.layers), d))[:, :, self.lo:self.hi]
        projected = inner.per_layer_projection_norm(projected)
        return (projected + per_layer) * inner.per_layer_input_scale


def embed(model, tokens: mx.array) -> mx.array:
    """The first layer's input, exactly as mlx-lm's model computes it."""
    inner = text_model(model).model
    h = inner.embed_tokens(tokens)
    kind = model_type(model)
    if kind in GEMMA4:
        return h * inner.embed_scale
    if kind == "gemma3_text":
        return h * mx.array(inner.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)
    return h


def head(model, hidden: mx.array) -> mx.array:
    """Logits from final-norm hidden states, as mlx-lm's Model.__call__ computes them."""
    text = text_model(model)
    inner = text.model
    tied = getattr(text, "tie_word_embeddings", None)
    if tied is None:
        tied = getattr(text.args, "tie_word_embeddings", False)
    out = inner.embed_tokens.as_linear(hidden) if tied or "lm_head" not in text else text.lm_head(hidden)
    softcap = getattr(text, "final_logit_softcapping", None)
    if softcap is not None:
        from mlx_lm.models import gemma4_text

        out = gemma4_text.logit_softcap(softcap, out)
    return out


def make_stage(model, group: mx.distributed.Group | None, rank: int | None = None, ranks: int | None = None) -> Stage:
    """This rank's stage of a lazily loaded model: the layers it does not hold are dropped
    before any weight is read, then its own are read, one layer at a time. (`rank` / `ranks`
    default to the group's; a test builds every stage in one process.)"""
    rank = group.rank() if rank is None else rank
    ranks = group.size() if ranks is None else ranks
    inner = text_model(model).model
    layers = len(inner.layers)
    stages = plan(layers, last_stage_from(model), ranks)
    lo, hi = stages[rank]
    order = list(range(1, ranks)) + [0]  # the stages' order: rank 1 first, rank 0 last
    at = order.index(rank)
    prev = order[at - 1] if at else None
    nxt = order[at + 1] if at + 1 < ranks else None
    wire = boundary_dtype(model, lo)
    for i in range(layers):
        if not lo <= i < hi:
            inner.layers[i] = Absent(inner.layers[i])
    text = text_model(model)
    if nxt is not None and "lm_head" in text:  # only the last stage has a head
        text.lm_head = Absent(text.lm_head)
    if getattr(inner, "hidden_size_per_layer_input", 0):
        d = inner.hidden_size_per_layer_input
        table = inner.embed_tokens_per_layer
        if isinstance(table, nn.Embedding):  # (a quantized table is kept whole)
            table.weight = mx.contiguous(table.weight[:, lo * d:hi * d])
    for i in range(lo, hi):
        mx.eval(inner.layers[i].parameters())
    mx.eval(model.parameters())
    materialize(model)  # what mlx-lm keeps beside the parameters (loading.materialize says why)
    return Stage(model, lo, hi, prev, nxt, group, wire)


def boundary_dtype(model, layer: int) -> mx.Dtype:
    """The hidden state's dtype entering `layer`, as one process computes it: the whole
    model's graph is built on one token -- lazily, on weights not yet read, and never
    evaluated -- so every rank knows what the previous stage will send."""
    full = Stage(model, 0, layer, None, 0, None, mx.float32)
    cache = BatchCache(model, 1)
    cache.begin(1)
    h = full._input(mx.zeros((1, 1), dtype=mx.uint32))
    h = (full._gemma4 if full.kind in GEMMA4 else full._decoder)(mx.zeros((1, 1), dtype=mx.uint32), cache, h)
    return h.dtype


def run_stage(stage: Stage, cache: BatchCache, tokens: mx.array, evaluate: int) -> tuple[mx.array | None, mx.array | None]:
    """One forward of this rank's stage, evaluated now (the transfers run now, in this order,
    as mirror.run_forward's collectives do): an earlier stage computes its layers and sends
    the hidden state on; the last stage receives it and returns (logits, hidden), or with
    KV_ONLY (a prefill chunk, whose logits are never read) evaluates only its K/V."""
    from engines.distributed.mirror import KV_ONLY

    cache.begin(tokens.shape[1])
    out, hidden = stage(cache, tokens)
    if stage.next is not None:
        mx.eval(stage.send(out), *cache.arrays())
        return None, None
    mx.eval(cache.arrays() if evaluate == KV_ONLY else [out, hidden])
    return out, hidden


def tables_checksum(cache: BatchCache) -> int:
    """--check-ranks in a pipeline (only rank 0 has logits): a digest of the mirrored cache's
    slot tables, which every rank must hold alike for their layers' K/V to line up."""
    digest = 0
    for t in cache.tables:
        digest = zlib.crc32(t.next_pos.tobytes(), zlib.crc32(t.pos.tobytes(), digest))
    return digest
