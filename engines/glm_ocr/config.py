"""GLM-OCR's config.json, filtered into typed dataclasses (no torch, no transformers).

Read from a Hugging Face checkpoint directory or from a converted directory (the converter
copies config.json and generation_config.json next to the packages)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from engines.types import EngineError


@dataclass
class TextConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    mrope_section: list[int] = field(default_factory=lambda: [8, 12, 12])
    num_nextn_predict_layers: int = 0

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each head that RoPE rotates; the rest pass through."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def mtp_layer_index(self) -> int:
        """The MTP layer is stored as the layer after the last decoder layer."""
        return self.num_hidden_layers


@dataclass
class VisionConfig:
    hidden_size: int
    num_heads: int
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    in_channels: int = 3
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass
class GlmOcrConfig:
    text: TextConfig
    vision: VisionConfig
    image_token_id: int
    eos_token_ids: list[int]

    @classmethod
    def from_dict(cls, d: dict, generation: dict | None = None) -> "GlmOcrConfig":
        t, v = d["text_config"], d["vision_config"]
        rope = t.get("rope_parameters") or {}
        text = TextConfig(
            vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], num_hidden_layers=t["num_hidden_layers"],
            num_key_value_heads=t["num_key_value_heads"],
            head_dim=t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"],
            rope_theta=rope.get("rope_theta", t.get("rope_theta", 10000.0)),
            partial_rotary_factor=rope.get("partial_rotary_factor", t.get("partial_rotary_factor", 1.0)),
            mrope_section=list(rope.get("mrope_section", [8, 12, 12])),
            num_nextn_predict_layers=t.get("num_nextn_predict_layers", 0),
        )
        vrope = v.get("rope_parameters") or {}
        vision = VisionConfig(
            hidden_size=v["hidden_size"], num_heads=v["num_heads"],
            patch_size=v.get("patch_size", 14), spatial_merge_size=v.get("spatial_merge_size", 2),
            temporal_patch_size=v.get("temporal_patch_size", 2), in_channels=v.get("in_channels", 3),
            rope_theta=vrope.get("rope_theta", 10000.0),
        )
        eos = (generation or {}).get("eos_token_id", t.get("eos_token_id"))
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        config = cls(text=text, vision=vision, image_token_id=d["image_token_id"], eos_token_ids=eos)
        if 2 * sum(text.mrope_section) != text.rotary_dim:
            raise EngineError(
                f"unsupported GLM-OCR config: mrope_section {text.mrope_section} does not cover the "
                f"rotary dims ({text.rotary_dim})"
            )
        return config

    @classmethod
    def load(cls, model_dir: str | Path) -> "GlmOcrConfig":
        model_dir = Path(model_dir)
        path = model_dir / "config.json"
        if not path.is_file():
            raise EngineError(f"{model_dir} is not a GLM-OCR model directory (no config.json)")
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise EngineError(f"cannot read {path}: {e}") from e
        if d.get("model_type") != "glm_ocr":
            raise EngineError(f"{model_dir} is not a GLM-OCR checkpoint (model_type {d.get('model_type')!r})")
        gen_path = model_dir / "generation_config.json"
        generation = json.loads(gen_path.read_text(encoding="utf-8")) if gen_path.is_file() else None
        try:
            return cls.from_dict(d, generation)
        except KeyError as e:
            raise EngineError(f"{path} lacks the field {e}") from e
