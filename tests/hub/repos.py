"""Small repositories in real on-disk formats, for the loopback hub to serve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

MiB = 1 << 20


def write_safetensors(path: Path, n_bytes: int, seed: int = 0) -> Path:
    """A real safetensors file holding one uint8 tensor of `n_bytes` random values."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    save_file({"weight": rng.integers(0, 256, size=n_bytes, dtype=np.uint8)}, str(path))
    return path


def make_small_repo(folder: Path, weights_bytes: int = 64 * 1024, seed: int = 0) -> Path:
    """config + safetensors weights + tokenizer/chat-template files, plus files the allow-list
    must refuse (a pickle and custom code), as a careless upload might hold."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (folder / "README.md").write_text("# a model card, not needed to run")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04pickle, never fetched")
    (folder / "modeling_custom.py").write_text("raise SystemExit('custom code must never run')\n")
    write_safetensors(folder / "model.safetensors", weights_bytes, seed)
    return folder


def make_big_repo(folder: Path, weights_bytes: int = 21 * MiB) -> Path:
    """Like make_small_repo, with weights over two of huggingface_hub's 10 MiB chunks, so a
    transfer can be cancelled or resumed in the middle of the file."""
    return make_small_repo(folder, weights_bytes, seed=1)
