"""Tiny random checkpoints in the real HF on-disk layout, for the chat engine's tests.

Each builder writes config.json + model.safetensors (transformers' own classes, save_pretrained)
and a small word-level tokenizer (tokenizer.json + tokenizer_config.json with a chat template,
generation_config.json with the EOS id), so `mlx_lm.load` and our loader read them as they
would read a real model. Weights are float32 so that batched verification and one-token
decoding agree to the last bit that matters for argmax.

By default the EOS token is the tokenizer's last id and the model's vocabulary stops just
before it: a random model then never ends a generation early, so tests can run far past the
sliding window. `reachable_eos=True` gives the model a row for EOS as well.

Plain functions, reusable by other test folders (e.g. the app tests).
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = (
    "the a an of to in on at by for with from and or but not is are was were be been it "
    "this that these those he she they we you i my your his her their our cat dog bird fish "
    "tree house road river sun moon star red blue green big small old new fast slow run walk "
    "see say make take give find think know want use go come"
).split()
SPECIALS = ["<unk>", "<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
EOS = "</s>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_tokenizer(directory: str | Path, words: list[str] | tuple[str, ...] = WORDS) -> int:
    """A word-level tokenizer: specials, then `words`, then EOS (the last id). Returns the
    tokenizer's vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate([*SPECIALS, *words, EOS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token=EOS,
        unk_token="<unk>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
    return len(vocab)


def _finish(directory: Path, model, n_tokenizer: int, reachable_eos: bool, extra: dict | None) -> Path:
    model.save_pretrained(str(directory), safe_serialization=True)
    eos_id = n_tokenizer - 1
    cfg_path = directory / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eos_token_id"] = eos_id
    cfg["bos_token_id"] = 1
    cfg.update(extra or {})
    cfg_path.write_text(json.dumps(cfg, indent=1))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id}))
    return directory


def _vocab(directory: Path, words, reachable_eos: bool) -> tuple[int, int]:
    n_tokenizer = write_tokenizer(directory, words)
    return n_tokenizer, n_tokenizer if reachable_eos else n_tokenizer - 1


def make_tiny_llama(
    directory: str | Path,
    *,
    seed: int = 0,
    hidden: int = 48,
    layers: int = 2,
    words: list[str] | tuple[str, ...] = WORDS,
    reachable_eos: bool = False,
    tie_word_embeddings: bool = False,
    scale: float = 1.0,
) -> Path:
    """A 2-layer LlamaForCausalLM (model_type llama) with random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    n_tok, vocab = _vocab(directory, words, reachable_eos)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=n_tok - 1,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    _scale_up(model, torch, scale)
    return _finish(directory, model, n_tok, reachable_eos, None)


def make_tiny_gemma3(
    directory: str | Path,
    *,
    sliding_window: int = 8,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    words: list[str] | tuple[str, ...] = WORDS,
    reachable_eos: bool = False,
    scale: float = 2.0,
    tie_word_embeddings: bool = False,
) -> Path:
    """A Gemma3ForCausalLM (model_type gemma3_text), sliding and full layers alternating
    (pattern 2). Real Gemma 3 ties its embeddings; a tiny random tied model just repeats its
    input token (the scaled embedding dominates the residual), which would make every test
    past the sliding window trivial, so the head is untied by default (mlx-lm's gemma3_text
    reads lm_head.weight when present)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    n_tok, vocab = _vocab(directory, words, reachable_eos)
    torch.manual_seed(seed)
    pattern = 2
    config = Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=sliding_window,
        layer_types=[
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)
        ],
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=n_tok - 1,
        pad_token_id=0,
    )
    model = Gemma3ForCausalLM(config).to(torch.float32)
    _scale_up(model, torch, scale)
    # transformers 5 writes layer_types only; mlx-lm's gemma3_text reads sliding_window_pattern
    # (and its rope defaults equal transformers' defaults: 1e6 global, 1e4 local).
    return _finish(directory, model, n_tok, reachable_eos, {"sliding_window_pattern": pattern})


def _scale_up(model, torch, scale: float) -> None:
    """Random init (std 0.02) gives near-uniform logits, where argmax ties and long flat
    distributions make tests weak. Larger weights give a peaked, model-like distribution;
    `scale` also sets how soon greedy decoding falls into loops (which n-gram drafts hit)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, scale / p.shape[-1] ** 0.5)


def perturbed_copy(source: str | Path, directory: str | Path, noise: float = 0.05, seed: int = 1) -> Path:
    """A copy of a checkpoint with Gaussian noise added to every matrix: a draft model that
    the target accepts often but not always. Same tokenizer files, same architecture."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    source, directory = Path(source), Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, directory / f.name)
    rng = np.random.default_rng(seed)
    weights = load_file(str(source / "model.safetensors"))
    for k, w in weights.items():
        if w.ndim == 2:
            weights[k] = (w + noise * w.std() * rng.standard_normal(w.shape)).astype(w.dtype)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def make_tiny_mamba(directory: str | Path, *, seed: int = 0, hidden: int = 32, layers: int = 2,
                    words: list[str] | tuple[str, ...] = WORDS, reachable_eos: bool = False) -> Path:
    """A MambaForCausalLM (model_type mamba): recurrent layers, whose state cannot roll back, so
    the batch cannot hold it (a model that decodes plainly)."""
    import torch
    from transformers import MambaConfig, MambaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    n_tok, vocab = _vocab(directory, words, reachable_eos)
    torch.manual_seed(seed)
    config = MambaConfig(vocab_size=vocab, hidden_size=hidden, state_size=8, num_hidden_layers=layers,
                         expand=2, conv_kernel=4, bos_token_id=1, pad_token_id=0)
    model = MambaForCausalLM(config).to(torch.float32)
    _scale_up(model, torch, 2.0)
    return _finish(directory, model, n_tok, reachable_eos, None)
