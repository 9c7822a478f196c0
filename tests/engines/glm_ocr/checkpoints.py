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

import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
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
    image-dependent output, so token-for-token comparisons mean something. Norm weights vary
    too: with all-ones weights a final norm followed by the MTP's hnorm would be invisible."""
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
            elif "norm" in name and name.endswith("weight"):  # not all ones, as in a trained model
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))


def read_config(path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def test_images(count: int, seed: int = 0):
    """Random RGB images of assorted sizes (each gives a different prompt and output)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(90, 160), (120, 120), (64, 200), (150, 100), (100, 140), (80, 80), (110, 170), (70, 130)]
    return [Image.fromarray(rng.integers(0, 255, sizes[i % len(sizes)] + (3,), dtype=np.uint8))
            for i in range(count)]


def reference_prompt(model_dir, image, task: str = "text"):
    """Input tensors for transformers' GlmOcrForConditionalGeneration: ids from the engine's
    prompt builder, pixels from transformers' own Glm46V image processor."""
    from transformers import Glm46VImageProcessorPil

    from engines.glm_ocr.config import GlmOcrConfig
    from engines.glm_ocr.prompts import GlmTokenizer, prompt_ids

    config = GlmOcrConfig.load(model_dir)
    feats = Glm46VImageProcessorPil.from_pretrained(model_dir)(images=[image], return_tensors="pt")
    grid = feats["image_grid_thw"]
    ids = prompt_ids(GlmTokenizer(model_dir), task, int(grid.prod()) // 4, config.image_token_id)
    input_ids = torch.tensor([ids])
    return dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                mm_token_type_ids=(input_ids == config.image_token_id).int(),
                pixel_values=feats["pixel_values"], image_grid_thw=grid)


def reference_input_embeds(model, inputs: dict) -> torch.Tensor:
    """(1, P, C) input embeddings as transformers' GlmOcrModel forms them: token embeddings,
    the vision encoder's features in place of the image tokens."""
    lm = model.model
    embeds = lm.get_input_embeddings()(inputs["input_ids"])
    features = torch.cat(lm.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)
    mask = (inputs["input_ids"] == model.config.image_token_id)[..., None].expand_as(embeds)
    return embeds.masked_scatter(mask, features.to(embeds.dtype))


def hf_greedy(model, inputs: dict, max_new_tokens: int, stop_at_eos: bool = True) -> list[int]:
    """transformers' own greedy generate; the new tokens only."""
    kwargs = {} if stop_at_eos else {"eos_token_id": None, "suppress_tokens": None}
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


# Bump when anything that shapes a trained checkpoint changes (the builder above, the training
# below, the convention it trains under): cached checkpoints are keyed by it.
MTP_BUILDER_VERSION = 2
MAX_CHAIN = 7  # the engine drafts at most 7 steps per round


@dataclass
class ChainData:
    """One image's teacher-forcing data: the full sequence (prompt + the target's greedy
    continuation) as transformers' GlmOcrForConditionalGeneration sees it."""

    hidden: torch.Tensor  # (T, C) final-normed hidden states (what the LM head and the MTP see)
    embeds: torch.Tensor  # (T, C) input embeddings, image features in place of image tokens
    positions: torch.Tensor  # (3, T) mRoPE positions (transformers' get_rope_index)
    labels: torch.Tensor  # (T,) the target's argmax at each row
    prompt_len: int


def chain_data(model, model_dir, image, max_new_tokens: int) -> ChainData:
    inputs = reference_prompt(model_dir, image)
    new = hf_greedy(model, inputs, max_new_tokens, stop_at_eos=False)
    seq = torch.cat([inputs["input_ids"], torch.tensor([new])], dim=1)
    full = dict(inputs, input_ids=seq, attention_mask=torch.ones_like(seq),
                mm_token_type_ids=torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(new), dtype=torch.int32)], 1))
    model.model.rope_deltas = None
    position_ids, _ = model.model.get_rope_index(seq, full["mm_token_type_ids"], full["image_grid_thw"])
    hidden = model.model(**full, position_ids=position_ids).last_hidden_state[0]
    return ChainData(hidden, reference_input_embeds(model, full)[0], position_ids[:, 0], model.lm_head(hidden).argmax(-1),
                     inputs["input_ids"].shape[1])


