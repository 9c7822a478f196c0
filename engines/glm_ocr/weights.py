"""Loading a GLM-OCR checkpoint: transformers' own loader for the main model, and the MTP
layer read from the safetensors ourselves (transformers drops `layers.{N}.*` at load).

`load_modules(hf_dir, cache_length)` returns the channels-first modules (modules.py) that the
converter converts and the PyTorch runtime runs. `load_reference(hf_dir)` returns the
unpatched transformers model plus an MTP built from transformers' decoder layer, for
parity checks."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from engines.types import EngineError
from engines.glm_ocr.config import GlmOcrConfig
from engines.glm_ocr.modules import LMHead, MtpLayer, TextDecoder, VisionEncoder

MTP_PARTS = ("enorm", "hnorm", "eh_proj", "shared_head.norm")


@dataclass
class GlmOcrModules:
    config: GlmOcrConfig
    vision: VisionEncoder
    decoder: TextDecoder
    lm_head: LMHead
    mtp: MtpLayer | None  # None when the checkpoint has no MTP layer
    embeddings: np.ndarray  # (vocab, hidden) float32: the host-side embedding table
    mtp_missing_reason: str | None = None


@dataclass
class Reference:
    """transformers' modules, unpatched: the ground truth for every parity check."""

    model: nn.Module  # GlmOcrForConditionalGeneration
    mtp: dict | None  # {"layer": GlmOcrTextDecoderLayer, "enorm", "hnorm", "eh_proj", "shared_head_norm"}


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    return sorted(model_dir.glob("*.safetensors"))


# The MTP layer's copies of the embedding table and the LM head (vocab x hidden each): equal
# to the main model's, never used from here, and not read -- they would double the peak.
MTP_SHARED_COPIES = ("embed_tokens.", "shared_head.head.")


def read_mtp_tensors(model_dir: str | os.PathLike, layer_index: int) -> dict[str, torch.Tensor]:
    """The tensors under model.language_model.layers.{layer_index}., with the prefix removed,
    except the embedding / LM head copies (MTP_SHARED_COPIES)."""
    from safetensors import safe_open

    prefix = f"model.language_model.layers.{layer_index}."
    tensors = {}
    for path in safetensors_files(Path(model_dir)):
        with safe_open(path, "pt") as f:
            for key in f.keys():
                if key.startswith(prefix) and not key[len(prefix):].startswith(MTP_SHARED_COPIES):
                    tensors[key[len(prefix):]] = f.get_tensor(key)
    return tensors


