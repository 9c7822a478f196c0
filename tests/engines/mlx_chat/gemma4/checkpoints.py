"""Tiny Gemma 4 checkpoints in the real on-disk format, built with transformers' own classes.

`build_target(dir)` writes a tiny Gemma 4 text model (`gemma4_text`, Gemma4ForCausalLM) and
`build_assistant(dir, target_dir, centroid=...)` a tiny Gemma 4 assistant drafter
(`gemma4_assistant`, Gemma4AssistantForCausalLM) trained for nothing but shaped like the real
ones: 4 query-only layers reading the target's KV, pre/post projections to the backbone width,
and either a dense tied LM head (26B/31B style) or the centroid head (E2B/E4B style).

Both directories get a small word-level tokenizer with a chat template so the product's
loaders can open them like a downloaded model. The builders are plain functions so other test
folders (the app tests) can reuse them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Sizes: small enough that a generation of a few hundred tokens runs in well under a second
# on the CPU, big enough to have GQA, both attention types and several sliding windows.
VOCAB = 512
HIDDEN = 64
SLIDING_WINDOW = 8
EOS_ID = 1  # "<eos>"; the target's random weights almost never pick it
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }} {{ m['content'] }}<end_of_turn>"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model{% endif %}"
)


@dataclass(frozen=True)
class TargetSpec:
    vocab_size: int = VOCAB
    hidden_size: int = HIDDEN
    intermediate_size: int = 128
    # sliding, full, sliding, full: the assistant reads layer 2 (last sliding) and 3 (last full)
    layer_types: tuple[str, ...] = ("sliding_attention", "full_attention", "sliding_attention", "full_attention")
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    global_head_dim: int = 32
    attention_k_eq_v: bool = False  # the 26B/31B targets share K and V on full layers
    num_global_key_value_heads: int | None = None
    hidden_size_per_layer_input: int = 0  # per-layer embeddings (E2B/E4B); 0 = off
    num_kv_shared_layers: int = 0  # E2B/E4B: the last layers reuse earlier layers' K/V
    sliding_window: int = SLIDING_WINDOW
    final_logit_softcapping: float | None = 30.0
    # transformers' default init: greedy generations stay varied (a wider init, e.g. 0.1-0.2,
    # makes these tiny models lock into one repeated token, which would test nothing).
    initializer_range: float = 0.02
    seed: int = 0


# The 26B/31B shape: no KV sharing, K = V on full-attention layers with their own kv-head count.
DENSE_TARGET = TargetSpec(attention_k_eq_v=True, num_global_key_value_heads=1)
# The E2B/E4B shape: per-layer embeddings, the last two layers reuse the K/V of layers 2 and 3
# (which are then also what the assistant reads).
EDGE_TARGET = TargetSpec(
    layer_types=("sliding_attention", "full_attention", "sliding_attention", "full_attention",
                 "sliding_attention", "full_attention"),
    hidden_size_per_layer_input=8,
    num_kv_shared_layers=2,
)


def write_tokenizer(path: str | Path, vocab_size: int = VOCAB) -> None:
    """A word-level tokenizer over the whole vocabulary ("w6 w7 ..."), saved as tokenizer.json,
    spelled the way Gemma's SentencePiece tokenizers are: words carry the "▁" prefix and the
    decoder replaces it with a space. So mlx-lm streams its text with the same detokenizer as a
    real Gemma checkpoint (SPMStreamingDetokenizer, constant work per token) rather than the
    naive one that re-decodes the whole line at every token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"▁w{i}": i for i in range(len(SPECIALS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))


def _text_config(spec: TargetSpec, **overrides):
    from transformers import Gemma4TextConfig

    kwargs = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=len(spec.layer_types),
        layer_types=list(spec.layer_types),
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        global_head_dim=spec.global_head_dim,
        attention_k_eq_v=spec.attention_k_eq_v,
        num_global_key_value_heads=spec.num_global_key_value_heads,
        hidden_size_per_layer_input=spec.hidden_size_per_layer_input,
        vocab_size_per_layer_input=spec.vocab_size if spec.hidden_size_per_layer_input else 0,
        num_kv_shared_layers=spec.num_kv_shared_layers,
        sliding_window=spec.sliding_window,
        final_logit_softcapping=spec.final_logit_softcapping,
        initializer_range=spec.initializer_range,
        max_position_embeddings=4096,
        eos_token_id=EOS_ID,
        bos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    kwargs.update(overrides)
    return Gemma4TextConfig(**kwargs)


