"""Write the embedded SmolLM2-135M-Instruct (Q4_1 GGUF) as an HF-layout directory that
mlx_lm.server (and any mlx-lm tool) loads: config.json, model.safetensors, tokenizer files.

The weights are the ones Specscope runs on this machine: read by our GGUF loader and, on MLX's
CPU backend, expanded to float32 (engines/mlx_chat/loading.py says why). So a benchmark of
mlx_lm.server on this copy and of `specscope serve` on the GGUF compares the servers, not two
different sets of weights. (The issue's recipe, transformers' `gguf_file=` loader, needs the
`accelerate` package and dequantizes through torch; this one needs nothing we do not ship.)

    python bench/smollm2_hf_layout.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(out: Path) -> Path:
    from mlx_lm.utils import save_model

    from engines.mlx_chat.gguf import ARCHITECTURES, model_config, read_header
    from engines.mlx_chat.loading import load_model
    from engines.mlx_chat.models import default_chat_model

    gguf = Path(default_chat_model())
    loaded = load_model(str(gguf))
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, loaded.model)
    header = read_header(gguf)
    config = model_config(header, ARCHITECTURES[header.metadata["general.architecture"]])
    (out / "config.json").write_text(json.dumps(config, indent=1))
    loaded.tokenizer._tokenizer.save_pretrained(str(out))
    eos = sorted(loaded.tokenizer.eos_token_ids)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/smollm2-hf")))
