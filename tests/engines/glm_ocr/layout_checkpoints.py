"""Tiny PP-DocLayoutV3 checkpoints in the real on-disk format, and pages to run them on.

`make_tiny_layout(dir, kind)` writes what a snapshot of PaddlePaddle/PP-DocLayoutV3_safetensors
holds: config.json + model.safetensors saved by transformers' own
PPDocLayoutV3ForObjectDetection (the published 25 labels, a backbone and heads of width 16,
30 queries), and preprocessor_config.json with the published values (800 x 800, rescale 1/255,
mean 0, std 1; written by hand: the processor class needs torchvision to be built).

A random detector finds random boxes, so each kind fixes its weights to make a known outcome
on `layout_page()` (deterministic: seeded weights, one torch thread):
  "nothing"  the model as transformers initialises it: every score is the prior 1/26, below
             the SDK's threshold of 0.3, so the layout finds no region
  "regions"  seeded weights with the heads scaled up: two regions on the page (a doc_title read
             as text and a display_formula read as a formula)
  "slivers"  the same with other seeds and scales: a few regions 1-5 px wide, thinner than
             the vision encoder's 28 px
"""

from __future__ import annotations

import json
from pathlib import Path

ID2LABEL = {
    0: "abstract", 1: "algorithm", 2: "aside_text", 3: "chart", 4: "content", 5: "display_formula", 6: "doc_title",
    7: "figure_title", 8: "footer", 9: "footer_image", 10: "footnote", 11: "formula_number", 12: "header",
    13: "header_image", 14: "image", 15: "inline_formula", 16: "number", 17: "paragraph_title", 18: "reference",
    19: "reference_content", 20: "seal", 21: "table", 22: "text", 23: "vertical_text", 24: "vision_footnote",
}

PREPROCESSOR_CONFIG = {
    "image_processor_type": "PPDocLayoutV3ImageProcessor",
    "do_resize": True, "size": {"height": 800, "width": 800}, "resample": 3,
    "do_rescale": True, "rescale_factor": 0.00392156862745098,
    "do_normalize": True, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
}

KINDS = {"nothing": None, "regions": (0, 3.0), "slivers": (2, 8.0)}  # kind -> (seed, head scale)


def tiny_config():
    from transformers import PPDocLayoutV3Config

    width = 16
    backbone = {
        "model_type": "hgnet_v2", "arch": "L", "return_idx": [0, 1, 2, 3],
        "hidden_sizes": [width] * 4, "stem_channels": [3, width, width], "stage_in_channels": [width] * 4,
        "stage_mid_channels": [width] * 4, "stage_out_channels": [width] * 4, "stage_num_blocks": [1, 1, 1, 1],
        "stage_numb_of_layers": [1, 1, 1, 1], "freeze_stem_only": True, "freeze_at": 0, "freeze_norm": True,
        "lr_mult_list": [0, 0.05, 0.05, 0.05, 0.05], "out_features": ["stage1", "stage2", "stage3", "stage4"],
    }
    return PPDocLayoutV3Config(
        backbone_config=backbone, encoder_hidden_dim=width, encoder_in_channels=[width] * 3, feat_strides=[8, 16, 32],
        encoder_layers=1, encoder_ffn_dim=2 * width, encoder_attention_heads=2, mask_feature_channels=[width, width],
        x4_feat_dim=width, d_model=width, num_queries=30, decoder_in_channels=[width] * 3, decoder_ffn_dim=width,
        decoder_layers=1, decoder_attention_heads=2, num_denoising=0, global_pointer_head_size=width,
        num_prototypes=8, id2label=ID2LABEL, label2id={v: k for k, v in ID2LABEL.items()},
    )


def make_tiny_layout(out: Path, kind: str = "regions") -> Path:
    import torch
    from transformers import PPDocLayoutV3ForObjectDetection

    out = Path(out)
    torch.manual_seed(0)
    model = PPDocLayoutV3ForObjectDetection(tiny_config()).eval()
    if KINDS[kind] is not None:
        seed, scale = KINDS[kind]
        _spread(model, seed, scale)
    model.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    return out


def _spread(model, seed: int, scale: float) -> None:
    """Seeded matrices everywhere; the box and class heads scaled up so that queries differ in
    box and class; five classes (text, table, display_formula, image, paragraph_title) favoured."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        head = model.model.enc_bbox_head.layers[2]
        head.weight.mul_(scale)
        head.bias.fill_(-1.0)
        score = model.model.enc_score_head
        score.weight.mul_(scale)
        score.bias.fill_(-3.0)
        for label in (22, 21, 5, 14, 17):
            score.bias[label] = 0.5


def layout_page(path: Path | None = None, size: tuple[int, int] = (600, 800)):
    """A white page with a dark title bar and two dark blocks (the detector's input)."""
    from PIL import Image, ImageDraw

    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    draw.rectangle((40, 40, 560, 100), fill="black")
    draw.rectangle((40, 150, 280, 700), fill=(90, 90, 90))
    draw.rectangle((320, 150, 560, 400), fill=(30, 30, 30))
    if path is not None:
        page.save(path)
    return page
