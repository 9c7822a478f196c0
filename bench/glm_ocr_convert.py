"""GLM-OCR conversion at the real model's widths (no download: random weights in the real
on-disk format), to see that the converter and the packages hold at full size.

    python bench/glm_ocr_convert.py [--text-layers 2] [--vision-layers 2] [--seq-len 8] [--cache-length 2048]

Real GLM-OCR widths: text hidden 1536, 16 heads (8 KV) of 128, MLP 4608, vocab 59392, mRoPE
sections [16, 24, 24]; vision hidden 1024, 16 heads, MLP 4096. Only the depths are reduced
(16 text / 24 vision layers by default in the real model; pass them to convert all of it, it
needs ~15 GB of RAM). Prints conversion time per package, package sizes and parity; per-layer
figures scale the reduced depths up to the real model's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engines.glm_ocr.convert import convert_glm_ocr  # noqa: E402
from tests.engines.glm_ocr import checkpoints  # noqa: E402

REAL_TEXT = dict(hidden_size=1536, intermediate_size=4608, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, vocab_size=59392)
REAL_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0, "mrope_section": [16, 24, 24]}
REAL_VISION = dict(hidden_size=1024, num_heads=16, intermediate_size=4096, out_hidden_size=1536)


def make_checkpoint(out: Path, text_layers: int, vision_layers: int) -> Path:
    """The tiny builder's format (tokenizer, processor, MTP under its real names) at real widths."""
    import json

    from transformers import GenerationConfig, GlmOcrForConditionalGeneration

    config = checkpoints.tiny_config(num_hidden_layers=text_layers, rope_parameters=REAL_ROPE, **REAL_TEXT)
    for key, value in dict(REAL_VISION, depth=vision_layers).items():
        setattr(config.vision_config, key, value)
    torch.manual_seed(0)
    model = GlmOcrForConditionalGeneration(config).eval()
    model.save_pretrained(out)
    GenerationConfig(eos_token_id=config.text_config.eos_token_id, do_sample=False).save_pretrained(out)
    checkpoints.write_tokenizer(out)
    checkpoints.write_processor(out)
    processor = json.loads((out / "preprocessor_config.json").read_text())
    processor["size"] = {"shortest_edge": 12544, "longest_edge": 9633792}  # GLM-OCR's own budget
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    checkpoints.write_mtp_weights(out, checkpoints.random_mtp_weights(model, 1))
    return out


def size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--vision-layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=8)
    parser.add_argument("--cache-length", type=int, default=2048)
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        t0 = time.perf_counter()
        checkpoint = make_checkpoint(scratch / "hf", args.text_layers, args.vision_layers)
        print(f"checkpoint: {time.perf_counter() - t0:.1f} s, {size_mb(checkpoint):.0f} MB "
              f"({args.text_layers} text layers + MTP, {args.vision_layers} vision layers)")
        t0 = time.perf_counter()
        manifest = convert_glm_ocr(checkpoint, scratch / "out", seq_len=args.seq_len, cache_length=args.cache_length,
                                   progress=lambda message, fraction: print(f"  [{100 * fraction:5.1f}%] {message}", flush=True))
        total = time.perf_counter() - t0
        print(f"conversion: {total:.1f} s")
        print(f"{'package':10} {'seconds':>8} {'MB':>8} {'max abs error':>14} {'ref scale':>10}")
        for name, entry in manifest["packages"].items():
            parity = entry["parity"]
            print(f"{name:10} {entry['conversion_seconds']:8.1f} {size_mb(scratch / 'out' / entry['path']):8.1f} "
                  f"{parity['max_abs_error']:14.2e} {parity['reference_max_abs']:10.2f}")
        print(f"embeddings.npy {size_mb(scratch / 'out' / 'embeddings.npy'):.1f} MB; "
              f"vision patches {manifest['packages']['vision']['num_patches']}; "
              f"LM head chunks {manifest['packages']['lm_head']['vocab_chunks']}")


if __name__ == "__main__":
    main()
