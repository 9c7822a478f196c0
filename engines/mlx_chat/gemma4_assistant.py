"""The Gemma 4 assistant drafter (`model_type: gemma4_assistant`) in MLX.

mlx-lm has the Gemma 4 target but not its assistant, so this file is ours; it follows
mlx-lm's one-file-per-architecture order (args -> blocks -> model with sanitize) and reuses
mlx-lm's own Gemma 4 decoder layer, which already supports layers that read K/V from
elsewhere. Reference: transformers' `Gemma4AssistantForCausalLM` and
`SinglePositionMultiTokenCandidateGenerator`, and /work/shared/reference/gemma4-mtp-llama-cpp.md.

One drafter step, given the target's state after its last accepted token:

    x      = pre_projection(concat(target_embed(last_token) * sqrt(backbone_hidden), h_prev))
    x      = 4 decoder layers; attention has queries only and reads K/V from the target's
             cache: the last full-attention target layer for full layers, the last sliding
             layer for sliding layers. The drafter has no KV of its own.
    x      = norm(x)
    h_next = post_projection(x)          -> the next step's h_prev (backbone width)
    logits = tied LM head(x), or the centroid head (E2B/E4B, `use_ordered_embeddings`)

The query position stays the same for every chained step: the position of the last
token, which the target has not yet processed (transformers passes `input_ids.shape[1] - 1`).
Loading goes through mlx-lm's `load_model`, so HF checkpoints and MLX (quantized) conversions
load the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma4_text
from mlx_lm.models.base import BaseModelArgs

# Non-candidate tokens of the centroid head get this logit: the verifier sees a full-vocabulary
# row whose softmax puts (numerically) zero mass outside the routed candidates.
CENTROID_MASK_VALUE = -1e30


def text_args(text_config: dict) -> gemma4_text.ModelArgs:
    """mlx-lm's Gemma 4 args from a `text_config`. Accepts both spellings of the full-attention
    head size: the published `global_head_dim` and transformers 5.23's `per_layer_config`."""
    cfg = dict(text_config)
    if "global_head_dim" not in cfg and isinstance(cfg.get("per_layer_config"), dict):
        types = cfg.get("layer_types") or []
        for idx, override in cfg["per_layer_config"].items():
            if types and types[int(idx)] == "full_attention" and "head_dim" in override:
                cfg["global_head_dim"] = override["head_dim"]
                break
    # mlx-lm's defaults describe the E2B target (final soft-capping, double-wide MLPs, 20 shared
    # layers); an assistant config that omits a key means the transformers default instead.
    cfg.setdefault("final_logit_softcapping", None)
    cfg.setdefault("use_double_wide_mlp", False)
    cfg.setdefault("hidden_size_per_layer_input", 0)
    cfg.setdefault("num_kv_shared_layers", cfg.get("num_hidden_layers", 4))
    return gemma4_text.ModelArgs.from_dict(cfg)


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str = "gemma4_assistant"
    text_config: dict = field(default_factory=dict)
    backbone_hidden_size: int = 1536
    use_ordered_embeddings: bool = False
    num_centroids: int = 2048
    centroid_intermediate_top_k: int = 32
    tie_word_embeddings: bool = True

    @property
    def text(self) -> gemma4_text.ModelArgs:
        return text_args(self.text_config)


class CentroidHead(nn.Module):
    """The E2B/E4B LM head (transformers' Gemma4AssistantMaskedEmbedder): score the centroids,
    keep the top k, and compute logits only for the tokens those centroids list; every other
    token gets CENTROID_MASK_VALUE. token_ordering, viewed as [num_centroids, vocab/num_centroids],
    lists each centroid's token ids; it stays int32 (never quantized)."""

    def __init__(self, hidden_size: int, vocab_size: int, num_centroids: int, top_k: int):
        super().__init__()
        if vocab_size % num_centroids:
            raise ValueError(f"vocab_size {vocab_size} is not a multiple of num_centroids {num_centroids}")
        self.vocab_size, self.num_centroids, self.top_k = vocab_size, num_centroids, top_k
        self.centroids = nn.Linear(hidden_size, num_centroids, bias=False)
        self.token_ordering = mx.zeros((vocab_size,), dtype=mx.int32)

    def candidates(self, h: mx.array) -> mx.array:
        """Token ids routed for h: [..., top_k * vocab_per_centroid]."""
        scores = self.centroids(h)
        top = mx.argpartition(-scores, kth=self.top_k - 1, axis=-1)[..., : self.top_k]
        per_centroid = self.token_ordering.reshape(self.num_centroids, -1)
        ids = per_centroid[top]  # [..., top_k, vocab_per_centroid]
        return ids.reshape(*h.shape[:-1], -1)

    def __call__(self, h: mx.array, embed_tokens: nn.Module) -> mx.array:
        ids = self.candidates(h)
        rows = embed_tokens(ids)  # [..., n, hidden]; dequantizes rows of a quantized table
        cand_logits = (rows @ h[..., None])[..., 0].astype(mx.float32)
        full = mx.full((*h.shape[:-1], self.vocab_size), CENTROID_MASK_VALUE, dtype=mx.float32)
        return mx.put_along_axis(full, ids, cand_logits, axis=-1)