def _officialize(text_cfg: dict, spec_global_head_dim: int, num_global_kv: int | None) -> dict:
    """transformers 5.23 serialises the full-attention head size as `per_layer_config`; the
    published Gemma 4 configs (and mlx-lm) use `global_head_dim` / `num_global_key_value_heads`.
    Write the published form (transformers reads it back into per_layer_config on load)."""
    text_cfg.pop("per_layer_config", None)
    text_cfg["global_head_dim"] = spec_global_head_dim
    if num_global_kv is not None:
        text_cfg["num_global_key_value_heads"] = num_global_kv
    return text_cfg


def build_target(path: str | Path, spec: TargetSpec = TargetSpec(), multimodal: bool = False) -> Path:
    """A tiny Gemma 4 target saved in HF format + tokenizer: Gemma4ForCausalLM (model_type
    gemma4_text), or with multimodal=True the published layout, Gemma4ForConditionalGeneration
    (model_type gemma4, weights under model.language_model.*; no vision/audio towers)."""
    import torch
    from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    path = Path(path)
    torch.manual_seed(spec.seed)
    text = _text_config(spec)
    if multimodal:
        config = Gemma4Config(text_config=text.to_dict(), vision_config=None, audio_config=None)
        model = Gemma4ForConditionalGeneration(config).eval()
    else:
        model = Gemma4ForCausalLM(text).eval()
    model.save_pretrained(str(path))
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if multimodal:
        _officialize(cfg["text_config"], spec.global_head_dim, spec.num_global_key_value_heads)
        cfg["vocab_size"] = spec.vocab_size  # mlx-lm's gemma4 reads the top-level one
        cfg["eos_token_id"] = EOS_ID
    else:
        _officialize(cfg, spec.global_head_dim, spec.num_global_key_value_heads)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    write_tokenizer(path, spec.vocab_size)
    return path


def target_text_config(target_dir: str | Path) -> dict:
    """The text part of a saved target's config (top level for gemma4_text)."""
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    return cfg.get("text_config", cfg)


@dataclass(frozen=True)
class AssistantSpec:
    hidden_size: int = 32  # the assistant is narrower than its backbone, as the real ones are
    intermediate_size: int = 64
    layer_types: tuple[str, ...] = ("sliding_attention", "sliding_attention", "sliding_attention", "full_attention")
    num_attention_heads: int = 2
    centroid: bool = False  # use_ordered_embeddings: the E2B/E4B centroid LM head
    num_centroids: int = 16
    centroid_intermediate_top_k: int = 4
    initializer_range: float = 0.2
    seed: int = 1


def _patch_all_shared_kv_modes():
    """transformers 5.23 cannot *build* an assistant whose layers all reuse KV: its
    `Gemma4TextConfig.kv_sharing_modes` looks for a producer layer of each type among the
    unshared layers, finds none, and raises. Every assistant layer is a consumer ("reuse");
    the producers live in the target. Patch the property for the test builder only (the
    published checkpoints load in transformers the same way, it is the config class that
    lacks the all-shared case). Returns an undo function."""
    from transformers import Gemma4TextConfig

    original = Gemma4TextConfig.kv_sharing_modes

    def kv_sharing_modes(self):
        if self.num_kv_shared_layers == self.num_hidden_layers:
            return ["reuse"] * self.num_hidden_layers
        return original.fget(self)

    Gemma4TextConfig.kv_sharing_modes = property(kv_sharing_modes)
    return lambda: setattr(Gemma4TextConfig, "kv_sharing_modes", original)


def assistant_model(target_dir: str | Path, spec: AssistantSpec = AssistantSpec()):
    """A random Gemma4AssistantForCausalLM matching the target at `target_dir` (in memory)."""
    import torch
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig

    target_cfg = target_text_config(target_dir)  # the published form
    undo = _patch_all_shared_kv_modes()
    try:
        text = Gemma4TextConfig(
            vocab_size=target_cfg["vocab_size"],
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=len(spec.layer_types),
            layer_types=list(spec.layer_types),
            num_attention_heads=spec.num_attention_heads,
            # K/V come from the target, so their head counts and sizes must be the target's
            num_key_value_heads=target_cfg["num_key_value_heads"],
            num_global_key_value_heads=target_cfg.get("num_global_key_value_heads"),
            attention_k_eq_v=target_cfg.get("attention_k_eq_v", False),
            head_dim=target_cfg["head_dim"],
            global_head_dim=target_cfg["global_head_dim"],
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0,
            num_kv_shared_layers=len(spec.layer_types),
            sliding_window=target_cfg["sliding_window"],
            rope_parameters=target_cfg["rope_parameters"],
            final_logit_softcapping=None,
            initializer_range=spec.initializer_range,
            max_position_embeddings=target_cfg["max_position_embeddings"],
            eos_token_id=EOS_ID,
            bos_token_id=2,
            pad_token_id=0,
        )
        config = Gemma4AssistantConfig(
            text_config=text,
            backbone_hidden_size=target_cfg["hidden_size"],
            use_ordered_embeddings=spec.centroid,
            num_centroids=spec.num_centroids,
            centroid_intermediate_top_k=spec.centroid_intermediate_top_k,
            tie_word_embeddings=True,
        )
        torch.manual_seed(spec.seed)
        model = Gemma4AssistantForCausalLM(config).eval()
        if spec.centroid:
            # A published token_ordering is a permutation of the vocabulary grouped by centroid.
            g = torch.Generator().manual_seed(spec.seed)
            model.masked_embedding.token_ordering.copy_(torch.randperm(target_cfg["vocab_size"], generator=g))
    finally:
        undo()
    return model


