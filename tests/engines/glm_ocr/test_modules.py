"""Each channels-first module equals the unpatched transformers module it was built from, on
the tiny checkpoint and a real prompt (image tokens, so the multimodal RoPE sections matter)."""

import numpy as np
import pytest
import torch
from PIL import Image

from engines.glm_ocr.config import GlmOcrConfig
from engines.glm_ocr.positions import prompt_positions, text_rope, vision_rope
from engines.glm_ocr.prompts import GlmTokenizer, prompt_ids
from engines.glm_ocr.weights import load_reference, modules_from_reference, reference_mtp_forward

TOL = 2e-4  # float32 throughout; differences are summation order only


@pytest.fixture(scope="module")
def setup(tiny_glm_ocr):
    from transformers import Glm46VImageProcessorPil

    config = GlmOcrConfig.load(tiny_glm_ocr)
    ref = load_reference(tiny_glm_ocr)
    modules = modules_from_reference(ref, config, cache_length=256)
    rng = np.random.default_rng(3)
    image = Image.fromarray(rng.integers(0, 255, (90, 160, 3), dtype=np.uint8))
    feats = Glm46VImageProcessorPil.from_pretrained(tiny_glm_ocr)(images=[image], return_tensors="pt")
    grid = tuple(int(x) for x in feats["image_grid_thw"][0])
    n_image = grid[0] * grid[1] * grid[2] // 4
    ids = prompt_ids(GlmTokenizer(tiny_glm_ocr), "text", n_image, config.image_token_id)
    return config, ref, modules, feats["pixel_values"], grid, ids


def cf(x):  # (S, C) -> (1, C, 1, S)
    return torch.as_tensor(x).float().T[None, :, None, :]


def rows(x):  # (1, C, 1, S) -> (S, C)
    return x[0, :, 0, :].T


@torch.no_grad()
def test_vision_encoder_matches_transformers(setup):
    config, ref, modules, pixel_values, grid, _ = setup
    expected = ref.model.model.visual(pixel_values, grid_thw=torch.tensor([grid])).pooler_output
    cos, sin = vision_rope(grid, config.vision)
    patches = pixel_values.view(pixel_values.shape[0], 6, 14, 14)
    got = rows(modules.vision(patches, torch.from_numpy(cos), torch.from_numpy(sin)))
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=TOL, rtol=0), (got - expected).abs().max()


def _prompt_embeds_and_positions(setup):
    config, ref, modules, pixel_values, grid, ids = setup
    model = ref.model.model
    input_ids = torch.tensor([ids])
    embeds = model.language_model.embed_tokens(input_ids)
    image = model.visual(pixel_values, grid_thw=torch.tensor([grid])).pooler_output
    embeds[input_ids == config.image_token_id] = image
    positions, delta = prompt_positions(ids, config.image_token_id, grid, 2)
    hf_positions, hf_delta = model.get_rope_index(
        input_ids, mm_token_type_ids=(input_ids == config.image_token_id).int(), image_grid_thw=torch.tensor([grid]))
    assert np.array_equal(positions, hf_positions[:, 0].numpy()) and delta == int(hf_delta)
    return embeds, positions


@torch.no_grad()
def test_text_decoder_in_chunks_matches_transformers(setup):
    config, ref, modules, *_ = setup
    embeds, positions = _prompt_embeds_and_positions(setup)
    expected = ref.model.model.language_model(
        inputs_embeds=embeds, position_ids=torch.from_numpy(positions)[:, None]).last_hidden_state[0]
    cos, sin = text_rope(positions, config.text)
    seq_len, n = 8, embeds.shape[1]
    got = []
    modules.decoder.reset()
    for start in range(0, n, seq_len):  # fixed-size chunks, the last one padded
        real = min(seq_len, n - start)
        pad = seq_len - real
        chunk = torch.cat([embeds[0, start:start + real], torch.zeros(pad, embeds.shape[-1])])
        c = np.concatenate([cos[start:start + real], np.zeros((pad, cos.shape[1]), np.float32)])
        s = np.concatenate([sin[start:start + real], np.zeros((pad, sin.shape[1]), np.float32)])
        out = modules.decoder(cf(chunk), torch.from_numpy(c), torch.from_numpy(s), torch.tensor([start], dtype=torch.int32))
        got.append(rows(out)[:real])
    got = torch.cat(got)
    assert torch.allclose(got, expected, atol=TOL, rtol=0), (got - expected).abs().max()
    logits = rows(modules.lm_head(cf(got)))
    assert torch.allclose(logits, ref.model.lm_head(expected), atol=TOL * 10, rtol=0)


@torch.no_grad()
def test_lm_head_chunks_cover_the_vocabulary(setup):
    from engines.glm_ocr.modules import LMHead

    _, ref, _, *_ = setup
    head = LMHead(ref.model.lm_head, chunk=100)  # 288 rows -> chunks of 100, 100, 88
    assert [c.out_channels for c in head.chunks] == [100, 100, 88]
    x = torch.randn(5, 64)
    assert torch.allclose(rows(head(cf(x))), ref.model.lm_head(x), atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("step", [1, 5])
def test_mtp_layer_matches_transformers_decoder_layer(setup, step):
    """Over a sequence in steps of 1 (as the Core ML package runs) or 5, with its own cache,
    position-0 masking, and both outputs (raw for chaining, normed for the head)."""
    config, ref, modules, *_ = setup
    embeds, positions = _prompt_embeds_and_positions(setup)
    hidden = ref.model.model.language_model(
        inputs_embeds=embeds, position_ids=torch.from_numpy(positions)[:, None]).last_hidden_state
    n = embeds.shape[1] - 1
    prev, nxt = hidden[:, :n], embeds[:, 1:n + 1]
    exp_raw, exp_head = reference_mtp_forward(ref, prev, nxt, torch.from_numpy(positions[:, :n])[:, None])
    cos, sin = text_rope(positions[:, :n], config.text)
    modules.mtp.reset()
    got_raw, got_head = [], []
    for start in range(0, n, step):
        end = min(n, start + step)
        raw, head = modules.mtp(cf(prev[0, start:end]), cf(nxt[0, start:end]), torch.from_numpy(cos[start:end]),
                                torch.from_numpy(sin[start:end]), torch.tensor([start], dtype=torch.int32))
        got_raw.append(rows(raw))
        got_head.append(rows(head))
    got_raw, got_head = torch.cat(got_raw), torch.cat(got_head)
    assert torch.allclose(got_raw, exp_raw[0], atol=TOL, rtol=0), (got_raw - exp_raw[0]).abs().max()
    assert torch.allclose(got_head, exp_head[0], atol=TOL, rtol=0)
    # position-0 masking is real: the slot-0 output ignores the token embedding
    raw0, _ = modules.mtp(cf(prev[0, :1]), cf(torch.randn(1, 64)), torch.from_numpy(cos[:1]),
                          torch.from_numpy(sin[:1]), torch.tensor([0], dtype=torch.int32))
    assert torch.allclose(rows(raw0), exp_raw[0, :1], atol=TOL)
