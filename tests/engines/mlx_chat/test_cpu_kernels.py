"""The CPU attention and SwiGLU (engines/cpu/kernels.py) against mx.fast's and
mlx-lm's own, on every mask the models and the batch hand them; and a loaded model runs them."""

import mlx.core as mx
import pytest
from mlx_lm.models import activations, base, llama

from engines.cpu import kernels as cpu_kernels

B, H, KV, L, S, D = 3, 6, 2, 5, 17, 8


def qkv(heads=H, kv_heads=KV, width=L, seed=0):
    k = mx.random.split(mx.random.key(seed), 3)
    return (mx.random.normal((B, heads, width, D), key=k[0]), mx.random.normal((B, kv_heads, S, D), key=k[1]),
            mx.random.normal((B, kv_heads, S, D), key=k[2]))


def ragged_mask(heads=1, width=L):
    """Each row its own live slots and its own causal edge, like engines/batch/cache.py's."""
    keys = mx.arange(S)[None, None, :]
    last = mx.array([S - 1, S - 4, S - 9])[:, None, None] - (width - 1) + mx.arange(width)[None, :, None]
    dead = mx.array([[0] * S, [1 if i in (2, 3) else 0 for i in range(S)], [1 if i < 3 else 0 for i in range(S)]])  # every query reads a key
    ok = (keys <= last) & (dead[:, None, :] == 0)
    return mx.broadcast_to(ok[:, None], (B, heads, width, S))


MASKS = {
    "none, one token": (None, 1),
    "causal": ("causal", L),
    "ragged bool [B,1,L,S]": (ragged_mask(), L),
    "ragged bool per head [B,H,L,S]": (ragged_mask(H), L),
    "additive [L,S]": (mx.where(mx.arange(S)[None] <= mx.arange(S - L, S)[:, None], 0.0, -1e9), L),
    "bool per head [H,L,S]": (ragged_mask(H)[0], L),
}


@pytest.mark.parametrize("name", MASKS)
@pytest.mark.parametrize("kv_heads", [KV, H])
def test_attention_equals_mx_fast(name, kv_heads):
    mask, width = MASKS[name]
    q, k, v = qkv(kv_heads=kv_heads, width=width)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5, mask=mask)
    got = cpu_kernels.attention(q, k, v, D ** -0.5, mask)
    assert got.shape == want.shape
    assert mx.abs(got - want).max().item() < 1e-5


def test_attention_is_checked_against_something_that_can_differ():
    """The comparison above catches a head read from the wrong kv head (h % kv instead of h // group)."""
    q, k, v = qkv()
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5, mask=None)
    wrong_k = mx.concatenate([k[:, 1:], k[:, :1]], axis=1)
    wrong_v = mx.concatenate([v[:, 1:], v[:, :1]], axis=1)
    assert mx.abs(cpu_kernels.attention(q, wrong_k, wrong_v, D ** -0.5, None) - want).max().item() > 1e-2


def test_masks_made_additive_once_are_each_their_own():
    """A mask is made additive once and reused while it is handed in again (the layers of one
    forward); masks of the same shape that differ -- the two kinds of layer, the next forward --
    each give their own attention, as mx.fast's, in any order."""
    q, k, v = qkv()
    first, second = ragged_mask(), ragged_mask()[::-1]
    for mask in (first, second, first, first, second, mx.array(first)):
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5, mask=mask)
        assert mx.abs(cpu_kernels.attention(q, k, v, D ** -0.5, mask) - want).max().item() < 1e-5


def test_swiglu_equals_mlx_lm():
    gate, x = mx.random.normal((4, 6, 64)) * 8, mx.random.normal((4, 6, 64))
    want = activations.swiglu(gate, x)
    assert mx.abs(cpu_kernels.swiglu(gate, x) - want).max().item() < 1e-5 * (1 + mx.abs(want).max().item())


def test_a_loaded_model_runs_them_and_its_logits_stay_close(llama_dir):
    from engines.mlx_chat.loading import load_model

    model = load_model(llama_dir).model  # installs, on the CPU
    assert llama.scaled_dot_product_attention is cpu_kernels.scaled_dot_product_attention
    assert llama.swiglu is cpu_kernels.swiglu
    tokens = mx.array([[1, 5, 9, 2, 7, 7, 3, 11]])
    ours = model(tokens)
    try:
        llama.scaled_dot_product_attention, llama.swiglu = base.scaled_dot_product_attention, activations.swiglu
        theirs = model(tokens)
    finally:
        cpu_kernels.install()
    assert mx.abs(ours - theirs).max().item() < 1e-4
    assert (ours.argmax(-1) == theirs.argmax(-1)).all().item()