def build_assistant(path: str | Path, target_dir: str | Path, spec: AssistantSpec = AssistantSpec()) -> Path:
    """A tiny Gemma4AssistantForCausalLM (model_type gemma4_assistant) saved in HF format."""
    path = Path(path)
    undo = _patch_all_shared_kv_modes()
    try:
        model = assistant_model(target_dir, spec)
        model.save_pretrained(str(path))
    finally:
        undo()
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    _officialize(cfg["text_config"], target_text_config(target_dir)["global_head_dim"], None)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    write_tokenizer(path, VOCAB)
    return path


def load_assistant_hf(path: str | Path):
    """transformers' own assistant class on a saved checkpoint (needs the same patch)."""
    from transformers import Gemma4AssistantForCausalLM

    undo = _patch_all_shared_kv_modes()
    try:
        return Gemma4AssistantForCausalLM.from_pretrained(str(path)).eval()
    finally:
        undo()


def build_mlx_assistant(path: str | Path, hf_assistant_dir: str | Path, bits: int = 8, group_size: int = 32) -> Path:
    """An MLX conversion of a saved assistant, quantized the way mlx-lm quantizes models
    (QuantizedLinear / QuantizedEmbedding weights + scales + biases, a `quantization` entry in
    config.json). The int32 token_ordering stays an integer tensor."""
    from mlx_lm.utils import load_config, quantize_model, save_config, save_model

    from engines.mlx_chat.gemma4_assistant import load_assistant

    path = Path(path)
    model = load_assistant(hf_assistant_dir)
    config = load_config(Path(hf_assistant_dir))
    model, config = quantize_model(model, config, group_size, bits)
    save_model(path, model)
    save_config(config, path / "config.json")
    return path


# -- google/gemma-4-*-it and google/gemma-4-*-it-assistant exactly as published ----------------
#
# The instruction repos hold (per the hub's file lists, e.g. google/gemma-4-31B-it's first
# commit): README.md, chat_template.jinja, config.json, generation_config.json,
# model-0000N-of-0000M.safetensors + model.safetensors.index.json, processor_config.json,
# tokenizer.json, tokenizer_config.json. config.json is the multimodal `gemma4` one
# (Gemma4ForConditionalGeneration): text_config (gemma4_text, vocab_size inside it only, dtype
# bfloat16), vision_config (gemma4_vision), audio_config (gemma4_audio on E2B/E4B, null on
# 26B/31B), the media token ids, eos_token_id [1, 106, 50] and vision_soft_tokens_per_image.
# Weights are bfloat16 under model.language_model.*, model.vision_tower.*, model.embed_vision.*,
# model.audio_tower.*, model.embed_audio.*. The tokenizer is Gemma 4's turn format: <|turn>,
# <turn|> (id 106, an end-of-turn EOS). The assistant repos: config.json (gemma4_assistant,
# with the media token ids copied from the base) and model.safetensors (bfloat16); no tokenizer
# is written for them, so nothing here relies on one (it shares the target's).

PUBLISHED_EOS = [1, 106, 50]
PUBLISHED_MEDIA_IDS = dict(boi_token_id=255999, eoi_token_id=258882, image_token_id=258880,
                           video_token_id=258884, boa_token_id=256000, eoa_token_index=258883,
                           audio_token_id=258881)
# Gemma 4's turn markers at their ids in the real vocabulary (0 pad, 1 eos, 2 bos, 3 unk,
# 105 <|turn>, 106 <turn|>; 50 stands in for the third EOS id of generation_config.json).
PUBLISHED_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 50: "<|tool_response>",
                      105: "<|turn>", 106: "<turn|>"}
