"""The layout stage (PP-DocLayoutV3) at the published shapes on this machine: per page, the
preprocessing, the model's forward and the post-processing, through the product's own
LayoutModel, and the process's peak RSS.

    python bench/layout_stage.py [--pages 4] [--threads 2] [--checkpoint DIR]

The checkpoint (random float32 weights; transformers' PPDocLayoutV3Config defaults, 33.2M
parameters like the published PaddlePaddle/PP-DocLayoutV3_safetensors, with its 25 labels and
the published preprocessor_config.json values) is built into --checkpoint once. The page is an
A4 page at 200 dpi (1654 x 2339) of grey text lines. Random weights find random regions: the
post-processing's time is not a real page's, the forward's is. The load average before the
run is printed with the figures: on a shared machine they move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(out: Path) -> Path:
    import torch
    from transformers import PPDocLayoutV3Config, PPDocLayoutV3ForObjectDetection

    from tests.engines.glm_ocr.layout_checkpoints import ID2LABEL, PREPROCESSOR_CONFIG

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    config = PPDocLayoutV3Config(id2label=ID2LABEL, label2id={v: k for k, v in ID2LABEL.items()})
    PPDocLayoutV3ForObjectDetection(config).eval().save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    return out


def page():
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (1654, 2339), "white")
    draw = ImageDraw.Draw(image)
    for y in range(200, 2200, 60):
        draw.rectangle((150, y, 1500 - (y * 7) % 400, y + 28), fill=(60, 60, 60))
    return image


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "specscope-layout-published"))
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from engines.glm_ocr.layout import LayoutModel, LayoutSettings, decode_detections, find_regions, pixel_values

    load = os.getloadavg()[0]
    started = time.perf_counter()
    model = LayoutModel.load(build(Path(args.checkpoint)))
    print(f"load {time.perf_counter() - started:.1f} s, {sum(x.numel() for x in model.model.parameters()) / 1e6:.1f}M "
          f"parameters, {args.threads} threads, load average {load:.2f}")
    image = page()
    settings = LayoutSettings()
    for i in range(args.pages):
        t0 = time.perf_counter()
        x = pixel_values(image, model.prep)
        t1 = time.perf_counter()
        with torch.inference_mode():
            out = model.model(pixel_values=x)
        t2 = time.perf_counter()
        found = decode_detections(out.logits[0], out.pred_boxes[0], out.order_logits[0], image.width, image.height,
                                  settings.lowest_threshold())
        regions = find_regions(found, image.size, model.id2label, settings)
        t3 = time.perf_counter()
        print(f"page {i + 1}: preprocess {1000 * (t1 - t0):.0f} ms, forward {t2 - t1:.2f} s, "
              f"post-process {1000 * (t3 - t2):.0f} ms ({len(found)} detections -> {len(regions)} regions)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
