"""A draft model for SmolLM2 made from SmolLM2 itself: its first N decoder layers, its final norm
and its (tied) head -- the layer-skip idea (LayerSkip, Elhoushi et al. 2024, drafts with the
early layers of the target) without the training that makes early exits good, so its drafts
are accepted far less often than a trained drafter's. It exists so the serve benchmark has a
draft model row on the embedded model, whose family ships no smaller model.

    python bench/smollm2_truncated_draft.py [--layers 8]   (reads bench/smollm2_hf_layout.py's copy)
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HF_COPY = Path("/tmp/specscope-bench/smollm2-hf")


def truncated(layers: int, out: Path) -> Path:
    from safetensors.numpy import load_file, save_file

    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((HF_COPY / "config.json").read_text())
    config["num_hidden_layers"] = layers
    weights = {}
    for f in sorted(HF_COPY.glob("*.safetensors")):
        for name, w in load_file(str(f)).items():
            if ".layers." in name and int(name.split(".layers.")[1].split(".")[0]) >= layers:
                continue
            weights[name] = w
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for f in HF_COPY.iterdir():
        if f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, out / f.name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    print(truncated(args.layers, HF_COPY.parent / f"smollm2-first{args.layers}"))


if __name__ == "__main__":
    main()
