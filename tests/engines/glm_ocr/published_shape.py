"""A GLM-OCR checkpoint at the published shapes, with random weights: zai-org/GLM-OCR's
config.json and preprocessor_config.json as published (not save_pretrained's output, which
adds fields the published files lack), random bfloat16 weights under the published tensor
names, sharded with an index, the MTP layer stored as layer 16 with its copies of the
embedding table and the LM head -- about 2.6 GB on disk.

Where the two JSON files come from (no network here): the published config.json as fetched
from the hub's zai-org/GLM-OCR main revision (resolve/main/config.json) in a stored public
transcript (2026-04-30; "transformers_version": "5.0.1dev0"), and preprocessor_config.json as
quoted verbatim, "at revision 2e85a628", in a stored public test file. generation_config.json
is written from the published values (do_sample false, eos [59246, 59253], pad 59246). The
tokenizer is the tiny byte-level one (tests/engines/glm_ocr/checkpoints.py): the model's ids
beyond it decode to nothing, which does not change what is computed."""

from __future__ import annotations

import json
from pathlib import Path

import torch

PUBLISHED_CONFIG = """{
  "architectures": [
    "GlmOcrForConditionalGeneration"
  ],
  "model_type": "glm_ocr",
  "text_config": {
    "model_type": "glm_ocr_text",
    "pad_token_id": 59246,
    "vocab_size": 59392,
    "eos_token_id": [
      59246,
      59253
    ],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1536,
    "initializer_range": 0.02,
    "intermediate_size": 4608,
    "max_position_embeddings": 131072,
    "num_attention_heads": 16,
    "num_hidden_layers": 16,
    "num_nextn_predict_layers": 1,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "dtype": "bfloat16",
    "rope_parameters": {
      "rope_type": "default",
      "mrope_section": [
        16,
        24,
        24
      ],
       "partial_rotary_factor": 1.0,
       "rope_theta": 10000
    },
    "tie_word_embeddings": false,
    "use_cache": true
  },
  "vision_config": {
    "model_type": "glm_ocr_vision",
    "hidden_size": 1024,
    "depth": 24,
    "num_heads": 16,
    "attention_bias": true,
    "intermediate_size": 4096,
    "hidden_act": "silu",
    "hidden_dropout_prob": 0.0,
    "initializer_range": 0.02,
    "image_size": 336,
    "patch_size": 14,
    "out_hidden_size": 1536,
    "rms_norm_eps": 1e-05,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2
  },
  "image_start_token_id": 59256,
  "image_end_token_id": 59257,
  "video_start_token_id": 59258,
  "video_end_token_id": 59259,
  "image_token_id": 59280,
  "video_token_id": 59281,
  "transformers_version": "5.0.1dev0"
}
"""

PUBLISHED_PREPROCESSOR = """{
    "size": {"shortest_edge": 12544, "longest_edge": 9633792},
    "do_rescale": true,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Glm46VImageProcessor",
    "processor_class": "Glm46VProcessor"
}"""

PUBLISHED_GENERATION = {"do_sample": False, "eos_token_id": [59246, 59253], "pad_token_id": 59246}


def make_published_shape_glm_ocr(out: str | Path, seed: int = 0) -> Path:
    """Build the checkpoint in `out` (skipped when `out` already holds a complete one)."""
    from tests.engines.glm_ocr.checkpoints import one_builder

    with one_builder(Path(out)):
        return build_published_shape_glm_ocr(Path(out), seed)


def build_published_shape_glm_ocr(out: Path, seed: int) -> Path:
    from safetensors.torch import save_file
    from transformers import AutoConfig, GlmOcrForConditionalGeneration

    from tests.engines.glm_ocr.checkpoints import CHAT_TEMPLATE, random_mtp_weights, write_tokenizer

    done = out / ".complete"
    if done.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(PUBLISHED_CONFIG)
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bfloat16: one copy of the weights, as published
    try:
        model = GlmOcrForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(out, max_shard_size="1GB")
    mtp = {k: v.to(torch.bfloat16).contiguous() for k, v in random_mtp_weights(model, seed + 1).items()}
    del model
    shard = "model-mtp.safetensors"
    save_file(mtp, out / shard, metadata={"format": "pt"})
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update({k: shard for k in mtp})
    index_path.write_text(json.dumps(index, indent=2))
    # the published files, as they are (save_pretrained wrote its own)
    (out / "config.json").write_text(PUBLISHED_CONFIG)
    (out / "preprocessor_config.json").write_text(PUBLISHED_PREPROCESSOR)
    (out / "generation_config.json").write_text(json.dumps(PUBLISHED_GENERATION, indent=2))
    write_tokenizer(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    done.write_text("ok\n")
    return out


def fixture_page(path: str | Path, width: int = 448, height: int = 448) -> Path:
    """A plain page of dark text lines on white, `width` x `height` pixels (448 x 448: 1,024
    patches, 256 image tokens under the published processor)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for row, y in enumerate(range(16, height - 24, 22)):
        draw.text((16, y), f"{row + 1:02d}  The quick brown fox jumps over the lazy dog; 0123456789.", fill="black")
    image.save(path)
    return Path(path)
