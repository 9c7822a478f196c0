"""Loading chat models: an mlx-lm HF-layout directory or a GGUF file, with its tokenizer and
chat template, and one-line EngineErrors for everything a user can get wrong.

Also: the tokenizer check for draft models (a draft must share the target's vocabulary,
token for token).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub

import mlx.core as mx
import mlx.nn as nn

from engines import cpu
from engines.cpu import kernels as cpu_kernels
from engines.types import EngineError, one_line


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    path: str
    model_type: str
    vocab_size: int
    dequantized: bool = False  # quantized layers were expanded to float32 (CPU backend)


def load_model(path: str, lazy: bool = False) -> LoadedModel:
    """An HF-layout directory (config.json + model*.safetensors + tokenizer files) or a .gguf.
    `lazy`: the weights are read when first used (tensor parallel shards them first, so a rank
    reads only its part)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise EngineError(f"model not found: {path}")
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise EngineError(f"not a model: {path} (expected a model directory or a .gguf file)")
        loaded = _load_gguf(p)
    else:
        loaded = _load_hf_dir(p, lazy)
    if not mx.metal.is_available():
        loaded.dequantized = dequantize_layers(loaded.model)
        if cpu.enabled():
            cpu_kernels.install()
    if not lazy:
        materialize(loaded.model)
    return loaded


def materialize(model: nn.Module) -> None:
    """Evaluate the arrays mlx-lm keeps beside the parameters (a RoPE's precomputed `_freqs`:
    Gemma 4's proportional RoPE, Llama 3's scaled one). They stay lazy until first used, and MLX
    ties a lazy array to the thread that made it: a server loads in its main thread and decodes
    in its batch thread, where the first forward failed with "There is no Stream(cpu, 0) in
    current thread" (a Gemma 4 with KV-shared layers: the memory check's forward in the main
    thread never reached their RoPE). A lazy load calls it once its own part is read."""
    mx.eval([v for m in model.modules() for v in m.values() if isinstance(v, mx.array)])


def dequantize_layers(model: nn.Module) -> bool:
    """Replace quantized layers by float32 ones. For MLX's CPU backend only: its quantized
    matmul kernels cost time linear in the tokens of a forward (SmolLM2 Q4_1 here: 136 ms for
    1 token, 253 ms for 2), so verifying k drafts costs k+1 plain steps and speculation cannot
    pay off, while dense float32 matmuls go to BLAS and are nearly flat in the token count
    (59 ms for 1 token, 87 ms for 8, with OpenBLAS; also 2.3x faster for plain decoding).
    On Metal quantized layers stay packed: there a forward is bound by weight bandwidth.
    Returns whether anything was dequantized."""
    from mlx.utils import tree_unflatten

    dense = []
    for name, layer in model.named_modules():
        if isinstance(layer, nn.QuantizedLinear):
            w = mx.dequantize(layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits)
            has_bias = "bias" in layer
            new = nn.Linear(w.shape[1], w.shape[0], bias=has_bias)
            new.weight = w.astype(mx.float32)
            if has_bias:
                new.bias = layer.bias.astype(mx.float32)
        elif isinstance(layer, nn.QuantizedEmbedding):
            w = mx.dequantize(layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits)
            new = nn.Embedding(w.shape[0], w.shape[1])
            new.weight = w.astype(mx.float32)
        else:
            continue
        dense.append((name, new))
    if dense:
        model.update_modules(tree_unflatten(dense))
        mx.eval(model.parameters())
    return bool(dense)


def _load_gguf(p: Path) -> LoadedModel:
    from engines.mlx_chat.gguf import load_gguf

    model, tokenizer = load_gguf(str(p))
    model_type = getattr(getattr(model, "args", None), "model_type", None) or getattr(model, "model_type", "gguf")
    return LoadedModel(model, tokenizer, str(p), str(model_type), _vocab_size(model, tokenizer))


def _read_config(p: Path) -> dict:
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise EngineError(f"not a model directory: {p} has no config.json")
    try:
        config = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EngineError(f"corrupt config.json in {p}: {e}") from e
    if not isinstance(config, dict) or "model_type" not in config:
        raise EngineError(f"config.json in {p} has no model_type")
    return config


def _check_architecture(config: dict, p: Path) -> None:
    from mlx_lm.utils import _get_classes

    try:
        _get_classes(config)
    except ValueError as e:
        raise EngineError(
            f"unsupported architecture {config['model_type']!r} in {p}: mlx-lm has no module for it"
        ) from e


def _load_hf_dir(p: Path, lazy: bool = False) -> LoadedModel:
    from mlx_lm.utils import load_model as mlx_load_model
    from mlx_lm.utils import load_tokenizer

    config = _read_config(p)
    if not list(p.glob("model*.safetensors")):
        raise EngineError(f"not a model directory: {p} has no model*.safetensors weights")
    _check_architecture(config, p)
    try:
        model, config = mlx_load_model(p, lazy=lazy, model_config=_published_overrides(config))
    except (ValueError, RuntimeError, OSError, KeyError) as e:
        raise EngineError(f"corrupt or mismatched weights in {p}: {one_line(e)}") from e
    try:
        tokenizer = load_tokenizer(p, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:  # transformers raises many kinds for a broken tokenizer
        raise EngineError(f"cannot load the tokenizer in {p}: {one_line(e)}") from e
    return LoadedModel(model, tokenizer, str(p), config["model_type"], _vocab_size(model, tokenizer))


def _published_overrides(config: dict) -> dict:
    """Fields a published config leaves to mlx-lm's defaults where those defaults are wrong.
    A multimodal Gemma 4 config (model_type gemma4) states its vocabulary only in text_config,
    as Google publishes it; mlx-lm's gemma4 reads a top-level vocab_size with the 262144 of
    the released models as its default and overwrites text_config's with it."""
    text = config.get("text_config")
    if config["model_type"] == "gemma4" and "vocab_size" not in config and isinstance(text, dict) \
            and "vocab_size" in text:
        return {"vocab_size": text["vocab_size"]}
    return {}


def _vocab_size(model, tokenizer) -> int:
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None)
    return int(size) if size else len(tokenizer.get_vocab())


class TokenizerMismatch(EngineError):
    """A draft model whose tokenizer is not the target's (the user's to fix: never a fallback)."""


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft model proposes token ids; they only mean the same text if both tokenizers map
    every token to the same id. Compare the mappings, not just their sizes."""
    t_vocab = target.tokenizer.get_vocab()
    d_vocab = draft.tokenizer.get_vocab()
    where = f"draft model {draft.path} does not share the target's tokenizer"
    if len(t_vocab) != len(d_vocab):
        raise TokenizerMismatch(f"{where}: {len(d_vocab)} tokens vs {len(t_vocab)}")
    differ = [tok for tok, i in t_vocab.items() if d_vocab.get(tok) != i]
    if differ:
        raise TokenizerMismatch(
            f"{where}: {len(differ)} tokens map to different ids (e.g. {differ[0]!r})"
        )
