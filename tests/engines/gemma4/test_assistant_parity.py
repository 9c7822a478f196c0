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
from tests.engines.gemma4.checkpoints import SLIDING_WINDOW, load_assistant_hf  # noqa: E402
from tests.engines.gemma4.reference import drafter_kv  # noqa: E402

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
def test_drafter_matches_transformers_assistant(pair, context):
    mlx_target, hf_target = load_targets(pair.target)
    target = Gemma4Target.of(mlx_target)
    ours = load_assistant(pair.assistant)
    theirs = load_assistant_hf(pair.assistant)
    assert ours.centroid == (pair.name == "edge")

    ids = np.random.RandomState(context).randint(6, 512, size=(1, context + 1))
    prefix, last = ids[:, :context], ids[:, context:]

    # The target state: transformers' final-norm hidden state at the last prefix position, and
    # the K/V our drafter reads from the mlx-lm cache, handed to transformers unchanged.
    with torch.no_grad():
        out = hf_target(torch.tensor(prefix), return_shared_kv_states=True, output_hidden_states=True)
    cache = mlx_target.make_cache()
    _, hidden = target.forward(mx.array(prefix), cache)
    np.testing.assert_allclose(np.array(hidden[0, -1]), out.hidden_states[-1][0, -1].numpy(), atol=ATOL)
    kv = drafter_kv(target, cache)
    assert kv["sliding_attention"][0].shape[2] == min(context, SLIDING_WINDOW)
    assert kv["full_attention"][0].shape[2] == context
    if out.shared_kv_states:  # KV-sharing targets (E2B-like) return what their producers stored
        for kind, (k, v) in out.shared_kv_states.items():
            n = kv[kind][0].shape[2]
            np.testing.assert_allclose(np.array(kv[kind][0]), k[:, :, -n:].numpy(), atol=ATOL)
            np.testing.assert_allclose(np.array(kv[kind][1]), v[:, :, -n:].numpy(), atol=ATOL)
    kv_torch = {kind: (torch.tensor(np.array(k)), torch.tensor(np.array(v))) for kind, (k, v) in kv.items()}

    tok_t, h_t = torch.tensor(last), out.hidden_states[-1][:, -1:]
    tok_m, h_m = mx.array(last[0]), hidden[0, -1]
    for _ in range(4):  # chained steps, the position held at `context`
        with torch.no_grad():
            embeds = torch.cat([hf_target.get_input_embeddings()(tok_t), h_t], dim=-1)
            ref = theirs(inputs_embeds=embeds, position_ids=torch.tensor([[context]]), shared_kv_states=kv_torch)
        step = ours.step(target.embed(tok_m)[0], h_m, context, kv)
        ref_logits, logits = ref.logits[0, 0].numpy(), np.array(step.logits)

        np.testing.assert_allclose(np.array(step.h_next), ref.last_hidden_state[0, 0].numpy(), atol=ATOL)
        if ours.centroid:
            # transformers fills non-candidates with (min candidate logit - 1); we use a very low
            # value so softmax gives them no mass. Same candidates, same candidate logits.
            fill = ref_logits.min()
            candidates = ref_logits > fill
            assert candidates.sum() == 4 * 512 // 16  # top_k centroids x tokens per centroid
            np.testing.assert_array_equal(logits > CENTROID_MASK_VALUE / 2, candidates)
            np.testing.assert_allclose(logits[candidates], ref_logits[candidates], atol=ATOL)
            assert fill == pytest.approx(ref_logits[candidates].min() - 1.0)
            assert np.all(logits[~candidates] == np.float32(CENTROID_MASK_VALUE))
        else:
            np.testing.assert_allclose(logits, ref_logits, atol=ATOL)
        assert int(logits.argmax()) == int(ref_logits.argmax())

        tok_t, h_t = ref.logits.argmax(-1), ref.last_hidden_state
        tok_m, h_m = mx.array([int(logits.argmax())]), step.h_next


def test_token_ordering_is_int32_and_loader_rejects_other_models(edge_pair):
    drafter = load_assistant(edge_pair.assistant)
    assert drafter.masked_embedding.token_ordering.dtype == mx.int32
    from engines.mlx_chat.gemma4_assistant import get_classes

    with pytest.raises(ValueError, match="gemma4_assistant"):
        get_classes({"model_type": "gemma4_text"})


