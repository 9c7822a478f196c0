"""Tiny GGUF files written with llama.cpp's conventions, loaded by load_gguf, compared with the
transformers model they came from (after the file's own quantization round trip)."""

import mlx.core as mx
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engines.types import EngineError
from engines.mlx_chat.gguf import DTYPE, load_gguf, read_header, read_tensors

from .checkpoints import as_stored, tiny_hf_model, tiny_vocab, write_gguf

PROMPT = [5, 80, 17, 200, 33, 90, 140, 7, 250, 61, 3, 120]  # 12 tokens: past gemma's window of 8


def logits_of(mlx_model, ids) -> np.ndarray:
    return np.array(mlx_model(mx.array([ids]))[0].astype(mx.float32))


def reference_logits(hf_model, ids) -> np.ndarray:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].numpy()


# What the arithmetic reproduces, relative to the largest logit: float32 (MLX's CPU backend)
# measured at most 1.8e-6 on these files, so 1e-5; a doubled rope_theta moves gemma3's logits
# by only 4e-3 and must fail (below). float16 on Metal: 2e-2 (unchecked here: needs a Mac).
TOLERANCE = 1e-5 if DTYPE == mx.float32 else 2e-2


def assert_close(ours, ref, tolerance=TOLERANCE):
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() <= tolerance * scale, (np.abs(ours - ref).max(), scale)


# Q8_0 and Q4_0 are read by MLX natively (kept packed); Q5_0 is not, so the file goes through
# our own reader (repacked at 8 bits, exactly).
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q5_0])
def test_tiny_gguf_logits_match_transformers(tmp_path, arch, qtype):
    hf = tiny_hf_model(arch)
    path = write_gguf(hf, tmp_path / f"tiny-{arch}.gguf", qtype)
    model, _ = load_gguf(path, tokenizer_cache=tmp_path / "tok")
    assert_close(logits_of(model, PROMPT), reference_logits(as_stored(hf, qtype), PROMPT))


