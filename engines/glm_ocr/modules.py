"""Channels-first PyTorch modules of GLM-OCR: what gets converted to Core ML, and what the
PyTorch reference runtime executes.

Layout: activations are (batch=1, channels, 1, sequence), the layout the Neural Engine
prefers; every Linear becomes a 1x1 Conv2d. Each module is built from the corresponding
transformers module (`from_hf`) so weights come through transformers' own loader. The modules
converted, each with its shapes: VisionEncoder, TextDecoder, LMHead, MtpLayer.

Positions: the caller gives cache_position (where this chunk's keys go; the causal mask is
derived from it) and cos/sin tables (see positions.py). Padding rows of a chunk write keys
past the real tokens; the causal mask hides them and the next chunk overwrites them.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

MASK_VALUE = -1e4  # additive mask; finite so float16 graphs cannot produce inf - inf
LM_HEAD_CHUNK = 16384  # the Neural Engine's largest conv output-channel count


def conv_from_linear(linear: nn.Linear) -> nn.Conv2d:
    conv = nn.Conv2d(linear.in_features, linear.out_features, 1, bias=linear.bias is not None)
    with torch.no_grad():
        conv.weight.copy_(linear.weight[:, :, None, None])
        if linear.bias is not None:
            conv.bias.copy_(linear.bias)
    return conv


class RMSNormCF(nn.Module):
    """RMSNorm over the channel axis of (1, C, 1, S), computed in float32 as transformers does."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone().float())
        self.eps = eps

    @classmethod
    def from_hf(cls, norm) -> "RMSNormCF":
        return cls(norm.weight, norm.variance_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps)
        return x * self.weight.view(1, -1, 1, 1)