def build_mtp_reference(text_config, tensors: dict[str, torch.Tensor]) -> dict:
    """The MTP layer from transformers' GlmOcrTextDecoderLayer plus the MTP-only parts."""
    from transformers.models.glm_ocr.modeling_glm_ocr import GlmOcrRMSNorm, GlmOcrTextDecoderLayer

    h, eps = text_config.hidden_size, text_config.rms_norm_eps
    layer = GlmOcrTextDecoderLayer(text_config, text_config.num_hidden_layers)
    layer_state = {k: v for k, v in tensors.items() if k.split(".")[0] not in
                   ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens")}
    layer.load_state_dict({k: v.float() for k, v in layer_state.items()}, strict=True)
    parts = {"layer": layer.eval()}
    for name in ("enorm", "hnorm", "shared_head.norm"):
        norm = GlmOcrRMSNorm(h, eps=eps)
        norm.weight.data.copy_(tensors[f"{name}.weight"].float())
        parts[name.replace(".", "_")] = norm
    eh_proj = nn.Linear(2 * h, h, bias=False)
    eh_proj.weight.data.copy_(tensors["eh_proj.weight"].float())
    parts["eh_proj"] = eh_proj
    return parts


def load_model(model_dir: str | os.PathLike, dtype: torch.dtype) -> nn.Module:
    """transformers' GlmOcrForConditionalGeneration (sdpa attention) with the checkpoint's
    weights in `dtype`, held once. The model is built with its parameters allocated but not
    initialised (untouched pages cost no memory); then each stored tensor either becomes its
    parameter as it is -- a view of the mapped file, when it is stored in `dtype` (as
    from_pretrained does: the page cache is the one copy) -- or is read on its own and copied,
    cast, into its parameter.

    Why not from_pretrained: it keeps each shard mapped while it fills the model, so a float32
    load of GLM-OCR's bfloat16 shards peaks at the float32 model plus the shards it has read
    (6.7-6.9 GB at the published shapes, of which the model is 4.4). Here the peak is the model
    plus the largest single tensor as stored (the embedding table: 182 MB in bfloat16)."""
    from safetensors import safe_open
    from transformers import AutoConfig, GlmOcrForConditionalGeneration
    from transformers.initialization import no_init_weights

    model_dir = Path(model_dir)
    with no_init_weights():  # every parameter is overwritten below: random init would be wasted time
        model = GlmOcrForConditionalGeneration._from_config(
            AutoConfig.from_pretrained(model_dir), dtype=dtype, attn_implementation="sdpa")
    params = dict(model.named_parameters())  # tied parameters appear once
    stored = {path: [] for path in safetensors_files(model_dir)}
    for path, keys in stored.items():
        with safe_open(path, "pt") as f:
            keys.extend(key for key in f.keys() if key in params)
    missing = sorted(set(params) - {key for keys in stored.values() for key in keys})
    if missing:  # left as allocated they would be garbage: refuse (transformers 5 renames no GLM-OCR keys)
        raise EngineError(f"{model_dir} lacks {len(missing)} of GLM-OCR's weights, e.g. {missing[0]}")
    with torch.no_grad():
        for path, keys in stored.items():
            with safe_open(path, "pt") as shard:  # its tensors are views of the mapped file, read lazily
                for key in keys:
                    tensor = shard.get_tensor(key)
                    if tensor.dtype == dtype:
                        params[key].data = tensor  # no copy; the view keeps the mapping alive
                        continue
                    # cast from a handle of its own: the pages a read touches stay counted in
                    # the process's memory until the handle that mapped them is closed
                    del tensor
                    with safe_open(path, "pt") as f:
                        params[key].copy_(f.get_tensor(key))
    return model.eval().requires_grad_(False)


def load_with_mtp(model_dir: str | os.PathLike, config: GlmOcrConfig, load) -> tuple[nn.Module, dict | None]:
    """`load()`'s transformers model, quietly (the MTP keys are "unexpected" to transformers,
    by design; any failure is one EngineError line), and the MTP layer's reference modules
    built from the checkpoint's tensors (None when it has none)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = load()
    except Exception as e:  # noqa: BLE001 -- any load failure is a user-facing one-liner
        raise EngineError(f"cannot load GLM-OCR weights from {model_dir}: {e}") from e
    finally:
        hf_logging.set_verbosity(verbosity)
    tensors = read_mtp_tensors(model_dir, config.text.mtp_layer_index)
    if not all(f"{p}.weight" in tensors for p in MTP_PARTS):
        return model, None
    return model, build_mtp_reference(model.config.text_config, tensors)


def load_reference(model_dir: str | os.PathLike) -> Reference:
    from transformers import GlmOcrForConditionalGeneration

    model, mtp = load_with_mtp(model_dir, GlmOcrConfig.load(model_dir), lambda: GlmOcrForConditionalGeneration
                               .from_pretrained(model_dir, dtype=torch.float32).eval())
    return Reference(model, mtp)


def mtp_missing_reason(model_dir, config: GlmOcrConfig, tensors_present: bool) -> str | None:
    if tensors_present:
        return None
    return (f"MTP unavailable: {model_dir} has no MTP layer "
            f"(model.language_model.layers.{config.text.mtp_layer_index}.* not in its safetensors)")


@torch.no_grad()
def modules_from_reference(ref: Reference, config: GlmOcrConfig, cache_length: int,
                           model_dir: str | os.PathLike = "") -> GlmOcrModules:
    lm = ref.model.model.language_model
    rotary_dim = config.text.rotary_dim
    modules = GlmOcrModules(
        config=config,
        vision=VisionEncoder(ref.model.model.visual).eval(),
        decoder=TextDecoder(lm, rotary_dim, cache_length).eval(),
        lm_head=LMHead(ref.model.lm_head).eval(),
        mtp=MtpLayer(ref.mtp, rotary_dim, cache_length).eval() if ref.mtp else None,
        embeddings=lm.embed_tokens.weight.detach().float().numpy().copy(),
    )
    modules.mtp_missing_reason = mtp_missing_reason(model_dir, config, ref.mtp is not None)
    return modules


def load_modules(model_dir: str | os.PathLike, cache_length: int = 2048) -> GlmOcrModules:
    config = GlmOcrConfig.load(model_dir)
    return modules_from_reference(load_reference(model_dir), config, cache_length, model_dir)


def reference_mtp_forward(ref: Reference, previous_hidden: torch.Tensor, input_embeds: torch.Tensor,
                          position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The MTP layer over a whole sequence with transformers' modules (no cache): row i takes
    previous_hidden[i] (1, S, C) and input_embeds[i] (the next token's embedding) at mRoPE
    positions position_ids (3, 1, S); embeddings at sequence index 0 are zeroed. Returns
    (raw hidden, shared_head-normed hidden), each (1, S, C)."""
    parts, lm = ref.mtp, ref.model.model.language_model
    s = input_embeds.shape[1]
    input_embeds = input_embeds.clone()
    input_embeds[:, 0] = 0.0
    x = parts["eh_proj"](torch.cat([parts["enorm"](input_embeds), parts["hnorm"](previous_hidden)], dim=-1))
    position_embeddings = lm.rotary_emb(x, position_ids)
    mask = torch.full((s, s), float("-inf")).triu(1)[None, None]
    hidden = parts["layer"](x, position_embeddings=position_embeddings, attention_mask=mask)
    return hidden, parts["shared_head_norm"](hidden)