def test_native_types_stay_packed(tmp_path):
    native = read_tensors(read_header(write_gguf(tiny_hf_model("llama"), tmp_path / "q4.gguf", Q.Q4_0)))
    assert native["blk.0.attn_q.weight"].dtype == mx.uint32
    assert native["blk.0.attn_q.weight"].shape == (64, 64 * 4 // 32)  # 4 bits: 8 per uint32


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1])
def test_block_types_repack_exactly_into_mlx_quantization(qtype):
    """Our own path (used when MLX refuses a file) keeps 32-blocks packed, value for value."""
    from gguf.quants import dequantize, quantize

    from engines.mlx_chat.gguf import repack_legacy_blocks

    weights = np.random.default_rng(0).normal(0, 0.5, (48, 96)).astype(np.float32)
    raw = quantize(weights, qtype)
    packed, scales, biases = repack_legacy_blocks(raw.reshape(-1), qtype.name, weights.shape)
    bits = 4 if qtype.name.startswith("Q4") else 8
    assert packed.dtype == mx.uint32 and packed.shape == (48, 96 * bits // 32)
    ours = mx.dequantize(packed, scales, biases, group_size=32, bits=bits)
    np.testing.assert_allclose(np.array(ours.astype(mx.float32)), dequantize(raw, qtype), rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_tiny_qwen_gguf_logits_match_transformers(tmp_path, arch):
    hf = tiny_hf_model(arch)
    path = write_gguf(hf, tmp_path / f"tiny-{arch}.gguf", Q.Q8_0)
    model, _ = load_gguf(path, tokenizer_cache=tmp_path / "tok")
    assert_close(logits_of(model, PROMPT), reference_logits(as_stored(hf, Q.Q8_0), PROMPT))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_breaking_llama_cpp_convention_breaks_logits(tmp_path, arch):
    """Negative control: a file without llama.cpp's q/k permutation (llama) or without the 1 + w
    norm shift (gemma3) must NOT match, so the tests above do check those conventions."""
    hf = tiny_hf_model(arch)
    path = write_gguf(hf, tmp_path / "wrong.gguf", Q.Q8_0, permute_qk=False, norm_plus_one=False)
    model, _ = load_gguf(path, tokenizer_cache=tmp_path / "tok")
    ours, ref = logits_of(model, PROMPT), reference_logits(as_stored(hf, Q.Q8_0), PROMPT)
    assert np.abs(ours - ref).max() > 0.1 * np.abs(ref).max()


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3"])
@pytest.mark.parametrize("mistake", [{"rope_theta_factor": 2.0}, {"swap_norms": True}], ids=["rope_theta x2", "norms swapped"])
def test_the_tolerance_catches_a_wrong_file(tmp_path, arch, mistake):
    """Must fail: a file with rope_theta doubled, or two norm weights swapped, is off by more
    than the tolerance (the 2% this test used to allow let a doubled rope_theta through)."""
    hf = tiny_hf_model(arch)
    path = write_gguf(hf, tmp_path / "wrong.gguf", Q.Q8_0, **mistake)
    model, _ = load_gguf(path, tokenizer_cache=tmp_path / "tok")
    with pytest.raises(AssertionError):
        assert_close(logits_of(model, PROMPT), reference_logits(as_stored(hf, Q.Q8_0), PROMPT))


def test_the_header_reader_agrees_with_gguf_reader(tmp_path):
    """Our header parser (kept for speed, see read_header) reads what gguf.GGUFReader reads."""
    from gguf import GGUFReader

    path = write_gguf(tiny_hf_model("gemma3"), tmp_path / "tiny.gguf", Q.Q4_0)
    ours, theirs = read_header(path), GGUFReader(path)
    assert {t.name: (tuple(int(d) for d in reversed(t.shape)), t.tensor_type, int(t.data_offset)) for t in theirs.tensors} == {
        name: (t.shape, t.qtype, t.offset) for name, t in ours.tensors.items()}
    compared = 0
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):  # the file's own header fields, not metadata
            continue
        want = field.contents()
        if isinstance(ours.metadata[key], int) and isinstance(want, list):
            want = len(want)  # string arrays the loader does not need are only counted
        assert ours.metadata[key] == pytest.approx(want), key
        compared += 1
    assert compared == len(ours.metadata) > 15


def test_tiny_tokenizer_from_metadata(tmp_path):
    path = write_gguf(tiny_hf_model("llama"), tmp_path / "tiny.gguf")
    _, tokenizer = load_gguf(path, tokenizer_cache=tmp_path / "tok")
    vocab = tiny_vocab()
    assert [vocab[i] for i in tokenizer.encode("hello world")] == ["he", "llo", "Ġw", "or", "l", "d"]
    assert tokenizer.decode(tokenizer.encode("hello world")) == "hello world"
    assert tokenizer.eos_token_ids == {vocab.index("<|im_end|>")}
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # the second load comes from the cache directory (one entry, keyed by the header)
    load_gguf(path, tokenizer_cache=tmp_path / "tok")
    assert len(list((tmp_path / "tok").iterdir())) == 1


def test_unsupported_architecture_is_one_line_engine_error(tmp_path):
    path = write_gguf(tiny_hf_model("llama"), tmp_path / "tiny.gguf")
    data = path.read_bytes()
    # same length: "llama" -> "mamba" in general.architecture (and the keys named after it)
    path.write_bytes(data.replace(b"llama", b"mamba"))
    with pytest.raises(EngineError, match="architecture 'mamba' is not supported") as e:
        load_gguf(path, tokenizer_cache=tmp_path / "tok")
    assert "\n" not in str(e.value)


def test_truncated_and_corrupt_files_are_engine_errors(tmp_path):
    path = write_gguf(tiny_hf_model("llama"), tmp_path / "tiny.gguf")
    data = path.read_bytes()
    cases = {
        "truncated-data.gguf": data[: len(data) - 100],
        "truncated-header.gguf": data[:300],
        "not-gguf.gguf": b"PK\x03\x04" + data[4:],
        "empty.gguf": b"",
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(EngineError) as e:
            load_gguf(tmp_path / name, tokenizer_cache=tmp_path / "tok")
        assert "\n" not in str(e.value), name
    with pytest.raises(EngineError, match="not found"):
        load_gguf(tmp_path / "missing.gguf")
