"""Load a llama.cpp GGUF file as an mlx-lm model and its tokenizer.

    model, tokenizer = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")

The steps, top to bottom in `load_gguf`:
1. read the header (our own small parser: gguf.GGUFReader is slow on a real vocabulary; a test
   holds it to GGUFReader's reading) and pick the mlx-lm model module;
2. read the tensors: MLX's own GGUF reader (`mx.load`) where it can read the whole file
   (F32/F16 and Q4_0/Q4_1/Q8_0, which it keeps packed as MLX affine quantization, group 32);
   otherwise our own reader: 32-blocks (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0) repacked exactly as MLX
   quantization, K-quants and the rest dequantized by the gguf package (to DTYPE);
3. undo llama.cpp's conversion choices: tensor names, the q/k row permutation of the
   llama family, Gemma's norm weights stored as 1 + w;
4. build the mlx-lm Model from a config made of the metadata and load the weights;
5. build the tokenizer with transformers' GGUF tokenizer converter (cached on disk, keyed by
   the header's hash: it takes seconds), with the file's chat template and end-of-turn ids.

Float tensors (and so activations) are DTYPE: float16 on Metal, float32 on MLX's CPU backend.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engines.types import EngineError



def compute_dtype() -> mx.Dtype:
    """The dtype of every float tensor (norms, dequantized weights, quantization scales and
    biases), hence of the activations. float16 on Metal. float32 on MLX's CPU backend, whose
    float16 quantized matmul is many times slower than its float32 one."""
    return mx.float16 if mx.metal.is_available() else mx.float32


DTYPE = compute_dtype()

GROUP_SIZE = 32  # llama.cpp's quantization block = the MLX group size we pack into


@dataclass(frozen=True)
class Architecture:
    """How llama.cpp stored one architecture, and which mlx-lm module runs it."""

    model_type: str  # mlx-lm module name (mlx_lm.models.<model_type>)
    permute_qk: bool = False  # llama.cpp permuted q/k rows for its interleaved rope
    norm_plus_one: bool = False  # llama.cpp stored RMSNorm weights as 1 + w
    block_names: dict[str, str] = field(default_factory=dict)  # overrides of BLOCK_NAMES


# llama.cpp per-layer tensor names -> HF / mlx-lm names (under model.layers.N.)
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

ARCHITECTURES = {
    "llama": Architecture("llama", permute_qk=True),  # also Mistral, SmolLM, TinyLlama
    "qwen2": Architecture("qwen2"),
    "qwen3": Architecture("qwen3"),
    "gemma3": Architecture(
        "gemma3_text",
        norm_plus_one=True,
        block_names={
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
    ),
}


def load_gguf(path: str | Path, *, tokenizer_cache: str | Path | None = None):
    """Return (mlx-lm Model, mlx_lm TokenizerWrapper) for a GGUF file.

    Raises EngineError (one line) for a missing, truncated or corrupt file, an architecture
    or a quantization type we cannot load."""
    path = Path(path)
    header = read_header(path)
    arch_name = header.metadata["general.architecture"]
    arch = ARCHITECTURES.get(arch_name)
    if arch is None:
        raise EngineError(
            f"{path.name}: architecture {arch_name!r} is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    if "rope_freqs.weight" in header.tensors:
        raise EngineError(f"{path.name}: per-frequency rope factors (Llama 3.1+ style) are not supported yet")

    config = model_config(header, arch)
    weights = read_tensors(header)
    weights = to_mlx_lm_weights(weights, arch, config)
    model = build_model(config, weights, path.name)
    tokenizer = load_gguf_tokenizer(header, cache_root=tokenizer_cache)
    return model, tokenizer


# ---------------------------------------------------------------- file and metadata

# GGUF metadata value types (gguf spec): fixed-size scalars by struct format; 8 string, 9 array.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# String arrays are walked, not kept (a 262k-token vocabulary takes a while), except these.
_KEPT_STRING_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (rows first); GGUF stores it reversed
    qtype: object  # gguf.GGMLQuantizationType
    offset: int  # absolute, in the file
    n_bytes: int


@dataclass
class GGUFHeader:
    """Everything in a GGUF file except the tensor data."""

    path: Path
    metadata: dict
    tensors: dict[str, TensorInfo]
    data_offset: int  # where the tensor data starts; the bytes before it are the header

    def arch_value(self, key: str, default=None):
        return self.metadata.get(f"{self.metadata.get('general.architecture')}.{key}", default)


def read_header(path: Path) -> GGUFHeader:
    """Parse a GGUF header. Problems -> EngineError."""
    # Not gguf.GGUFReader: it builds numpy fields for every vocabulary string, many times slower
    # than this on a real vocabulary; a test holds this parser to GGUFReader's reading.
    if not path.is_file():
        raise EngineError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        try:
            blob = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # empty file
            raise EngineError(f"{path.name} is not a GGUF file: {e}") from e
    try:
        return _parse_header(path, blob)
    except (struct.error, UnicodeDecodeError, ValueError, KeyError, OverflowError, MemoryError) as e:
        raise EngineError(f"{path.name} is not a readable GGUF file (truncated or corrupt?): {e}") from e
    finally:
        blob.close()


def _parse_header(path: Path, blob) -> GGUFHeader:
    from gguf import GGMLQuantizationType
    from gguf.constants import GGML_QUANT_SIZES

    if blob[:4] != b"GGUF":
        raise ValueError("no GGUF magic bytes at the start")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", blob, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (expected 2 or 3)")
    pos = 24

    def read_string(pos):
        (length,) = struct.unpack_from("<Q", blob, pos)
        end = pos + 8 + length
        if end > len(blob):
            raise ValueError("string runs past the end of the file")
        return blob[pos + 8 : end].decode("utf-8"), end

    def read_value(pos, value_type, keep_strings):
        if value_type in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[value_type]
            return struct.unpack_from(fmt, blob, pos)[0], pos + struct.calcsize(fmt)
        if value_type == _STRING:
            return read_string(pos)
        if value_type != _ARRAY:
            raise ValueError(f"unknown metadata value type {value_type}")
        item_type, count = struct.unpack_from("<IQ", blob, pos)
        pos += 12
        if item_type in _SCALAR_FORMATS:  # numeric arrays (scores, token types): one read
            fmt = _SCALAR_FORMATS[item_type]
            dtype = np.dtype(fmt.replace("?", "b1"))
            end = pos + count * dtype.itemsize
            if end > len(blob):
                raise ValueError("array runs past the end of the file")
            return np.frombuffer(blob[pos:end], dtype=dtype).tolist(), end
        if item_type != _STRING:
            raise ValueError(f"metadata array of type {item_type} is not supported")
        values = []
        for _ in range(count):
            if keep_strings:
                value, pos = read_string(pos)
                values.append(value)
            else:
                (length,) = struct.unpack_from("<Q", blob, pos)
                pos += 8 + length
        return (values if keep_strings else count), pos

    metadata = {}
    for _ in range(n_kv):
        key, pos = read_string(pos)
        (value_type,) = struct.unpack_from("<I", blob, pos)
        metadata[key], pos = read_value(pos + 4, value_type, key in _KEPT_STRING_ARRAYS)

    entries = []
    for _ in range(n_tensors):
        name, pos = read_string(pos)
        (n_dims,) = struct.unpack_from("<I", blob, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", blob, pos + 4)
        pos += 4 + 8 * n_dims
        type_id, offset = struct.unpack_from("<IQ", blob, pos)
        pos += 12
        entries.append((name, tuple(reversed(dims)), type_id, offset))

    alignment = int(metadata.get("general.alignment", 32))
    data_offset = (pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, shape, type_id, offset in entries:
        try:
            qtype = GGMLQuantizationType(type_id)
            block_size, block_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise EngineError(f"{path.name}: tensor {name} has unknown ggml type {type_id}") from None
        n_bytes = math.prod(shape) // block_size * block_bytes
        tensors[name] = TensorInfo(name, shape, qtype, data_offset + offset, n_bytes)
        if data_offset + offset + n_bytes > len(blob):
            raise EngineError(f"{path.name} is truncated: tensor {name} ends past the end of the file")
    if "general.architecture" not in metadata:
        raise ValueError("no general.architecture in the metadata")
    return GGUFHeader(path, metadata, tensors, data_offset)


def model_config(header: GGUFHeader, arch: Architecture) -> dict:
    """An HF-style config dict for the mlx-lm ModelArgs, from llama.cpp's metadata keys."""
    arch_name = header.metadata["general.architecture"]
    meta = header.arch_value

    try:
        hidden = int(meta("embedding_length"))
        n_heads = int(meta("attention.head_count"))
        config = {
            "model_type": arch.model_type,
            "hidden_size": hidden,
            "num_hidden_layers": int(meta("block_count")),
            "intermediate_size": int(meta("feed_forward_length")),
            "num_attention_heads": n_heads,
            "num_key_value_heads": int(meta("attention.head_count_kv", n_heads)),
            "head_dim": int(meta("attention.key_length", hidden // n_heads)),
            "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(meta("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(meta("context_length", 4096)),
        }
    except (TypeError, ValueError) as e:
        raise EngineError(f"GGUF metadata for {arch_name!r} is incomplete: {e}") from e

    tensors = header.tensors
    # The embedding's row count is the real vocabulary size (metadata may omit it).
    config["vocab_size"] = int(tensors["token_embd.weight"].shape[0])
    config["tie_word_embeddings"] = "output.weight" not in tensors
    config["attention_bias"] = "blk.0.attn_q.bias" in tensors

    scaling_type = meta("rope.scaling.type")
    if scaling_type not in (None, "none"):
        config["rope_scaling"] = {"type": scaling_type, "rope_type": scaling_type, "factor": float(meta("rope.scaling.factor", 1.0))}
        if meta("rope.scaling.original_context_length") is not None:
            config["rope_scaling"]["original_max_position_embeddings"] = int(meta("rope.scaling.original_context_length"))

    if arch_name == "gemma3":
        config["sliding_window"] = int(meta("attention.sliding_window", 512))
        # llama.cpp hard-codes Gemma 3's pattern (5 local layers, then 1 global) and local rope
        # base; newer files may carry them.
        config["sliding_window_pattern"] = sliding_window_period(meta("attention.sliding_window_pattern", 6))
        config["rope_local_base_freq"] = float(meta("rope.freq_base_swa", 10000.0))
        # As llama.cpp: attention scale 1/sqrt(head_dim), except Gemma 3 27B (62 layers).
        head_dim = config["head_dim"]
        config["query_pre_attn_scalar"] = hidden // n_heads if config["num_hidden_layers"] == 62 else head_dim
    return config


def sliding_window_period(pattern) -> int:
    """mlx-lm's gemma3 takes a period p (every p-th layer global); llama.cpp writes either p or
    one flag per layer (True = sliding)."""
    if isinstance(pattern, int):
        return pattern
    flags = [bool(f) for f in pattern]
    period = flags.index(False) + 1 if False in flags else len(flags) + 1
    if flags != [(i + 1) % period != 0 for i in range(len(flags))]:
        raise EngineError(f"sliding-window layer pattern {flags} is not periodic; mlx-lm gemma3 needs a period")
    return period


# ---------------------------------------------------------------- tensors


def read_tensors(header: GGUFHeader) -> dict[str, mx.array]:
    """llama.cpp-named tensors. Quantized linear weights come as name.weight (packed uint32),
    name.scales and name.biases (MLX affine quantization)."""
    names = {t.qtype.name for t in header.tensors.values()}
    if names <= MLX_NATIVE_TYPES:
        return mx.load(str(header.path))  # MLX's own reader keeps Q4_0/Q4_1/Q8_0 packed
    return read_tensors_ourselves(header)


# The types MLX's GGUF reader accepts (it refuses the whole file for any other).
MLX_NATIVE_TYPES = {"F32", "F16", "Q4_0", "Q4_1", "Q8_0"}


def read_tensors_ourselves(header: GGUFHeader) -> dict[str, mx.array]:
    """For files MLX's reader refuses (any K-quant in them). llama.cpp's 32-element block
    types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are repacked exactly into MLX affine quantization
    (repack_legacy_blocks); every other quantized type (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ*...)
    is dequantized by the gguf package, then cast to DTYPE. Not re-quantized with mx.quantize:
    even at 8 bits its logits drift from the file's by percents (mx.quantize picks its own
    scales, which do not line up with the file's codes)."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    plain_float = {Q.F32: np.float32, Q.F16: np.float16}
    blob = np.memmap(header.path, mode="r", dtype=np.uint8)
    weights = {}
    for tensor in header.tensors.values():
        qtype = tensor.qtype
        raw = blob[tensor.offset : tensor.offset + tensor.n_bytes]
        module = tensor.name.removesuffix(".weight")
        if qtype.name in LEGACY_BLOCKS and tensor.name.endswith(".weight") and len(tensor.shape) == 2:
            packed, scales, biases = repack_legacy_blocks(raw, qtype.name, tensor.shape)
            weights.update({f"{module}.weight": packed, f"{module}.scales": scales, f"{module}.biases": biases})
            continue
        try:
            if qtype in plain_float:
                values = raw.view(plain_float[qtype]).reshape(tensor.shape)
            else:
                values = dequantize(raw.reshape(*tensor.shape[:-1], -1), qtype)
        except NotImplementedError as e:
            raise EngineError(
                f"{header.path.name}: tensor {tensor.name} uses quantization {qtype.name}, which cannot be dequantized"
            ) from e
        weights[tensor.name] = mx.array(values.astype(np.float32, copy=False))
    return weights


# llama.cpp's 32-element blocks: per block a float16 scale d (and min m for the _1 types),
# then 32 codes. value = d * code + m (_1) or d * (code - offset) (_0). name -> (code bits,
# offset of the _0 types or None, MLX bits to pack into).
LEGACY_BLOCKS = {"Q4_0": (4, 8, 4), "Q4_1": (4, None, 4), "Q5_0": (5, 16, 8), "Q5_1": (5, None, 8), "Q8_0": (8, 128, 8)}


def repack_legacy_blocks(raw: np.ndarray, type_name: str, shape: tuple[int, int]):
    """Exact repacking of a llama.cpp 32-block tensor as MLX affine quantization (group 32):
    packed uint32 codes, scales = d, biases = m or -offset * d. Same values, same file-like
    size; Q5_x codes go into 8 bits (MLX's 5-bit packing is not byte-aligned)."""
    code_bits, offset, mlx_bits = LEGACY_BLOCKS[type_name]
    rows, cols = shape
    has_min = offset is None
    header = 4 if has_min else 2  # d (and m), float16 each
    high_bits = 4 if code_bits == 5 else 0  # Q5: a uint32 with each code's 5th bit
    blocks = raw.reshape(rows, cols // 32, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if code_bits == 8:
        codes = blocks[..., 2:].view(np.int8).astype(np.int16) + 128  # int8 -> 0..255
    else:
        low = blocks[..., header + high_bits :]  # 16 bytes: codes j (low nibble), j+16 (high)
        codes = np.concatenate([low & 0x0F, low >> 4], axis=-1).astype(np.int16)
        if high_bits:
            qh = blocks[..., header : header + 4].copy().view(np.uint32)  # (rows, n, 1)
            codes |= (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int16)
    if has_min:
        bias = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    else:
        bias = -float(offset) * d
    codes = codes.astype(np.uint8).reshape(rows, cols)
    if mlx_bits == 4:  # two codes a byte, element 2i in the low nibble (MLX packs low bits first)
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
    packed = np.ascontiguousarray(codes).view(np.uint32)  # little-endian: element 0 lowest
    return mx.array(packed), mx.array(d).astype(DTYPE), mx.array(bias).astype(DTYPE)


def to_mlx_lm_weights(weights: dict[str, mx.array], arch: Architecture, config: dict) -> dict[str, mx.array]:
    """Rename to HF/mlx-lm names and undo llama.cpp's tensor transformations."""
    block_names = {**BLOCK_NAMES, **arch.block_names}
    out = {}
    for name, w in weights.items():
        module, param = name.rsplit(".", 1)  # param: weight | bias | scales | biases
        parts = module.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in block_names:
            layer, kind = int(parts[1]), parts[2]
            hf_module = f"model.layers.{layer}.{block_names[kind]}"
        elif module in TOP_NAMES:
            kind = module
            hf_module = TOP_NAMES[module]
        else:
            raise EngineError(f"unexpected tensor {name!r} in GGUF file (cannot map it to {arch.model_type})")

        if arch.permute_qk and kind == "attn_q":
            w = unpermute_rows(w, config["num_attention_heads"])
        elif arch.permute_qk and kind == "attn_k":
            w = unpermute_rows(w, config["num_key_value_heads"])
        if arch.norm_plus_one and kind.endswith("norm") and param == "weight":
            w = w.astype(mx.float32) - 1.0
        if mx.issubdtype(w.dtype, mx.floating):
            w = w.astype(DTYPE)
        out[f"{hf_module}.{param}"] = w
    return out


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's q/k permutation (convert_hf_to_gguf.py `permute`).

    llama.cpp rotates adjacent pairs (x0, x1), HF's llama rotates halves (x0, x_{d/2}), so the
    converter reordered each head's rows from [first half; second half] to interleaved pairs.
    Rows only: a quantized row (packed weight, scales, biases) moves as a whole."""
    rows = w.shape[0]
    head_dim = rows // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(rows, *w.shape[1:])


def build_model(config: dict, weights: dict[str, mx.array], file_name: str) -> nn.Module:
    from mlx_lm.utils import _get_classes, infer_quant_config

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = model.sanitize(weights) if hasattr(model, "sanitize") else weights

    def packed_in_file(layer_path: str, module: nn.Module):
        if not hasattr(module, "to_quantized") or f"{layer_path}.scales" not in weights:
            return False
        return infer_quant_config(layer_path, module, weights)

    nn.quantize(model, group_size=GROUP_SIZE, bits=4, class_predicate=packed_in_file)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise EngineError(f"{file_name}: tensors do not fit the {config['model_type']} model: {e}") from e
    mx.eval(model.parameters())
    model.eval()
    return model


# ---------------------------------------------------------------- tokenizer


def default_tokenizer_cache() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("specscope")) / "gguf-tokenizers"


def load_gguf_tokenizer(header: GGUFHeader, cache_root: str | Path | None = None):
    """The file's tokenizer, converted once per file (it takes seconds) into a cache dir, then
    loaded by mlx_lm's own tokenizer loader (which picks the streaming detokenizer)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer_dir

    cache_dir = Path(cache_root or default_tokenizer_cache()) / header_digest(header)
    if (cache_dir / "tokenizer.json").exists():
        wrapper = load_tokenizer_dir(cache_dir)
    else:
        tokenizer = convert_tokenizer(header)
        try:
            save_atomically(tokenizer, cache_dir)
            wrapper = load_tokenizer_dir(cache_dir)
        except OSError:  # a cache folder that cannot be written: converted again on every load
            with tempfile.TemporaryDirectory(prefix="specscope-tokenizer-") as scratch:
                tokenizer.save_pretrained(scratch)
                wrapper = load_tokenizer_dir(Path(scratch))
    for token_id in end_token_ids(header, wrapper):
        wrapper.add_eos_token(token_id)
    return wrapper


def header_digest(header: GGUFHeader) -> str:
    """Cache key: the GGUF header holds all tokenizer data and every tensor's layout."""
    with open(header.path, "rb") as f:
        return hashlib.sha256(f.read(header.data_offset)).hexdigest()[:24]


def convert_tokenizer(header: GGUFHeader):
    """A transformers fast tokenizer from llama.cpp's tokenizer metadata.

    What `AutoTokenizer.from_pretrained(dir, gguf_file=...)` does, minus its file reader, which
    needs torch (the app does not ship torch); tests check both give the same ids."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    metadata = header.metadata
    if "tokenizer.ggml.tokens" not in metadata:
        raise EngineError(f"{header.path.name} has no tokenizer in its metadata")
    grouped = {
        group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer_dict, tokenizer_config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer_dict.get("tokenizer_type") == "llama":
        tokenizer_config.setdefault("add_bos_token", True)  # llama.cpp's default for SentencePiece
    tokens = tokenizer_dict["tokens"]
    for name in ("bos", "eos", "unk", "pad"):
        key = {"unk": "unknown", "pad": "padding"}.get(name, name)
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        tokenizer_config[f"{name}_token"] = tokens[token_id] if token_id is not None else None
    try:
        backend, extra = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
        return PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config, **extra)
    except Exception as e:
        raise EngineError(f"{header.path.name}: cannot build its tokenizer: {e}") from e


def save_atomically(tokenizer, cache_dir: Path) -> None:
    """Write beside, then rename: a half-written cache entry is never seen."""
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir.with_name(f"{cache_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(str(tmp))
    try:
        os.replace(tmp, cache_dir)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)


# Turn-ending tokens of the chat templates llama.cpp knows; an instruct model stops on them.
END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>")


def end_token_ids(header: GGUFHeader, tokenizer) -> list[int]:
    """EOS and end-of-turn ids from the metadata, plus the turn-end tokens the chat template
    writes (files often name only one of them)."""
    metadata = header.metadata
    ids = {metadata[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in metadata}
    template = metadata.get("tokenizer.chat_template") or ""
    vocab = tokenizer.get_vocab()
    ids.update(vocab[token] for token in END_OF_TURN_TOKENS if token in template and token in vocab)
    return sorted(int(i) for i in ids)