def chain_rows(data: ChainData, depth: int):
    """The MTP layer's rows under the convention (docs/glm-ocr-mtp-convention.md), for
    teacher forcing over chains of 1..depth steps.

    Verified row i (i < T-1): (hidden i, embedding of row i+1) at row i's position, seeing
    verified rows <= i. Chain row (r, j), j >= 2, for every start r a round can draft from
    (r >= prompt_len - 1): (the MTP output of (r, j-1) before shared_head.norm, embedding of
    row r+j) at row r's position + j-1, seeing verified rows <= r and its own chain's rows.
    Labels: the target's argmax at row i+1, resp. r+j. Returns (source, embed_row, positions,
    labels, depth_of_row, mask) with source[n] the row whose output feeds row n (-1: verified)."""
    t = data.hidden.shape[0]
    rows = [(i, 1) for i in range(t - 1)]
    rows += [(r, j) for j in range(2, depth + 1) for r in range(data.prompt_len - 1, t - j)]
    index = {row: n for n, row in enumerate(rows)}
    source = torch.tensor([-1 if j == 1 else index[(r, j - 1)] for r, j in rows])
    embed_row = torch.tensor([r + j for r, j in rows])
    positions = torch.stack([data.positions[:, r] + (j - 1) for r, j in rows], dim=1)
    labels = data.labels[embed_row]
    depth_of_row = torch.tensor([j for _, j in rows])
    start = torch.tensor([r for r, _ in rows])
    verified = depth_of_row == 1
    sees_verified = verified[None, :] & (start[None, :] <= start[:, None])
    sees_own_chain = (~verified[None, :]) & (start[None, :] == start[:, None]) & (depth_of_row[None, :] <= depth_of_row[:, None])
    mask = torch.where(sees_verified | sees_own_chain, 0.0, float("-inf"))
    return source, embed_row, positions, labels, depth_of_row, mask


def chain_forward(ref, data: ChainData, rows, depth: int) -> torch.Tensor:
    """shared_head-normed MTP outputs of every row of `chain_rows`, with transformers' modules.
    Pass d makes the rows of depth d exact (their input is the output of depth d-1). Gradients
    flow through the last pass only: a chain's input is the layer's own output, taken as given
    (as at inference), which keeps training a few minutes on one core."""
    source, embed_row, positions, _, depth_of_row, mask = rows
    parts, lm = ref.mtp, ref.model.model.language_model
    embeds = data.embeds[embed_row].clone()
    embeds[(positions == 0).all(0)] = 0.0  # position-0 masking, as vLLM does
    position_embeddings = lm.rotary_emb(embeds[None], positions[:, None])
    verified = int((depth_of_row == 1).sum())
    previous = torch.cat([data.hidden[:verified], data.hidden.new_zeros(len(source) - verified, data.hidden.shape[1])])

    def block(previous):
        x = parts["eh_proj"](torch.cat([parts["enorm"](embeds), parts["hnorm"](previous)], dim=-1))
        return parts["layer"](x[None], position_embeddings=position_embeddings, attention_mask=mask[None, None])[0]

    with torch.no_grad():
        for d in range(1, depth):  # feed depth d's outputs to depth d+1
            previous = torch.where((depth_of_row == d + 1)[:, None], block(previous)[source.clamp(min=0)], previous)
    return parts["shared_head_norm"](block(previous))


