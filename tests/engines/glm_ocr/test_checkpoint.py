"""The tiny checkpoint is a real GLM-OCR snapshot in miniature: transformers loads it, and the
MTP layer sits where the real one does, under the real names."""

from safetensors import safe_open

from tests.engines.glm_ocr.checkpoints import read_config


def _keys(path):
    with safe_open(path / "model.safetensors", "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def test_transformers_loads_the_tiny_checkpoint(tiny_glm_ocr):
    from transformers import AutoTokenizer, Glm46VImageProcessorPil, GlmOcrForConditionalGeneration

    model = GlmOcrForConditionalGeneration.from_pretrained(tiny_glm_ocr)
    assert model.config.text_config.num_hidden_layers == 2
    tok = AutoTokenizer.from_pretrained(tiny_glm_ocr)
    ids = tok.encode("[gMASK]<sop><|user|>\nab", add_special_tokens=False)
    assert ids[:3] == tok.convert_tokens_to_ids(["[gMASK]", "<sop>", "<|user|>"])
    assert tok.decode(ids[3:]) == "\nab"
    assert Glm46VImageProcessorPil.from_pretrained(tiny_glm_ocr).merge_size == 2


def test_mtp_layer_is_stored_under_the_real_names(tiny_glm_ocr, tiny_glm_ocr_no_mtp):
    cfg = read_config(tiny_glm_ocr)["text_config"]
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    keys = _keys(tiny_glm_ocr)
    prefix = f"model.language_model.layers.{n}."
    assert keys[prefix + "eh_proj.weight"] == (h, 2 * h)
    for name in ("enorm", "hnorm", "shared_head.norm", "input_layernorm", "post_self_attn_layernorm",
                 "post_attention_layernorm", "post_mlp_layernorm"):
        assert keys[prefix + name + ".weight"] == (h,)
    assert keys[prefix + "self_attn.q_proj.weight"] == keys[f"model.language_model.layers.{n - 1}.self_attn.q_proj.weight"]
    assert keys[prefix + "shared_head.head.weight"] == keys["lm_head.weight"]
    assert not any(k.startswith(prefix) for k in _keys(tiny_glm_ocr_no_mtp))
