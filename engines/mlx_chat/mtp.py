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
from typing import Any, Callable

import mlx.core as mx
from mlx_lm.models import gemma4_text

from engines.types import EngineError, one_line
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
    kv_layers: dict[str, int]  # attention kind -> index of the target layer whose cache the drafter's layers of that kind read
    sliding_window: int

    @classmethod
    def of(cls, model) -> "Gemma4Target":
        text = gemma4_text_model(model)
        args = text.args
        with_cache = args.num_hidden_layers - args.num_kv_shared_layers  # layers that own a cache
        kv_layers = {}
        for i in range(with_cache):
            kv_layers[args.layer_types[i]] = i  # the last one of each type wins
        return cls(text=text, kv_layers=kv_layers, sliding_window=args.sliding_window)

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

    def check_compatible(self, drafter: Assistant) -> None:
        """Raise EngineError with one clear line if the drafter cannot serve this target."""
        if drafter.backbone_hidden_size != self.hidden_size:
            raise EngineError(
                f"MTP drafter does not fit this target: it was built for a backbone of width "
                f"{drafter.backbone_hidden_size}, the target's hidden size is {self.hidden_size}"
            )
        if drafter.vocab_size != self.vocab_size:
            raise EngineError(
                f"MTP drafter does not fit this target: vocabulary {drafter.vocab_size} vs {self.vocab_size}"
            )
        missing = set(drafter.layer_types) - set(self.kv_layers)
        if missing:
            raise EngineError(f"MTP drafter reads {sorted(missing)} K/V that this target does not have")
        targs, dargs = self.text.args, drafter.text
        want = {"sliding_attention": targs.head_dim, "full_attention": targs.global_head_dim or targs.head_dim}
        have = {"sliding_attention": dargs.head_dim, "full_attention": dargs.global_head_dim or dargs.head_dim}
        for kind in set(drafter.layer_types):
            if want[kind] != have[kind]:
                raise EngineError(
                    f"MTP drafter does not fit this target: {kind} head size {have[kind]} vs {want[kind]}"
                )


@dataclass
class MtpSource:
    """What a request's MTP drafting is made of: the drafter, the target view it reads (a
    Gemma4Target, or drafter.TargetView for a drafter trained here), and the drafter's step
    (compiled unless the engine's mtp_options say otherwise). The batch drafts with it for all
    its MTP rows at once (engines/batch/mtp.py)."""

    drafter: Any
    target: Any
    step: Callable


def load_drafter(path: str):
    """The MTP drafter at `path` -- a drafter trained here (drafter.py) or a Gemma 4
    assistant -- with one-line EngineErrors for what a user can get wrong."""
    from pathlib import Path

    from engines.mlx_chat import drafter as trained
    from engines.mlx_chat.gemma4_assistant import load_assistant

    if trained.is_drafter_dir(path):
        return trained.load_drafter(path)
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise EngineError(f"MTP drafter not found: {path} (expected a Gemma 4 assistant directory)")
    try:
        drafter = load_assistant(p)
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise EngineError(f"cannot load the MTP drafter in {path}: {one_line(e)}") from e
    from engines.mlx_chat.loading import materialize

    materialize(drafter)  # its full-attention layers' RoPE `_freqs`: a server drafts in another thread
    return drafter


def is_assistant_dir(path: str) -> bool:
    """Whether `path` holds an MTP drafter rather than a language model: a Gemma 4 assistant
    (config.json model_type gemma4_assistant) or a drafter trained here (specscope_drafter)."""
    import json
    from pathlib import Path

    from engines.mlx_chat.drafter import MODEL_TYPE

    cfg = Path(path).expanduser() / "config.json"
    try:
        return json.loads(cfg.read_text()).get("model_type") in ("gemma4_assistant", MODEL_TYPE)
    except (OSError, ValueError, AttributeError):
        return False


def preload_drafter(engine, path: str) -> None:
    """Load the assistant with the engine (ChatEngine.load(..., draft_model=ASSISTANT_DIR))."""
    engine.__dict__.setdefault("mtp_drafters", {})[path] = load_drafter(path)


def mtp_drafter(engine, request) -> MtpSource:
    """The MTP drafter `--spec mtp` asks for, checked against the engine's target. Drafters are
    loaded once per engine and kept in `engine.mtp_drafters` (path -> drafter; tests may put a
    drafter of their own there)."""
    path = request.spec.draft_model or engine.draft_path
    if not path:
        raise EngineError("--spec mtp needs an MTP drafter: the Gemma 4 assistant or a drafter trained with `specscope drafter train` (--draft-model DIR)")
    drafters = engine.__dict__.setdefault("mtp_drafters", {})
    if path not in drafters:
        drafters[path] = load_drafter(path)
    from engines.mlx_chat.drafter import Drafter, TargetView

    drafter = drafters[path]
    if isinstance(drafter, Drafter):  # a drafter trained here reads the target through TargetView
        if drafter.target is None or drafter.target.model is not engine.model:
            drafter.attach(TargetView.of(engine.model))
        target = drafter.target  # the view that returns the layers this drafter reads
    else:  # the Gemma 4 assistant (or a test's wrapper of one)
        target = Gemma4Target.of(engine.model)
    target.check_compatible(drafter)
    step = drafter.compiled_step() if engine.mtp_options.compiled else drafter.step
    return MtpSource(drafter, target, step)
