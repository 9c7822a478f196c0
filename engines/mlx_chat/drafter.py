"""A drafter for any supported mlx-lm target, trained on the user's machine (engines/training).

The shape is the Gemma 4 assistant's (gemma4_assistant.py) and EAGLE's (Li et al. 2024,
"EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty"): a single decoder layer
that reads the target's last hidden state and the next token's embedding, and the target's own
embeddings and LM head (frozen, never stored with the drafter). One step:

    x      = pre_projection(concat(norm(target_embed(token)),          [EAGLE's fc, Gemma 4's
                               norm(h_prev)))                           pre_projection; the norms
                                                                        are EAGLE-3's]
    x      = x + attention(norm(x))     queries only; K/V are the target's own, read from its
                                        cache at one layer (the last full-attention layer), as
                                        the Gemma 4 assistant does -- so the drafter keeps no
                                        cache and has nothing to roll back
    x      = x + mlp(norm(x))           (SwiGLU, the target's width)
    h_next = norm(x)                    -> the next step's h_prev, in the space of the target's
                                        final-norm hidden state (EAGLE predicts the feature)
    logits = target_lm_head(h_next), over the drafter's vocabulary only

The drafter's vocabulary is the K tokens the target emits most often in the training data
(FR-Spec, Zhao et al. 2025: a frequency-ranked draft head; EAGLE-3 uses a 32k draft vocabulary):
SmolLM2's head has 49k rows and dominates a one-layer drafter's cost, in training as in drafting.
The other tokens get a logit of MASK_VALUE: the drafter never proposes them, and the verifier
sees a full-vocabulary q whose mass is on the K tokens (lossless either way: q is what was drafted from).

Chained for depth: step d+1 embeds step d's token and reads step d's h_next. The query
position stays the position of the chain's first token for every step (as Gemma 4's assistant
does), and the K/V it reads end just before that token.

`TargetView` is what the drafter and the batch's MTP rows need from a target: the scaled embedding,
a forward that returns logits and final hidden states, and the K/V view. It knows the
llama-family layout of mlx-lm (llama, mistral, qwen2) and gemma3_text.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engines.types import EngineError, one_line
from engines.mlx_chat.gemma4_assistant import DraftStep, compile_step  # one step record, one compiler for both drafters

MODEL_TYPE = "specscope_drafter"
MASK_VALUE = -1e30  # logit of a token outside the drafter's vocabulary (as gemma4_assistant's centroid head)
SUPPORTED = ("llama", "mistral", "qwen2", "gemma3_text")  # mlx-lm model_type of the target


# -- the target, as the drafter sees it ----------------------------------------------------------


@dataclass
class TargetView:
    """An mlx-lm llama-family or gemma3_text target: what drafting and training read."""

    model: Any  # the mlx-lm Model (llama.Model, gemma3_text.Model, ...)
    model_type: str
    kv_layer: int  # the target layer whose K/V the drafter reads
    # target layers whose outputs the drafter reads beside the final-norm state (EAGLE-3's
    # low / mid features); () = the final state only
    feature_layers: tuple[int, ...] = ()

    @classmethod
    def of(cls, model, feature_layers=()) -> "TargetView":
        model_type = getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", None)
        if model_type not in SUPPORTED:
            raise EngineError(
                f"a trained drafter needs a target of type {', '.join(SUPPORTED)}; this model is {model_type}"
            )
        layers = model.model.layers
        kv_layer = len(layers) - 1
        if model_type == "gemma3_text":  # the last full-attention layer: its K/V cover every position
            kv_layer = max(i for i, layer in enumerate(layers) if not layer.self_attn.is_sliding)
        feature_layers = tuple(int(i) for i in feature_layers)
        if any(not 0 <= i < len(layers) - 1 for i in feature_layers):
            raise EngineError(f"feature layers {list(feature_layers)}: this target has layers 0..{len(layers) - 2} below its last")
        for i in feature_layers:
            _tap(layers[i])
        return cls(model, model_type, kv_layer, feature_layers)

    @property
    def args(self):
        return self.model.args

    @property
    def hidden_size(self) -> int:
        return self.args.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def attention(self):
        return self.model.model.layers[self.kv_layer].self_attn

    @property
    def n_heads(self) -> int:
        return self.attention.n_heads

    @property
    def n_kv_heads(self) -> int:
        return self.attention.n_kv_heads

    @property
    def head_dim(self) -> int:
        attn = self.attention
        return getattr(attn, "head_dim", None) or self.args.hidden_size // attn.n_heads

    @property
    def kv_layers(self) -> dict[str, int]:
        """The one K/V the drafter reads ("target": the last full-attention layer's cache), in
        mtp.Gemma4Target.kv_layers' shape."""
        return {"target": self.kv_layer}

    def embed(self, tokens: mx.array) -> mx.array:
        """The target's input embedding, scaled as the target scales it (Gemma: sqrt(hidden),
        rounded through bfloat16 as mlx-lm's gemma3_text does)."""
        h = self.model.model.embed_tokens(tokens)
        if self.model_type == "gemma3_text":
            h = h * mx.array(self.hidden_size**0.5, mx.bfloat16).astype(h.dtype)
        return h

    def lm_head(self, hidden: mx.array) -> mx.array:
        """The target's own LM head (tied or not) over final-norm hidden states."""
        if getattr(self.model.args, "tie_word_embeddings", False) or "lm_head" not in self.model:
            return self.model.model.embed_tokens.as_linear(hidden)
        return self.model.lm_head(hidden)

    def head_rows(self, ids: mx.array) -> mx.array:
        """The LM head's rows for token ids [K] -> [K, D] (dequantized if the head is packed)."""
        if getattr(self.model.args, "tie_word_embeddings", False) or "lm_head" not in self.model:
            return self.model.model.embed_tokens(ids)  # an embedding (quantized or not) returns rows
        head = self.model.lm_head
        if isinstance(head, nn.QuantizedLinear):
            w = mx.dequantize(head.weight, head.scales, head.biases, head.group_size, head.bits)
            return w[ids]
        return head.weight[ids]

    @property
    def feature_size(self) -> int:
        """The width of what forward() returns beside the logits: D per layer read."""
        return self.hidden_size * (len(self.feature_layers) + 1)

    def forward(self, tokens: mx.array, cache: list | None) -> tuple[mx.array, mx.array]:
        """(logits [1, L, V], features [1, L, feature_size]): the target's own forward, split
        before its head (mlx-lm's Model.__call__ is model.model then the head). The features
        are the final-norm hidden state, preceded by the outputs of feature_layers (their
        residual streams, as the layers left them) when the drafter reads several layers."""
        hidden = self.model.model(tokens, cache=cache)
        logits = self.lm_head(hidden)
        if self.feature_layers:
            layers = self.model.model.layers
            hidden = mx.concatenate([*(layers[i].tapped for i in self.feature_layers), hidden], axis=-1)
        return logits, hidden

    def check_compatible(self, drafter: "Drafter") -> None:
        a = drafter.args
        want = (self.model_type, self.hidden_size, self.vocab_size, self.n_heads, self.n_kv_heads, self.head_dim, self.kv_layer)
        have = (a.target_model_type, a.hidden_size, a.vocab_size, a.n_heads, a.n_kv_heads, a.head_dim, a.kv_layer)
        if want != have:
            raise EngineError(
                f"this drafter was trained for another target: (type, hidden, vocab, heads, kv heads, head dim, "
                f"K/V layer) {have} vs the target's {want}"
            )


def default_feature_layers(n_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low / mid / high layers (SpecForge's choice: 1, n/2 - 1, n - 4), those below
    the last: SmolLM2's 30 layers -> (1, 14, 26); a 2-layer test model -> (0,)."""
    return tuple(sorted({i for i in (1, n_layers // 2 - 1, n_layers - 4) if 0 <= i < n_layers - 1}))


def _tap(layer) -> None:
    """Make a target layer keep its last output (`layer.tapped`), so a forward can return it
    beside the final state. The layer's class is swapped for a subclass that records after
    calling the original: its parameters, their names and the model's own forward are untouched
    (mlx-lm has no hook for intermediate states). Idempotent; costs one attribute write per call."""
    base = type(layer)
    if getattr(base, "records_output", False):
        return

    def call(self, *args, **kwargs):
        out = base.__call__(self, *args, **kwargs)
        object.__setattr__(self, "tapped", out)  # not a parameter: kept outside the module's dict
        return out

    layer.__class__ = type(f"Tapped{base.__name__}", (base,), {"__call__": call, "records_output": True})


# -- the drafter -----------------------------------------------------------------------------------


@dataclass
class DrafterArgs:
    target_model_type: str
    hidden_size: int
    vocab_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    kv_layer: int
    intermediate_size: int
    draft_vocab: int  # K: tokens the drafter can propose (vocab_ids)
    rms_norm_eps: float = 1e-6
    # RMSNorm on the embedding and on h_prev before pre_projection (EAGLE-3's input_layernorm
    # and hidden_norm). False for drafters trained before it (their config has no such key).
    input_norms: bool = False
    # target layers read beside the final state (EAGLE-3's feature fusion: their outputs, each
    # RMS-normed, and the final state go through one linear layer to D); [] = the final state only
    feature_layers: list[int] = field(default_factory=list)
    model_type: str = MODEL_TYPE
    extra: dict = field(default_factory=dict)  # the training record (model card), not read here

    @classmethod
    def for_target(cls, target: TargetView, draft_vocab: int) -> "DrafterArgs":
        return cls(
            feature_layers=list(target.feature_layers),
            draft_vocab=min(draft_vocab, target.vocab_size),
            target_model_type=target.model_type,
            hidden_size=target.hidden_size,
            vocab_size=target.vocab_size,
            n_heads=target.n_heads,
            n_kv_heads=target.n_kv_heads,
            head_dim=target.head_dim,
            kv_layer=target.kv_layer,
            intermediate_size=target.args.intermediate_size,
            rms_norm_eps=float(getattr(target.args, "rms_norm_eps", 1e-6)),
            input_norms=True,
        )


class Drafter(nn.Module):
    def __init__(self, args: DrafterArgs, dropout: float = 0.0):
        super().__init__()
        self.args = args
        d, heads, hd = args.hidden_size, args.n_heads, args.head_dim
        if args.feature_layers:
            self.feature_norms = [nn.RMSNorm(d, eps=args.rms_norm_eps) for _ in args.feature_layers]
            self.fuse = nn.Linear(d * (len(args.feature_layers) + 1), d, bias=False)
        self.dropout = nn.Dropout(dropout)  # training only (train.py); a no-op in eval mode
        if args.input_norms:
            self.embed_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
            self.hidden_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.pre_projection = nn.Linear(2 * d, d, bias=False)
        self.input_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.q_proj = nn.Linear(d, heads * hd, bias=False)
        self.q_norm = nn.RMSNorm(hd, eps=args.rms_norm_eps)  # queries meet keys of a fixed scale
        self.o_proj = nn.Linear(heads * hd, d, bias=False)
        self.mlp_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.gate_proj = nn.Linear(d, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, d, bias=False)
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.vocab_ids = mx.arange(args.draft_vocab, dtype=mx.int32)  # set by training; frozen
        # the layer's two exponential-heavy ops: training on a CPU swaps in numpy's
        # (engines/cpu/numpy_ops.py: MLX's CPU exp is scalar); drafting keeps these
        self.silu = nn.silu
        self.attention = mx.fast.scaled_dot_product_attention
        self.freeze(keys=["vocab_ids"])
        self._compiled_step = None
        # The target and its head rows are not children: their weights stay the target's.
        object.__setattr__(self, "target", None)  # a TargetView
        object.__setattr__(self, "head", None)  # [K, D] the target's head rows for vocab_ids

    def attach(self, target: TargetView) -> "Drafter":
        """Read this target (self.target: a view that returns the layers this drafter reads)."""
        target.check_compatible(self)
        if tuple(self.args.feature_layers) != target.feature_layers:
            target = TargetView.of(target.model, self.args.feature_layers)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "head", mx.stop_gradient(target.head_rows(self.vocab_ids)))
        mx.eval(self.head)
        self._compiled_step = None
        return self

    def sub_logits(self, h: mx.array) -> mx.array:
        """[..., D] -> [..., K] float32 logits over the drafter's vocabulary."""
        return (h @ self.head.T).astype(mx.float32)

    def full_logits(self, h: mx.array) -> mx.array:
        """[..., D] -> [..., V]: the drafter's vocabulary scattered into the target's,
        MASK_VALUE elsewhere."""
        sub = self.sub_logits(h)
        full = mx.full((*h.shape[:-1], self.args.vocab_size), MASK_VALUE, dtype=mx.float32)
        return mx.put_along_axis(full, mx.broadcast_to(self.vocab_ids, sub.shape), sub, axis=-1)

    # -- the layer, over a sequence of queries ----------------------------------------------------
    def layer(self, x: mx.array, keys: mx.array, values: mx.array, mask: mx.array, offset) -> mx.array:
        """x [B, L, D] -> [B, L, D] final-norm states. Queries at positions offset..offset+L-1
        read the target's keys/values [B, kv_heads, n, head_dim] (RoPE already applied) where
        mask [.., L, n] is True."""
        a, t = self.args, self.target
        B, L, _ = x.shape
        q = self.q_proj(self.input_norm(x)).reshape(B, L, a.n_heads, a.head_dim).transpose(0, 2, 1, 3)
        q = t.attention.rope(self.q_norm(q), offset=offset)  # the target layer's own RoPE
        o = self.attention(q, keys, values, scale=t.attention.scale, mask=mask)
        x = x + self.dropout(self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1)))
        h = self.mlp_norm(x)
        x = x + self.dropout(self.down_proj(self.silu(self.gate_proj(h)) * self.up_proj(h)))
        return self.norm(x)

    def fused(self, features: mx.array) -> mx.array:
        """The target's features [..., (n+1) D] -> [..., D]: each tapped layer's output
        RMS-normed (their scales differ by layer), the final state as it is, one linear layer."""
        d = self.args.hidden_size
        parts = [norm(features[..., i * d:(i + 1) * d]) for i, norm in enumerate(self.feature_norms)]
        return self.fuse(mx.concatenate([*parts, features[..., -d:]], axis=-1))

    def inputs(self, embedding: mx.array, h_prev: mx.array) -> mx.array:
        """The layer's input from a token's embedding and h_prev: the target's features at a
        chain's first step (fused when they span several layers), the drafter's own h_next after."""
        if h_prev.shape[-1] != self.args.hidden_size:
            h_prev = self.fused(h_prev)
        if self.args.input_norms:  # SmolLM2's embeddings are ~17x smaller (RMS) than its final states
            embedding, h_prev = self.embed_norm(embedding), self.hidden_norm(h_prev)
        return self.pre_projection(mx.concatenate([embedding, h_prev], axis=-1))

    # -- one chained step (what the batch's MTP rows call: engines/batch/mtp.py) -------------------
    def step(self, token_embedding: mx.array, h_prev: mx.array, position, kv: dict, masks: dict | None = None) -> DraftStep:
        """One chained step for one chain ([D] inputs, [n] mask) or B chains ([B, D], [B, n]),
        as gemma4_assistant.Model.step."""
        keys, values = kv["target"]
        rows = token_embedding.shape[0] if token_embedding.ndim == 2 else 1
        mask = masks["target"].reshape(rows, 1, 1, -1) if masks else None
        x = self.inputs(token_embedding, h_prev).reshape(rows, 1, -1)
        h = self.layer(x, keys, values, mask, position)[:, 0]
        if token_embedding.ndim == 1:
            h = h[0]
        return DraftStep(logits=self.full_logits(h), h_next=h)

    def compiled_step(self):
        """step() compiled once (gemma4_assistant.compile_step says why)."""
        if self._compiled_step is None:
            self._compiled_step = compile_step(self.step)
        return self._compiled_step


# -- files ------------------------------------------------------------------------------------------


def is_drafter_dir(path: str | Path) -> bool:
    try:
        return json.loads((Path(path).expanduser() / "config.json").read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def read_args(path: str | Path) -> DrafterArgs:
    cfg = json.loads((Path(path) / "config.json").read_text())
    known = {k: v for k, v in cfg.items() if k in DrafterArgs.__dataclass_fields__}
    return DrafterArgs(**known)


def write_config(path: str | Path, args: DrafterArgs) -> None:
    (Path(path) / "config.json").write_text(json.dumps(asdict(args), indent=1))


def load_drafter(path: str | Path) -> Drafter:
    """A trained drafter from its directory (config.json + model.safetensors), not yet attached
    to a target. One-line EngineErrors."""
    p = Path(path).expanduser()
    try:
        drafter = Drafter(read_args(p))
        drafter.load_weights(str(p / "model.safetensors"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EngineError(f"cannot load the drafter in {path}: {one_line(e)}") from e
    mx.eval(drafter.parameters())
    drafter.eval()
    return drafter
