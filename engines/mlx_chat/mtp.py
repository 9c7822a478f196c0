"""Gemma 4 MTP: the glue between an mlx-lm Gemma 4 target and the assistant drafter.

What the drafter needs from the target (see gemma4_assistant.py for the drafter itself):
  - the target's scaled token embedding of the last token,
  - the target's final-norm hidden state at the last *accepted* position (never a rejected
    draft's: the reference's h_idx lesson),
  - K/V from the target's cache: the last full-attention layer with a cache for the drafter's
    full layers, the last sliding layer for its sliding layers,
  - the last token's position (held for every chained step).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models import gemma4_text

from engines import EngineError
from engines.mlx_chat.gemma4_assistant import Model as Assistant


def gemma4_text_model(model) -> gemma4_text.Model:
    """The mlx-lm Gemma 4 text model inside a target (`gemma4_text`, or the text part of
    `gemma4`)."""
    if isinstance(model, gemma4_text.Model):
        return model
    inner = getattr(model, "language_model", None)
    if isinstance(inner, gemma4_text.Model):
        return inner
    raise EngineError(
        f"--spec mtp needs a Gemma 4 target (gemma4 / gemma4_text); this model is "
        f"{getattr(model, 'model_type', type(model).__name__)}"
    )


@dataclass
class Gemma4Target:
    """A view of an mlx-lm Gemma 4 target with what MTP needs."""

    text: gemma4_text.Model
    kv_layer: dict[str, int]  # attention type -> index of the target layer whose cache it reads
    sliding_window: int

    @classmethod
    def of(cls, model) -> "Gemma4Target":
        text = gemma4_text_model(model)
        args = text.args
        with_cache = args.num_hidden_layers - args.num_kv_shared_layers  # layers that own a cache
        kv_layer = {}
        for i in range(with_cache):
            kv_layer[args.layer_types[i]] = i  # the last one of each type wins
        return cls(text=text, kv_layer=kv_layer, sliding_window=args.sliding_window)

    @property
    def hidden_size(self) -> int:
        return self.text.args.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.text.args.vocab_size

    def embed(self, tokens: mx.array) -> mx.array:
        """Scaled input embedding, as the target scales it (Gemma: * sqrt(hidden))."""
        inner = self.text.model
        return inner.embed_tokens(tokens) * inner.embed_scale  # exactly as mlx-lm's target does

    def forward(self, tokens: mx.array, cache: list) -> tuple[mx.array, mx.array]:
        """The target forward that also returns the final-norm hidden states:
        (logits [1, L, vocab], hidden [1, L, hidden])."""
        text = self.text
        hidden = text.model(tokens, cache=cache)
        if text.tie_word_embeddings:
            logits = text.model.embed_tokens.as_linear(hidden)
        else:
            logits = text.lm_head(hidden)
        if text.final_logit_softcapping is not None:
            logits = gemma4_text.logit_softcap(text.final_logit_softcapping, logits)
        return logits, hidden

    def drafter_kv(self, cache: list) -> dict[str, tuple[mx.array, mx.array]]:
        """K/V the drafter reads, per attention type, in temporal order: every cached position
        for full attention; for sliding attention the last `sliding_window` positions, i.e.
        the window of the last cached token (the rotating cache's steady state)."""
        kv = {}
        for kind, idx in self.kv_layer.items():
            keys, values = cache_keys_values(cache[idx])
            if kind == "sliding_attention":
                keys, values = keys[..., -self.sliding_window :, :], values[..., -self.sliding_window :, :]
            kv[kind] = (keys, values)
        return kv


def cache_keys_values(c) -> tuple[mx.array, mx.array]:
    """A layer cache's keys/values [1, heads, n, dim] in temporal order, oldest first."""
    if hasattr(c, "_temporal_order"):  # mlx-lm RotatingKVCache: a ring buffer
        return c._temporal_order(c.keys), c._temporal_order(c.values)
    return c.keys[..., : c.offset, :], c.values[..., : c.offset, :]


def check_compatible(target: Gemma4Target, drafter: Assistant) -> None:
    """Raise EngineError with one clear line if the drafter cannot serve this target."""
    if drafter.backbone_hidden_size != target.hidden_size:
        raise EngineError(
            f"MTP drafter does not fit this target: it was built for a backbone of width "
            f"{drafter.backbone_hidden_size}, the target's hidden size is {target.hidden_size}"
        )
    if drafter.vocab_size != target.vocab_size:
        raise EngineError(
            f"MTP drafter does not fit this target: vocabulary {drafter.vocab_size} vs {target.vocab_size}"
        )
    missing = set(drafter.layer_types) - set(target.kv_layer)
    if missing:
        raise EngineError(f"MTP drafter reads {sorted(missing)} K/V that this target does not have")
    targs, dargs = target.text.args, drafter.text
    want = {"sliding_attention": targs.head_dim, "full_attention": targs.global_head_dim or targs.head_dim}
    have = {"sliding_attention": dargs.head_dim, "full_attention": dargs.global_head_dim or dargs.head_dim}
    for kind in set(drafter.layer_types):
        if want[kind] != have[kind]:
            raise EngineError(
                f"MTP drafter does not fit this target: {kind} head size {have[kind]} vs {want[kind]}"
            )