class AssistantBody(nn.Module):
    """The `model.` part of the checkpoint: embed_tokens (the tied LM head), layers, norm."""

    def __init__(self, args: gemma4_text.ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [gemma4_text.DecoderLayer(args, layer_idx=i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


@dataclass
class DraftStep:
    logits: mx.array  # [vocab] float32, full vocabulary (centroid head: non-candidates masked)
    h_next: mx.array  # [backbone_hidden]: the next step's h_prev


def compile_step(step):
    """A drafter's step() as one compiled MLX function: MLX fuses its elementwise work and
    replays the traced graph, so a chain step costs less on the device and far less on the
    host (on the CPU backend about 3x less of each). It is traced again for new input shapes
    only, so callers pass position as an mx.array and K/V buffers whose shapes rarely change
    (engines/batch/mtp.py, BatchMTP.view). Shared by the assistant and drafters trained here."""
    def arrays(token_embedding, h_prev, position, kv, masks):
        out = step(token_embedding, h_prev, position, kv, masks)
        return out.logits, out.h_next

    compiled = mx.compile(arrays)
    return lambda *args: DraftStep(*compiled(*args))


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self._compiled_step = None
        text = args.text
        self.text = text
        if text.num_kv_shared_layers != text.num_hidden_layers:
            raise ValueError("every Gemma 4 assistant layer must read the target's K/V (num_kv_shared_layers)")
        self.hidden_size = text.hidden_size
        self.vocab_size = text.vocab_size
        self.backbone_hidden_size = args.backbone_hidden_size
        self.layer_types = list(text.layer_types)
        self.model = AssistantBody(text)
        self.pre_projection = nn.Linear(2 * args.backbone_hidden_size, text.hidden_size, bias=False)
        self.post_projection = nn.Linear(text.hidden_size, args.backbone_hidden_size, bias=False)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        if args.use_ordered_embeddings:
            self.masked_embedding = CentroidHead(
                text.hidden_size, text.vocab_size, args.num_centroids, args.centroid_intermediate_top_k
            )

    @property
    def centroid(self) -> bool:
        return self.args.use_ordered_embeddings

    def step(
        self,
        token_embedding: mx.array,
        h_prev: mx.array,
        position: int | mx.array,
        kv: dict[str, tuple[mx.array, mx.array]],
        masks: dict[str, mx.array | None] | None = None,
    ) -> DraftStep:
        """One drafter forward, for one chain or for B chains at once (a batch's rows).
        token_embedding: the target's scaled embedding of the last token [backbone_hidden]
        (or [B, backbone_hidden]); h_prev: the target's final-norm hidden state at the position
        before it (or the previous step's h_next), same shape; position: the last token's
        position ([] or [B]); kv[layer_type] = (keys, values) [1 or B, kv_heads, n, head_dim]
        from the target's cache, RoPE already applied; masks[layer_type] ([n] or [B, n] bool),
        if given, says which entries each query sees -- every one otherwise (the caller picks
        the window). position and masks may be lazy arrays: a chain can be built before the
        target's verdict is read."""
        masks = masks or {}
        rows = token_embedding.shape[0] if token_embedding.ndim == 2 else 1
        x = mx.concatenate([token_embedding, h_prev], axis=-1).reshape(rows, 1, -1)
        x = self.pre_projection(x)
        for layer in self.model.layers:
            mask = masks.get(layer.layer_type)
            if mask is not None:
                mask = mask.reshape(rows, 1, 1, -1)  # [batch, heads, query, key]
            x, _, _ = layer(x, mask, None, shared_kv=kv[layer.layer_type], offset=position)
        x = self.model.norm(x)
        out = DraftStep(logits=self.lm_logits(x)[:, 0], h_next=self.post_projection(x)[:, 0])
        return out if token_embedding.ndim == 2 else DraftStep(out.logits[0], out.h_next[0])

    def compiled_step(self):
        """step() as one compiled MLX function, made once per drafter and kept (compile_step)."""
        if self._compiled_step is None:
            self._compiled_step = compile_step(self.step)
        return self._compiled_step

    def lm_logits(self, x: mx.array) -> mx.array:
        if self.centroid:
            return self.masked_embedding(x, self.model.embed_tokens)
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(x).astype(mx.float32)
        return self.lm_head(x).astype(mx.float32)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {}
        for k, v in weights.items():
            if "self_attn.rotary_emb" in k or any(
                f"self_attn.{n}" in k for n in ("k_proj", "v_proj", "k_norm", "v_norm")
            ):
                continue  # nothing of the sort exists in a KV-sharing layer
            if k == "lm_head.weight" and self.args.tie_word_embeddings:
                continue
            if k.endswith("token_ordering"):
                v = v.astype(mx.int32)  # stored int64 by transformers, int32 by converters
            out[k] = v
        return out

    @property
    def layers(self):
        return self.model.layers


@dataclass
class AssistantInfo:
    path: str
    backbone_hidden_size: int
    vocab_size: int
    hidden_size: int
    layers: int
    head: str  # "dense" | "centroid"
    parameters: int
    bytes: int


def get_classes(config: dict):
    if config.get("model_type") != "gemma4_assistant":
        raise ValueError(
            f"not a Gemma 4 assistant checkpoint: model_type is {config.get('model_type')!r}, "
            "expected 'gemma4_assistant'"
        )
    return Model, ModelArgs


def load_assistant(path: str | Path, lazy: bool = False) -> Model:
    """Load an assistant from a HF directory or an MLX conversion (quantized or not)."""
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path), lazy=lazy, get_model_classes=get_classes)
    model.eval()
    return model


def assistant_info(model: Model, path: str | Path = "") -> AssistantInfo:
    from mlx.utils import tree_flatten

    params = tree_flatten(model.parameters())
    return AssistantInfo(
        path=str(path),
        backbone_hidden_size=model.backbone_hidden_size,
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        layers=len(model.layers),
        head="centroid" if model.centroid else "dense",
        parameters=sum(v.size for _, v in params),
        bytes=sum(v.nbytes for _, v in params),
    )