def test_quantized_mlx_conversion_loads_and_drafts_alike(edge_pair, tmp_path):
    """An MLX 8-bit conversion of the centroid assistant loads through the same loader and
    drafts what the float drafter drafts (to quantization error)."""
    import mlx.nn as nn

    from tests.engines.gemma4.checkpoints import build_mlx_assistant

    path = build_mlx_assistant(tmp_path / "assistant-8bit", edge_pair.assistant, bits=8)
    quant = load_assistant(path)
    full = load_assistant(edge_pair.assistant)
    assert isinstance(quant.pre_projection, nn.QuantizedLinear)
    assert isinstance(quant.model.embed_tokens, nn.QuantizedEmbedding)
    assert quant.masked_embedding.token_ordering.dtype == mx.int32
    np.testing.assert_array_equal(np.array(quant.masked_embedding.token_ordering),
                                  np.array(full.masked_embedding.token_ordering))

    mlx_target, _ = load_targets(edge_pair.target)
    target = Gemma4Target.of(mlx_target)
    ids = np.random.RandomState(3).randint(6, 512, size=(1, 20))
    cache = mlx_target.make_cache()
    _, hidden = target.forward(mx.array(ids), cache)
    kv = drafter_kv(target, cache)
    emb = target.embed(mx.array([7]))[0]
    a, b = full.step(emb, hidden[0, -1], 20, kv), quant.step(emb, hidden[0, -1], 20, kv)
    np.testing.assert_allclose(np.array(b.h_next), np.array(a.h_next), atol=0.1, rtol=0.1)
    top_full = set(np.argsort(-np.array(a.logits))[:5].tolist())
    assert int(np.array(b.logits).argmax()) in top_full


def test_loader_reads_transformers_own_config_spelling(edge_pair, tmp_path):
    """transformers 5.23 saves the full-attention head size as per_layer_config
    ({"3": {"head_dim": 32}}), the published configs as global_head_dim: both load alike."""
    import json
    import shutil

    raw = tmp_path / "assistant-raw"
    shutil.copytree(edge_pair.assistant, raw)
    cfg = json.loads((raw / "config.json").read_text())
    full = cfg["text_config"]["layer_types"].index("full_attention")
    cfg["text_config"]["per_layer_config"] = {str(full): {"head_dim": cfg["text_config"].pop("global_head_dim")}}
    (raw / "config.json").write_text(json.dumps(cfg))
    a, b = load_assistant(edge_pair.assistant), load_assistant(raw)
    assert b.text.global_head_dim == a.text.global_head_dim == 32
    assert b.model.layers[full].self_attn.head_dim == 32


@pytest.mark.parametrize("context", [5, 3 * SLIDING_WINDOW])  # inside and past the sliding window
def test_view_with_masks_and_compiled_step_match_the_exact_kv(edge_pair, context):
    """What the round loop runs -- the compiled drafter step on whole K/V buffers with masks,
    from a cache that still holds a verify's rejected drafts (drafter_view) -- equals the
    eager step on exactly the K/V plain decoding holds (drafter_kv), for every accepted count.
    Evaluated only after the cache has been written again and rolled back: a chain keeps the
    arrays it read, which is why the loop may write the cache while a chain runs."""
    from engines.mlx_chat.cache import make_rollback_cache, rollback

    mlx_target, _ = load_targets(edge_pair.target)
    target = Gemma4Target.of(mlx_target)
    drafter = load_assistant(edge_pair.assistant)
    k = 3
    ids = np.random.RandomState(context).randint(6, 512, size=(1, context + k + 8))
    h = mx.array(np.random.RandomState(1).standard_normal(target.hidden_size).astype(np.float32))

    cache = make_rollback_cache(mlx_target)
    target.forward(mx.array(ids[:, :context]), cache)  # the prompt
    target.forward(mx.array(ids[:, context : context + k]), cache)  # a verify: k inputs written
    lazy = []
    for accepted in range(k):  # the state after keeping `accepted` of them
        position = context + accepted
        kv, masks = target.drafter_view(cache, mx.array(position - 1))
        emb = target.embed(mx.array([int(ids[0, position])]))[0]
        lazy.append(drafter.compiled_step()(emb, h, mx.array(position), kv, masks))
    target.forward(mx.array(ids[:, context + k : context + k + 8]), cache)  # the cache moves on
    rollback(cache, 5)

    for accepted, ours in enumerate(lazy):
        position = context + accepted
        fresh = make_rollback_cache(mlx_target)
        target.forward(mx.array(ids[:, :position]), fresh)
        emb = target.embed(mx.array([int(ids[0, position])]))[0]
        want = drafter.step(emb, h, position, drafter_kv(target, fresh))
        np.testing.assert_allclose(np.array(ours.logits), np.array(want.logits), atol=ATOL, rtol=1e-4)
        np.testing.assert_allclose(np.array(ours.h_next), np.array(want.h_next), atol=ATOL, rtol=1e-4)