PUBLISHED_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)
PUBLISHED_GENERATION = {"bos_token_id": 2, "do_sample": True, "eos_token_id": PUBLISHED_EOS, "pad_token_id": 0,
                        "temperature": 1.0, "top_k": 64, "top_p": 0.95, "transformers_version": "5.5.0.dev0"}


def write_published_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    """tokenizer.json + tokenizer_config.json + chat_template.jinja in Gemma 4's form: the
    specials at their real ids, words "▁w{i}" elsewhere, the template in its own file."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"▁w{i}": i for i in range(vocab_size) if i not in PUBLISHED_SPECIALS}
    vocab.update({tok: i for i, tok in PUBLISHED_SPECIALS.items()})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in PUBLISHED_SPECIALS.values()])
    tok.save(str(path / "tokenizer.json"))
    config = {
        "backend": "tokenizers", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "mask_token": "<mask>", "sot_token": "<|turn>", "eot_token": "<turn|>",
        "padding_side": "left", "processor_class": "Gemma4Processor", "tokenizer_class": "GemmaTokenizer",
        "model_max_length": 1000000000000000019884624838656,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (path / "chat_template.jinja").write_text(PUBLISHED_CHAT_TEMPLATE)


def _tiny_towers(spec: TargetSpec, audio: bool) -> tuple[dict, dict | None]:
    from transformers import Gemma4AudioConfig, Gemma4VisionConfig

    vision = Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=16, position_embedding_size=64, patch_size=4)
    towers_audio = Gemma4AudioConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     subsampling_conv_channels=[8, 8], output_proj_dims=spec.hidden_size)
    return vision.to_dict(), (towers_audio.to_dict() if audio else None)


def build_published_target(path: str | Path, spec: TargetSpec = EDGE_TARGET, audio: bool = True) -> Path:
    """A tiny google/gemma-4-E2B-it (audio=True) or -31B-it (audio=False, with DENSE_TARGET)."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    path = Path(path)
    torch.manual_seed(spec.seed)
    vision, audio_config = _tiny_towers(spec, audio)
    config = Gemma4Config(text_config=_text_config(spec, eos_token_id=PUBLISHED_EOS[:2]).to_dict(),
                          vision_config=vision, audio_config=audio_config, **PUBLISHED_MEDIA_IDS)
    model = Gemma4ForConditionalGeneration(config).eval().to(torch.bfloat16)
    model.save_pretrained(str(path), max_shard_size="400KB")  # sharded, with the index file
    cfg = json.loads((path / "config.json").read_text())
    cfg["text_config"] = _officialize(cfg["text_config"], spec.global_head_dim, spec.num_global_key_value_heads)
    cfg["text_config"]["dtype"] = "bfloat16"
    cfg.pop("dtype", None)
    cfg["eos_token_id"] = PUBLISHED_EOS
    cfg["vision_soft_tokens_per_image"] = 280
    (path / "config.json").write_text(json.dumps(dict(sorted(cfg.items())), indent=2))
    (path / "generation_config.json").write_text(json.dumps(PUBLISHED_GENERATION, indent=2))
    (path / "processor_config.json").write_text(json.dumps({
        "processor_class": "Gemma4Processor", "image_seq_length": 280, "audio_seq_length": 750,
        "image_processor": {"image_processor_type": "Gemma4ImageProcessor", "patch_size": 16,
                            "max_soft_tokens": 280, "pooling_kernel_size": 3},
    }, indent=2))
    (path / "README.md").write_text("---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# tiny test model\n")
    write_published_tokenizer(path, spec.vocab_size)
    return path


def build_published_assistant(path: str | Path, target_dir: str | Path,
                              spec: AssistantSpec = AssistantSpec(centroid=True)) -> Path:
    """A tiny google/gemma-4-*-it-assistant for the published target at `target_dir`."""
    import torch

    path = Path(path)
    undo = _patch_all_shared_kv_modes()
    try:
        model = assistant_model(target_dir, spec).to(torch.bfloat16)
        if spec.centroid:  # token_ordering is an integer buffer: keep it so
            model.masked_embedding.token_ordering.data = model.masked_embedding.token_ordering.long()
        model.save_pretrained(str(path))
    finally:
        undo()
    cfg = json.loads((path / "config.json").read_text())
    _officialize(cfg["text_config"], target_text_config(target_dir)["global_head_dim"], None)
    cfg["text_config"]["dtype"] = "bfloat16"
    cfg.pop("dtype", None)
    cfg.update({k: v for k, v in PUBLISHED_MEDIA_IDS.items() if k != "video_token_id"})
    (path / "config.json").write_text(json.dumps(dict(sorted(cfg.items())), indent=2))
    (path / "README.md").write_text("---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# tiny test drafter\n")
    return path