def rms_norm_last(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Split-half RoPE on the leading cos.shape[-1] dims of x (..., S, D); the rest pass."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


def split_half_permutation(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Per-head order of q/k output rows that turns GLM's interleaved rotary pairs (2j, 2j+1)
    into split halves (j, R/2 + j). q.k is unchanged when both are permuted alike."""
    return torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2),
                      torch.arange(rotary_dim, head_dim)])


def causal_mask(cache_position: torch.Tensor, seq_len: int, cache_length: int) -> torch.Tensor:
    """(S, T) additive mask: query i (at slot cache_position + i) sees slots <= its own."""
    query_slot = cache_position.to(torch.int32) + torch.arange(seq_len, dtype=torch.int32)
    key_slot = torch.arange(cache_length, dtype=torch.int32)
    return torch.where(key_slot[None, :] <= query_slot[:, None], 0.0, MASK_VALUE)


# ----------------------------------------------------------------------------- text decoder


class TextAttentionCF(nn.Module):
    def __init__(self, attn, rotary_dim: int):
        super().__init__()
        self.num_heads = attn.config.num_attention_heads
        self.num_kv_heads = attn.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        perm = split_half_permutation(self.head_dim, rotary_dim)
        self.q_proj = conv_from_linear(_permute_heads(attn.q_proj, perm, self.num_heads))
        self.k_proj = conv_from_linear(_permute_heads(attn.k_proj, perm, self.num_kv_heads))
        self.v_proj = conv_from_linear(attn.v_proj)
        self.o_proj = conv_from_linear(attn.o_proj)

    def forward(self, x, cos, sin, mask, key_cache, value_cache, layer: int, cache_position):
        """x (1, C, 1, S); key_cache/value_cache (L, KV, T, D) state buffers, written in place."""
        s = x.shape[-1]
        q = self.q_proj(x).view(1, self.num_heads, self.head_dim, s).transpose(2, 3)
        k = self.k_proj(x).view(1, self.num_kv_heads, self.head_dim, s).transpose(2, 3)
        v = self.v_proj(x).view(1, self.num_kv_heads, self.head_dim, s).transpose(2, 3)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        start = cache_position[0]
        key_cache[layer : layer + 1, :, start : start + s, :] = k.to(key_cache.dtype)
        value_cache[layer : layer + 1, :, start : start + s, :] = v.to(value_cache.dtype)
        keys = key_cache[layer : layer + 1].to(q.dtype)  # (1, KV, T, D)
        values = value_cache[layer : layer + 1].to(q.dtype)

        groups = self.num_heads // self.num_kv_heads
        q = q.reshape(1, self.num_kv_heads, groups * s, self.head_dim)  # heads of a group share K/V
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.scaling
        scores = scores.view(1, self.num_kv_heads, groups, s, -1) + mask
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(1, self.num_kv_heads, groups * s, -1)
        out = torch.matmul(probs, values).view(1, self.num_heads, s, self.head_dim)
        out = out.transpose(2, 3).reshape(1, self.num_heads * self.head_dim, 1, s)
        return self.o_proj(out)


def _permute_heads(linear: nn.Linear, perm: torch.Tensor, num_heads: int) -> nn.Linear:
    out = nn.Linear(linear.in_features, linear.out_features, bias=False)
    head_dim = linear.out_features // num_heads
    w = linear.weight.detach().view(num_heads, head_dim, -1)[:, perm, :]
    with torch.no_grad():
        out.weight.copy_(w.reshape(linear.out_features, -1))
    return out


class TextMLPCF(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.gate_up_proj = conv_from_linear(mlp.gate_up_proj)
        self.down_proj = conv_from_linear(mlp.down_proj)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=1)
        return self.down_proj(up * F.silu(gate))


class DecoderLayerCF(nn.Module):
    """GLM's 4-norm sandwich: norm -> attn -> norm -> +residual; norm -> mlp -> norm -> +residual."""

    def __init__(self, layer, rotary_dim: int):
        super().__init__()
        self.input_layernorm = RMSNormCF.from_hf(layer.input_layernorm)
        self.self_attn = TextAttentionCF(layer.self_attn, rotary_dim)
        self.post_self_attn_layernorm = RMSNormCF.from_hf(layer.post_self_attn_layernorm)
        self.post_attention_layernorm = RMSNormCF.from_hf(layer.post_attention_layernorm)
        self.mlp = TextMLPCF(layer.mlp)
        self.post_mlp_layernorm = RMSNormCF.from_hf(layer.post_mlp_layernorm)

    def forward(self, x, cos, sin, mask, key_cache, value_cache, layer: int, cache_position):
        h = self.self_attn(self.input_layernorm(x), cos, sin, mask, key_cache, value_cache, layer, cache_position)
        x = x + self.post_self_attn_layernorm(h)
        h = self.mlp(self.post_attention_layernorm(x))
        return x + self.post_mlp_layernorm(h)


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor):
    return cos[None, None].float(), sin[None, None].float()  # (S, R) -> (1, 1, S, R)


class TextDecoder(nn.Module):
    """The main model's decoder layers + final norm over one chunk of seq_len embeddings; its
    KV cache in buffers (Core ML state once converted).

    forward(inputs_embeds (1, C, 1, S), position_cos (S, R), position_sin (S, R),
            cache_position (1,) int32) -> hidden (1, C, 1, S), after the final norm: the
    LM head's input, and also what the MTP layer consumes (as in vLLM/SGLang, whose target
    models hand their final-normed hidden states to the drafter)."""

    def __init__(self, text_model, rotary_dim: int, cache_length: int):
        super().__init__()
        cfg = text_model.config
        self.layers = nn.ModuleList(DecoderLayerCF(layer, rotary_dim) for layer in text_model.layers)
        self.norm = RMSNormCF.from_hf(text_model.norm)
        self.cache_length = cache_length
        shape = (len(self.layers), cfg.num_key_value_heads, cache_length, self.layers[0].self_attn.head_dim)
        self.register_buffer("key_cache", torch.zeros(shape))
        self.register_buffer("value_cache", torch.zeros(shape))

    def forward(self, inputs_embeds, position_cos, position_sin, cache_position):
        cos, sin = _rope_tables(position_cos, position_sin)
        mask = causal_mask(cache_position, inputs_embeds.shape[-1], self.cache_length)
        x = inputs_embeds.float()
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, self.key_cache, self.value_cache, i, cache_position)
        return self.norm(x)

    def reset(self) -> None:
        self.key_cache.zero_()
        self.value_cache.zero_()