def train_mtp_on_target(model_dir, images, steps: int = 30, max_new_tokens: int = 64, lr: float = 5e-3,
                        seed: int = 0, depth: int = MAX_CHAIN) -> list[float]:
    """Train the checkpoint's MTP layer for chained drafting on the target's own greedy
    continuation of `images` (teacher forcing over chains of 1..depth steps under the
    convention of docs/glm-ocr-mtp-convention.md), then save it back under the real tensor
    names (so it still goes through the real loader). Returns the final training accuracy at
    each depth 1..depth."""
    from engines.glm_ocr.weights import load_reference

    torch.manual_seed(seed)
    ref = load_reference(model_dir)
    model = ref.model
    with torch.no_grad():
        data = [chain_data(model, model_dir, image, max_new_tokens) for image in images]
    rows = [chain_rows(d, depth) for d in data]
    params = [p for part in ref.mtp.values() for p in part.parameters()]
    opt = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(torch.nn.functional.cross_entropy(model.lm_head(chain_forward(ref, d, r, depth)), r[3])
                   for d, r in zip(data, rows))
        loss.backward()
        opt.step()
    correct, total = torch.zeros(depth), torch.zeros(depth)
    with torch.no_grad():
        for d, r in zip(data, rows):
            hit = (model.lm_head(chain_forward(ref, d, r, depth)).argmax(-1) == r[3]).float()
            for j in range(depth):
                at = r[4] == j + 1
                correct[j] += hit[at].sum()
                total[j] += at.sum()
    save_mtp(ref, model_dir)
    return (correct / total.clamp(min=1)).tolist()


def save_mtp(ref, model_dir) -> None:
    prefix = mtp_prefix(ref.model.config)
    tensors = {prefix + k: v for k, v in ref.mtp["layer"].state_dict().items()}
    for name, key in (("enorm", "enorm"), ("hnorm", "hnorm"), ("shared_head.norm", "shared_head_norm")):
        tensors[prefix + name + ".weight"] = ref.mtp[key].weight.detach()
    tensors[prefix + "eh_proj.weight"] = ref.mtp["eh_proj"].weight.detach()
    write_mtp_weights(model_dir, {k: v.detach().clone().contiguous() for k, v in tensors.items()})


def cache_root() -> Path:
    """Where trained test checkpoints are kept between runs (outside the repository)."""
    return Path(os.environ.get("SPECSCOPE_TEST_CACHE", Path.home() / ".cache" / "specscope-tests"))


@contextmanager
def one_builder(root: Path):
    """One builder at a time for the cached checkpoint `root`: the suite's workers run side by
    side (pytest-xdist), and a second one waits here, then finds it built."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def trained_glm_ocr(images: int = 4, steps: int = 30, max_new_tokens: int = 64, **text_overrides) -> tuple[Path, list[Path]]:
    """A tiny checkpoint whose MTP layer was trained for chains on the target's own outputs for
    `images` test images, and those images as PNG files. Built once per machine and kept in
    cache_root(), keyed by MTP_BUILDER_VERSION, the settings and the torch / transformers
    versions. Cold cost: about 15 s of one CPU core (data from the target, then 30 Adam steps
    over chains of 1..7); measured 1-2 minutes of wall time on the shared 2-core machine."""
    import hashlib

    import transformers

    key = json.dumps(dict(version=MTP_BUILDER_VERSION, images=images, steps=steps, tokens=max_new_tokens,
                          overrides=text_overrides, torch=torch.__version__, transformers=transformers.__version__),
                     sort_keys=True)
    root = cache_root() / f"glm-ocr-mtp-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    pictures = [root / f"image{i}.png" for i in range(images)]
    with one_builder(root):
        if not (root / "done").is_file():
            build_trained_glm_ocr(root, key, images, steps, max_new_tokens, text_overrides)
    return root / "tiny", pictures


def build_trained_glm_ocr(root: Path, key: str, images: int, steps: int, max_new_tokens: int, text_overrides: dict) -> None:
    """trained_glm_ocr's build: in a scratch folder, moved into place whole."""
    import shutil
    import tempfile

    scratch = Path(tempfile.mkdtemp(dir=root.parent))
    path = make_tiny_glm_ocr(scratch / "tiny", **text_overrides)
    samples = test_images(images)
    accuracy = train_mtp_on_target(path, samples, steps=steps, max_new_tokens=max_new_tokens)
    for i, image in enumerate(samples):
        image.save(scratch / f"image{i}.png")
    (scratch / "done").write_text(json.dumps({"key": json.loads(key), "accuracy_by_depth": accuracy}))
    shutil.rmtree(root, ignore_errors=True)
    os.replace(scratch, root)


