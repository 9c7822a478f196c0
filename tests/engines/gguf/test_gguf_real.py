"""The real small GGUF models from PyPI: SmolLM2-135M-Instruct Q4_1 (MLX-native path) and
Gemma 3 270M Q4_K_M (gguf-package path), against transformers' own GGUF code."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch
from mlx_lm import generate

from engines import EngineError
from engines.mlx_chat.gguf import load_gguf
from engines.mlx_chat.models import default_chat_model, gemma3_270m

PROMPTS = ["The quick brown fox jumps over the lazy dog. Paris is the capital of", "def fibonacci(n):\n    "]


def installed(getter):
    try:
        return getter()
    except EngineError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    path = installed(default_chat_model)
    model, tokenizer = load_gguf(path, tokenizer_cache=tmp_path_factory.mktemp("tok"))
    return path, model, tokenizer


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = installed(gemma3_270m)
    model, tokenizer = load_gguf(path, tokenizer_cache=tmp_path_factory.mktemp("tok"))
    return path, model, tokenizer


def chat_answer(model, tokenizer, question: str, max_tokens=24) -> str:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    return generate(model, tokenizer, prompt, max_tokens=max_tokens)


def test_smollm2_answers_the_capital_of_france(smollm2):
    _, model, tokenizer = smollm2
    assert "Paris" in chat_answer(model, tokenizer, "What is the capital of France?")


def test_smollm2_attention_weights_match_transformers_dequantization(smollm2):
    """Q/K as MLX holds them (packed Q4_1, rows un-permuted) equal the gguf package's
    dequantization run through transformers' own reverse permutation (LlamaTensorProcessor)."""
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from engines.mlx_chat.gguf import read_header

    path, model, _ = smollm2
    header = read_header(path)
    processor = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    attention = model.model.layers[3].self_attn
    for name, layer in (("attn_q", attention.q_proj), ("attn_k", attention.k_proj), ("attn_v", attention.v_proj)):
        info = header.tensors[f"blk.3.{name}.weight"]
        raw = np.fromfile(path, dtype=np.uint8, count=info.n_bytes, offset=info.offset)
        expected = processor.process(dequantize(raw.reshape(info.shape[0], -1), info.qtype), f"blk.3.{name}.weight").weights
        ours = mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=layer.group_size, bits=layer.bits)
        np.testing.assert_allclose(np.array(ours.astype(mx.float32)), expected, atol=2e-3, rtol=2e-3)


def test_smollm2_tokenizer_matches_transformers_gguf_tokenizer(smollm2):
    from transformers import AutoTokenizer

    path, _, tokenizer = smollm2
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in PROMPTS + [" lead space\n\nnew\tlines 1234 ünïcödé 日本語 <|im_start|>user"]:
        assert tokenizer.encode(text) == reference(text).input_ids
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == reference.apply_chat_template(messages, tokenize=False)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in tokenizer.eos_token_ids


def transformers_reference(path: Path):
    """transformers' own GGUF loader (it dequantizes to float32), without `accelerate`:
    the config from the file, then load_gguf_checkpoint's tensors."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied
    model.tie_weights()
    return model.eval()


def compare_logits(model, tokenizer, reference):
    for text in PROMPTS:
        ids = tokenizer.encode(text)
        ours = np.array(model(mx.array([ids]))[0].astype(mx.float32))
        with torch.no_grad():
            ref = reference(torch.tensor([ids])).logits[0].numpy()
        # same weights, float16 vs float32 arithmetic: small differences, same predictions
        assert np.abs(ours - ref).max() <= 0.05 * np.abs(ref).max()
        assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


@pytest.mark.slow
def test_smollm2_logits_match_transformers_gguf_loader(smollm2):
    path, model, tokenizer = smollm2
    compare_logits(model, tokenizer, transformers_reference(path))


@pytest.mark.slow
def test_gemma3_270m_k_quants_match_transformers_gguf_loader(gemma):
    """Q4_K/Q6_K dequantized, Q5_0/Q8_0 repacked, norms 1 + w undone, sliding window: logits
    against transformers (which dequantizes everything to float32), text, tokenizer."""
    from transformers import AutoTokenizer

    path, model, tokenizer = gemma
    continuation = generate(model, tokenizer, "The capital of France is", max_tokens=12)
    assert "Paris" in continuation or "France" in continuation, continuation
    compare_logits(model, tokenizer, transformers_reference(path))
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in PROMPTS + [" lead space\n\nnew\tlines 1234 ünïcödé 日本語 <start_of_turn>user"]:
        assert tokenizer.encode(text) == reference(text).input_ids
    assert tokenizer.encode("x")[0] == tokenizer.bos_token_id  # add_bos_token from the file


@pytest.mark.slow  # loading Gemma (262k vocabulary) takes ~15 s
def test_gemma3_270m_sliding_window_config(gemma):
    """llama.cpp's hard-coded Gemma 3 pattern: 5 sliding layers (window 512), then 1 global."""
    _, model, _ = gemma
    flags = [layer.self_attn.is_sliding for layer in model.model.layers]
    assert flags == [(i + 1) % 6 != 0 for i in range(18)]
    assert model.args.sliding_window == 512 and model.args.query_pre_attn_scalar == 256
