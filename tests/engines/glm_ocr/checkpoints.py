"""Tiny GLM-OCR checkpoints in the real on-disk format, for tests anywhere in the project.

`make_tiny_glm_ocr(dir)` writes what a Hugging Face snapshot of zai-org/GLM-OCR holds:
config.json + model.safetensors (saved by transformers' own GlmOcrForConditionalGeneration),
the MTP layer added under its real names `model.language_model.layers.{num_hidden_layers}.*`
(transformers drops it at load), generation_config.json, a byte-level tokenizer with GLM's
special tokens, the chat template, and the image processor config (Glm46VImageProcessor).
Weights are random unless `train_mtp_on_target` is used afterwards.

Small numbers keep every test fast: text hidden 64, 2 layers, 4 heads (2 KV), head_dim 16 with
partial rotary 0.5 and mrope sections [2, 1, 1] (so the pass-through half of a head and all
three mRoPE sections are exercised), vision hidden 32, 2 blocks, at most 64 image tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# GLM's special tokens, in the order the real tokenizer lists them (ids differ: ours follow
# the 256 byte tokens).
SPECIAL_TOKENS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>", "<think>", "</think>",
]
VOCAB_SIZE = 288  # 256 bytes + 18 specials, rounded up as the real vocab is

# The chat format of the issue: [gMASK]<sop><|user|>\n<|begin_of_image|>{image}<|end_of_image|>
# {task prompt}<|assistant|>\n
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}{% if m['role'] == 'user' %}<|user|>\n"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# At most 64 merged image tokens (256 patches): min/max pixels count both temporal frames.
IMAGE_MIN_PIXELS = 2 * 28 * 28 * 4
IMAGE_MAX_PIXELS = 2 * 28 * 28 * 64


def tiny_config(vocab_size: int = VOCAB_SIZE, token_ids: dict[str, int] | None = None, **text_overrides):
    from transformers import GlmOcrConfig

    ids = token_ids or special_token_ids()
    text = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1]},
        eos_token_id=[ids["<|endoftext|>"], ids["<|user|>"]], pad_token_id=ids["<|endoftext|>"],
    )
    text.update(text_overrides)
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=text["hidden_size"],
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "axial", "rope_theta": 10000.0},
    )
    config = GlmOcrConfig(
        text_config=text, vision_config=vision,
        image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"],
    )
    config.text_config.num_nextn_predict_layers = 1  # as in the real config: one MTP layer
    return config


def special_token_ids() -> dict[str, int]:
    return {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}


def write_tokenizer(out: Path) -> None:
    """A byte-level BPE without merges (one token per byte) plus GLM's special tokens, saved
    through transformers so tokenizer.json / tokenizer_config.json look like a real snapshot."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}  # token id = byte value
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        model_max_length=8192,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_processor(out: Path) -> None:
    """preprocessor_config.json (Glm46VImageProcessor, as in the real snapshot) and the chat
    template. (Glm46VProcessor itself cannot be built here: its video processor needs
    torchvision, which the project does not install.)"""
    from transformers import Glm46VImageProcessorPil

    image_processor = Glm46VImageProcessorPil(
        size={"shortest_edge": IMAGE_MIN_PIXELS, "longest_edge": IMAGE_MAX_PIXELS},
        patch_size=14, temporal_patch_size=2, merge_size=2,
    )
    image_processor.save_pretrained(out)
    config_path = Path(out) / "preprocessor_config.json"
    config = json.loads(config_path.read_text())
    config["image_processor_type"] = "Glm46VImageProcessor"  # the real snapshot's name
    config_path.write_text(json.dumps(config, indent=2))
    (Path(out) / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def mtp_prefix(config) -> str:
    return f"model.language_model.layers.{config.text_config.num_hidden_layers}."


def random_mtp_weights(model, seed: int = 1) -> dict[str, torch.Tensor]:
    """The MTP layer's tensors under their real names: a decoder layer (4-norm sandwich),
    enorm, hnorm, eh_proj, shared_head.norm, and the shared embedding / head copies."""
    from transformers.models.glm_ocr.modeling_glm_ocr import GlmOcrTextDecoderLayer

    cfg = model.config.text_config
    gen = torch.Generator().manual_seed(seed)
    layer = GlmOcrTextDecoderLayer(cfg, cfg.num_hidden_layers)
    tensors = {}
    for name, p in layer.state_dict().items():
        if name.endswith("layernorm.weight"):
            tensors[name] = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            tensors[name] = 0.02 * torch.randn(p.shape, generator=gen) * (cfg.hidden_size ** 0.5) / p.shape[-1] ** 0.5
    h = cfg.hidden_size
    tensors["enorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=gen)
    tensors["hnorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=gen)
    tensors["eh_proj.weight"] = torch.randn(h, 2 * h, generator=gen) / (2 * h) ** 0.5
    tensors["shared_head.norm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=gen)
    tensors["shared_head.head.weight"] = model.lm_head.weight.detach().clone()
    tensors["embed_tokens.weight"] = model.model.language_model.embed_tokens.weight.detach().clone()
    prefix = mtp_prefix(model.config)
    return {prefix + k: v.contiguous() for k, v in tensors.items()}


def write_mtp_weights(out: Path, mtp: dict[str, torch.Tensor]) -> None:
    """Add (or replace) the MTP tensors in model.safetensors, keeping the file's metadata."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = Path(out) / "model.safetensors"
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors.update({k: v.to(next(iter(tensors.values())).dtype) for k, v in mtp.items()})
    save_file(tensors, path, metadata=metadata)


def make_tiny_glm_ocr(out, with_mtp: bool = True, seed: int = 0, **text_overrides) -> Path:
    """Write a tiny random GLM-OCR checkpoint to `out` and return its path."""
    from transformers import GenerationConfig, GlmOcrForConditionalGeneration

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = tiny_config(**text_overrides)
    model = GlmOcrForConditionalGeneration(config).eval()
    _widen_random_init(model, seed)
    model.save_pretrained(out)
    ids = special_token_ids()
    GenerationConfig(
        eos_token_id=config.text_config.eos_token_id, pad_token_id=ids["<|endoftext|>"], do_sample=False,
    ).save_pretrained(out)
    write_tokenizer(out)
    write_processor(out)
    if with_mtp:
        write_mtp_weights(out, random_mtp_weights(model, seed + 1))
    return out


def _widen_random_init(model, seed: int) -> None:
    """transformers initialises with std 0.02, which at hidden 64 makes every logit nearly
    equal and greedy output a constant token. Larger weights give a tiny model varied,
    image-dependent output, so token-for-token comparisons mean something."""
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)


def read_config(path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())