# -- zai-org/GLM-OCR exactly as published -----------------------------------------------------
#
# The files of the hub repo (README, config.json, generation_config.json, model.safetensors (one
# bf16 shard, the MTP layer inside as layer 16), tokenizer.json, tokenizer_config.json,
# chat_template.jinja, preprocessor_config.json), with config.json in its published form: no
# top-level dtype, `dtype: bfloat16`, `attention_bias` and `tie_word_embeddings` inside
# text_config, full rotary (partial_rotary_factor 1.0), and a vision_config without
# rope_parameters. Sources: the config.json served by huggingface.co/zai-org/GLM-OCR (quoted in
# public transcripts), transformers' GlmOcrConfig defaults, the GLM-OCR model card.

PUBLISHED_TRANSFORMERS_VERSION = "5.0.1dev0"
PUBLISHED_VISION_KEYS = (
    "model_type", "hidden_size", "depth", "num_heads", "attention_bias", "intermediate_size",
    "hidden_act", "hidden_dropout_prob", "initializer_range", "image_size", "patch_size",
    "out_hidden_size", "rms_norm_eps", "spatial_merge_size", "temporal_patch_size",
)
PUBLISHED_README = """---
license: mit
pipeline_tag: image-to-text
library_name: transformers
---

# GLM-OCR (tiny random test checkpoint in the published layout)
"""


def make_published_glm_ocr(out, seed: int = 0) -> Path:
    """A tiny random GLM-OCR in the exact file layout and config form of zai-org/GLM-OCR."""
    out = make_tiny_glm_ocr(out, seed=seed, rope_parameters={
        "rope_type": "default", "mrope_section": [2, 3, 3], "partial_rotary_factor": 1.0, "rope_theta": 10000,
    })
    config = read_config(out)
    (out / "config.json").write_text(json.dumps(published_glm_ocr_config(config), indent=2))
    to_bfloat16(out / "model.safetensors")
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer_config.update({
        "clean_up_tokenization_spaces": False, "extra_special_tokens": SPECIAL_TOKENS,
        "padding_side": "left", "processor_class": "Glm46VProcessor", "model_max_length": 655380,
    })
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (out / "README.md").write_text(PUBLISHED_README)
    return out


def published_glm_ocr_config(config: dict) -> dict:
    """transformers 5.23's save of a GlmOcrConfig, rewritten to the published key set."""
    text = dict(config["text_config"])
    text.update(attention_bias=False, dtype="bfloat16", tie_word_embeddings=False)
    vision = {k: config["vision_config"].get(k, 0.0) for k in PUBLISHED_VISION_KEYS}
    published = {"architectures": ["GlmOcrForConditionalGeneration"], "model_type": "glm_ocr",
                 "text_config": dict(sorted(text.items())), "vision_config": vision}
    for key in ("image_start_token_id", "image_end_token_id", "video_start_token_id",
                "video_end_token_id", "image_token_id", "video_token_id"):
        published[key] = config[key]
    published["transformers_version"] = PUBLISHED_TRANSFORMERS_VERSION
    return published


def to_bfloat16(path: Path) -> None:
    """Rewrite a safetensors file with every float tensor in bfloat16, as published."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(path, "pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()},
              path, metadata=metadata)
