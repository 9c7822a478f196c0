"""Our MLX assistant drafter against transformers' Gemma4AssistantForCausalLM on the same
weights and the same target state: logits and the next h_prev, over chained steps, for the
dense head and the centroid head. Also: the target itself (mlx-lm vs transformers) and the
K/V the drafter reads (vs transformers' shared_kv_states where the target returns them)."""

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core")

from engines.mlx_chat.gemma4_assistant import CENTROID_MASK_VALUE, load_assistant  # noqa: E402
from engines.mlx_chat.mtp import Gemma4Target  # noqa: E402
from tests.engines.mlx_chat.gemma4.checkpoints import SLIDING_WINDOW, load_assistant_hf  # noqa: E402
from tests.engines.mlx_chat.gemma4.reference import drafter_kv  # noqa: E402

ATOL = 5e-4  # fp32 across two BLAS libraries (MLX on OpenBLAS, torch on its MKL): observed up to 1.5e-4
# after the chained steps (~5e-6 while the preloaded OpenBLAS also served torch)


def load_targets(path):
    from mlx_lm.utils import load_model
    from transformers import Gemma4ForCausalLM

    mlx_model, _ = load_model(path)
    return mlx_model, Gemma4ForCausalLM.from_pretrained(str(path)).eval()


def test_target_logits_mlx_lm_match_transformers(pair):
    """Before anything else: mlx-lm reads our saved Gemma 4 target as transformers does,
    in one pass and token by token through its rotating sliding-window caches."""
    mlx_model, hf = load_targets(pair.target)
    ids = np.random.RandomState(0).randint(6, 512, size=(1, 3 * SLIDING_WINDOW))
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits[0].numpy()
    full = np.array(mlx_model(mx.array(ids)))[0]
    cache = mlx_model.make_cache()
    steps = [np.array(mlx_model(mx.array(ids[:, :4]), cache=cache))[0]]
    steps += [np.array(mlx_model(mx.array(ids[:, i : i + 1]), cache=cache))[0] for i in range(4, ids.shape[1])]
    np.testing.assert_allclose(full, ref, atol=ATOL)
    np.testing.assert_allclose(np.concatenate(steps), ref, atol=ATOL)


@pytest.mark.parametrize("context", [5, 3 * SLIDING_WINDOW])  # inside and past the sliding window
def test_view_with_masks_and_compiled_step_match_the_exact_kv(edge_pair, context):
    """What the round loop runs -- the compiled drafter step on whole K/V buffers with masks
    (BatchMTP.view), from the batch's slot-table cache after a verify kept only some of its
    inputs -- equals the eager step on exactly the K/V plain decoding holds (drafter_kv), for
    every accepted count. Evaluated only after the cache has been written again: a chain keeps
    the arrays it read, which is why the loop may write the cache while a chain runs."""
    from engines.batch.cache import BatchCache
    from engines.batch.mtp import BatchMTP

    mlx_target, _ = load_targets(edge_pair.target)
    target = Gemma4Target.of(mlx_target)
    drafter = load_assistant(edge_pair.assistant)
    group = BatchMTP(drafter, target, drafter.compiled_step())
    k = 3
    ids = np.random.RandomState(context).randint(6, 512, size=(1, context + k + 8))
    h = mx.array(np.random.RandomState(1).standard_normal(target.hidden_size).astype(np.float32))

    def forward(cache, tokens, kept):
        cache.begin(tokens.shape[1])
        target.forward(mx.array(tokens), cache.layers)
        cache.settle([kept])

    lazy = []
    for accepted in range(k):  # the state after a verify of k inputs kept `accepted` of them
        cache = BatchCache(mlx_target, 1)
        forward(cache, ids[:, :context], context)  # the prompt
        forward(cache, ids[:, context : context + k], accepted)  # the rest of its slots die
        position = context + accepted
        kv, masks = group.view(cache, [0], mx.array([position]), mx.array([0]))
        emb = target.embed(mx.array([int(ids[0, position])]))
        lazy.append(group.step(emb, h[None], mx.array([position]), kv, masks))
        forward(cache, ids[:, position : position + 8], 8)  # the cache moves on

    for accepted, ours in enumerate(lazy):
        position = context + accepted
        fresh = mlx_target.make_cache()
        target.forward(mx.array(ids[:, :position]), fresh)
        emb = target.embed(mx.array([int(ids[0, position])]))[0]
        want = drafter.step(emb, h, position, drafter_kv(target, fresh))
        np.testing.assert_allclose(np.array(ours.logits[0]), np.array(want.logits), atol=ATOL, rtol=1e-4)
        np.testing.assert_allclose(np.array(ours.h_next[0]), np.array(want.h_next), atol=ATOL, rtol=1e-4)