class LMHead(nn.Module):
    """hidden (1, C, 1, S) -> logits (1, V, 1, S), computed in vocabulary chunks."""

    def __init__(self, lm_head: nn.Linear, chunk: int = LM_HEAD_CHUNK):
        super().__init__()
        weight = lm_head.weight.detach()
        self.chunks = nn.ModuleList()
        for start in range(0, weight.shape[0], chunk):
            part = weight[start : start + chunk]
            conv = nn.Conv2d(part.shape[1], part.shape[0], 1, bias=False)
            with torch.no_grad():
                conv.weight.copy_(part[:, :, None, None])
            self.chunks.append(conv)

    def forward(self, hidden):
        return torch.cat([conv(hidden) for conv in self.chunks], dim=1)


class MtpLayer(nn.Module):
    """GLM-OCR's MTP layer (stored as decoder layer num_hidden_layers), with a KV cache of its own.

    forward(previous_hidden (1, C, 1, S), input_embeds (1, C, 1, S), position_cos (S, R),
            position_sin (S, R), cache_position (1,) int32) -> (mtp_hidden, mtp_hidden_for_head)

    previous_hidden is the main model's final-normed hidden at slot i (or the previous MTP
    step's raw output when chaining) and input_embeds the embedding of token i+1; the output
    predicts token i+2. Embeddings at slot 0 are zeroed (position-0 masking, as vLLM does)."""

    def __init__(self, parts: dict, rotary_dim: int, cache_length: int):
        super().__init__()
        layer = parts["layer"]
        self.enorm = RMSNormCF.from_hf(parts["enorm"])
        self.hnorm = RMSNormCF.from_hf(parts["hnorm"])
        self.eh_proj = conv_from_linear(parts["eh_proj"])
        self.layer = DecoderLayerCF(layer, rotary_dim)
        self.shared_head_norm = RMSNormCF.from_hf(parts["shared_head_norm"])
        self.cache_length = cache_length
        attn = self.layer.self_attn
        shape = (1, attn.num_kv_heads, cache_length, attn.head_dim)
        self.register_buffer("key_cache", torch.zeros(shape))
        self.register_buffer("value_cache", torch.zeros(shape))

    def forward(self, previous_hidden, input_embeds, position_cos, position_sin, cache_position):
        s = input_embeds.shape[-1]
        slot = cache_position.to(torch.int32) + torch.arange(s, dtype=torch.int32)
        input_embeds = input_embeds.float() * (slot != 0).float().view(1, 1, 1, s)
        x = torch.cat([self.enorm(input_embeds), self.hnorm(previous_hidden)], dim=1)
        x = self.eh_proj(x)
        cos, sin = _rope_tables(position_cos, position_sin)
        mask = causal_mask(cache_position, s, self.cache_length)
        hidden = self.layer(x, cos, sin, mask, self.key_cache, self.value_cache, 0, cache_position)
        return hidden, self.shared_head_norm(hidden)

    def reset(self) -> None:
        self.key_cache.zero_()
        self.value_cache.zero_()


# ----------------------------------------------------------------------------- vision encoder


class VisionAttentionCF(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.num_heads = attn.num_heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.qkv = conv_from_linear(attn.qkv)
        self.proj = conv_from_linear(attn.proj)
        self.q_norm_weight = nn.Parameter(attn.q_norm.weight.detach().clone().float())
        self.k_norm_weight = nn.Parameter(attn.k_norm.weight.detach().clone().float())
        self.eps = attn.q_norm.variance_epsilon

    def forward(self, x, cos, sin, attention_bias):
        n = x.shape[-1]
        qkv = self.qkv(x).view(3, self.num_heads, self.head_dim, n).transpose(2, 3)  # (3, H, N, D)
        q = rms_norm_last(qkv[0], self.q_norm_weight, self.eps)
        k = rms_norm_last(qkv[1], self.k_norm_weight, self.eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        scores = torch.matmul(q, k.transpose(1, 2)) * self.scaling
        if attention_bias is not None:
            scores = scores + attention_bias
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(probs, qkv[2]).transpose(1, 2).reshape(1, self.num_heads * self.head_dim, 1, n)
        return self.proj(out)


class VisionBlockCF(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.norm1 = RMSNormCF.from_hf(block.norm1)
        self.norm2 = RMSNormCF.from_hf(block.norm2)
        self.attn = VisionAttentionCF(block.attn)
        self.gate_proj = conv_from_linear(block.mlp.gate_proj)
        self.up_proj = conv_from_linear(block.mlp.up_proj)
        self.down_proj = conv_from_linear(block.mlp.down_proj)

    def forward(self, x, cos, sin, attention_bias):
        x = x + self.attn(self.norm1(x), cos, sin, attention_bias)
        h = self.norm2(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class LayerNormCF(nn.Module):
    def __init__(self, norm: nn.LayerNorm):
        super().__init__()
        self.weight = nn.Parameter(norm.weight.detach().clone())
        self.bias = nn.Parameter(norm.bias.detach().clone())
        self.eps = norm.eps

    def forward(self, x):
        mean = x.mean(1, keepdim=True)
        var = (x - mean).pow(2).mean(1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


class VisionEncoder(nn.Module):
    """forward(pixel_patches (N, 3*T, P, P), position_cos (N, D), position_sin (N, D),
               attention_bias (1, N, N) additive or None) -> image embeddings (1, C_text, 1, N/m^2)

    N counts patches in the processor's order (consecutive m*m patches form one merge window).
    attention_bias lets a fixed-size graph pad N and hide the padding; None = all visible. The
    Conv3d patch embedding is folded to a Conv2d: the processor duplicates the single frame
    over T=2, so the temporal axis becomes input channels."""

    def __init__(self, visual):
        super().__init__()
        cfg = visual.config
        self.merge = cfg.spatial_merge_size
        pe = visual.patch_embed.proj  # Conv3d(3, hidden, (T, P, P))
        self.patch_embed = nn.Conv2d(cfg.in_channels * cfg.temporal_patch_size, cfg.hidden_size,
                                     cfg.patch_size, stride=cfg.patch_size, bias=pe.bias is not None)
        with torch.no_grad():
            self.patch_embed.weight.copy_(pe.weight.reshape(cfg.hidden_size, -1, cfg.patch_size, cfg.patch_size))
            if pe.bias is not None:
                self.patch_embed.bias.copy_(pe.bias)
        self.blocks = nn.ModuleList(VisionBlockCF(b) for b in visual.blocks)
        self.post_layernorm = RMSNormCF.from_hf(visual.post_layernorm)
        self.downsample = visual.downsample  # Conv2d(hidden, out, m, stride m) over one merge window
        mg = visual.merger
        self.merger_proj = conv_from_linear(mg.proj)
        self.merger_norm = LayerNormCF(mg.post_projection_norm)
        self.merger_gate = conv_from_linear(mg.gate_proj)
        self.merger_up = conv_from_linear(mg.up_proj)
        self.merger_down = conv_from_linear(mg.down_proj)

    def forward(self, pixel_patches, position_cos, position_sin, attention_bias=None):
        n = pixel_patches.shape[0]
        x = self.patch_embed(pixel_patches.float())  # (N, hidden, 1, 1)
        x = x.view(n, -1).transpose(0, 1).reshape(1, -1, 1, n)
        cos, sin = position_cos[None].float(), position_sin[None].float()  # (1, N, D)
        for block in self.blocks:
            x = block(x, cos, sin, attention_bias)
        x = self.post_layernorm(x)
        c, m = x.shape[1], self.merge
        windows = x.view(c, n // (m * m), m, m).permute(1, 0, 2, 3)  # (N/m^2, C, m, m)
        x = self.downsample(windows)  # (N/m^2, out, 1, 1)
        x = x.view(n // (m * m), -1).transpose(0, 1).reshape(1, -1, 1, n // (m * m))
        x = F.gelu(self.merger_norm(self.merger_proj(x)))
        return self.merger_down(F.silu(self.merger_gate(x)) * self.merger_up(x))
