"""An independent GLM-OCR speculative loop, written on transformers' own modules and none of
the product's code: the yardstick the engine's acceptance by depth is measured against.

The convention (docs/glm-ocr-mtp-convention.md, after vLLM's GLM-OCR MTP proposer):
  - the MTP layer's row i pairs the target's final-normed hidden state at row i with the
    input embedding of row i+1 (the vision encoder's feature for an image token), at row i's
    mRoPE position; its input embedding is zeroed at position 0;
  - a chain continues from the MTP layer's output before shared_head.norm, with the embedding
    of its own last draft, one position further per step;
  - the MTP layer only ever keeps verified pairs: each chain is computed over the verified
    pairs followed by its own steps, and a rejection leaves nothing behind.

The MTP layer is recomputed over the whole sequence at every step (no KV cache): causal
attention makes that equal to a cache holding exactly the rows listed, which is the point.
The main model keeps a transformers DynamicCache, cropped to the verified length after each
round. Greedy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

TASK = "Text Recognition:"


@dataclass
class ReferenceRun:
    tokens: list[int]
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (proposed, accepted) per decode round


class ReferenceMtp(nn.Module):
    """GLM-OCR's MTP layer from transformers' GlmOcrTextDecoderLayer and RMSNorm, its weights
    read straight from the safetensors (transformers drops them at load)."""

    def __init__(self, model, model_dir: Path):
        from safetensors import safe_open
        from transformers.models.glm_ocr.modeling_glm_ocr import GlmOcrRMSNorm, GlmOcrTextDecoderLayer

        super().__init__()
        cfg = model.config.text_config
        prefix = f"model.language_model.layers.{cfg.num_hidden_layers}."
        with safe_open(Path(model_dir) / "model.safetensors", "pt") as f:
            weights = {k[len(prefix):]: f.get_tensor(k).float() for k in f.keys() if k.startswith(prefix)}
        h = cfg.hidden_size
        self.enorm, self.hnorm, self.head_norm = (GlmOcrRMSNorm(h, cfg.rms_norm_eps) for _ in range(3))
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = GlmOcrTextDecoderLayer(cfg, cfg.num_hidden_layers)
        self.load_state_dict({
            "enorm.weight": weights.pop("enorm.weight"), "hnorm.weight": weights.pop("hnorm.weight"),
            "head_norm.weight": weights.pop("shared_head.norm.weight"), "eh_proj.weight": weights.pop("eh_proj.weight"),
            **{f"block.{k}": v for k, v in weights.items() if not k.startswith(("shared_head.", "embed_tokens."))},
        })
        self.rotary = model.model.language_model.rotary_emb

    def forward(self, previous: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(S, C), (S, C), (3, S) -> the block's outputs (S, C), before shared_head.norm."""
        embeds = torch.where((positions == 0).all(0)[:, None], torch.zeros_like(embeds), embeds)
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(previous)], dim=-1))[None]
        causal = torch.full((x.shape[1], x.shape[1]), float("-inf")).triu(1)[None, None]
        return self.block(x, position_embeddings=self.rotary(x, positions[:, None]), attention_mask=causal)[0]


class ReferenceLoop:
    def __init__(self, model_dir):
        from transformers import AutoTokenizer, Glm46VImageProcessorPil, GlmOcrForConditionalGeneration
        from transformers.utils import logging as hf_logging

        self.model_dir = Path(model_dir)
        hf_logging.set_verbosity_error()  # the MTP tensors are "unexpected" to transformers
        self.model = GlmOcrForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.mtp = ReferenceMtp(self.model, self.model_dir).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.processor = Glm46VImageProcessorPil.from_pretrained(model_dir)
        self.eos = set(self.model.config.text_config.eos_token_id)
        self.embed = self.model.model.language_model.embed_tokens

    def prompt(self, image) -> dict:
        """The checkpoint's chat template with the image placeholder repeated once per image
        token, as GLM-OCR's processor does, and the image processor's pixels."""
        feats = self.processor(images=[image], return_tensors="pt")
        grid = feats["image_grid_thw"]
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": TASK}]}],
            add_generation_prompt=True, tokenize=False)
        merge = self.model.config.vision_config.spatial_merge_size
        text = text.replace("<|image|>", "<|image|>" * (int(grid.prod()) // merge**2))
        ids = torch.tensor([self.tokenizer(text, add_special_tokens=False).input_ids])
        return dict(input_ids=ids, mm_token_type_ids=(ids == self.model.config.image_token_id).int(),
                    pixel_values=feats["pixel_values"], image_grid_thw=grid)

    @torch.no_grad()
    def run(self, image, steps: int, max_tokens: int) -> ReferenceRun:
        from transformers import DynamicCache

        lm, head = self.model.model, self.model.lm_head
        inputs = self.prompt(image)
        positions, delta = lm.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"])
        positions = positions[:, 0]  # (3, P)
        cache = DynamicCache(config=self.model.config.text_config)
        hidden = lm(**inputs, position_ids=positions[:, None], past_key_values=cache, use_cache=True).last_hidden_state[0]
        # the verified sequence: hidden states, input embeddings (image features in place), positions
        seq_hidden, seq_embeds, seq_pos = hidden, self._prompt_embeds(inputs), positions
        token = int(head(hidden[-1]).argmax())
        run = ReferenceRun([token])
        while token not in self.eos and len(run.tokens) < max_tokens:
            remaining = max_tokens - len(run.tokens)
            k = min(steps, remaining - 1)
            # the pairs (hidden i, embedding of row i+1), the newest token's pair last
            pairs_embeds = torch.cat([seq_embeds[1:], self.embed(torch.tensor([token]))])
            drafts = self._draft(seq_hidden, pairs_embeds, seq_pos, k)
            # verify [token, drafts...] in one forward at the next positions
            fed = torch.tensor([[token, *drafts]])
            length = seq_hidden.shape[0]
            pos = torch.arange(length, length + fed.shape[1]) + delta[0, 0]
            rows = lm.language_model(input_ids=fed, position_ids=pos.expand(3, 1, -1), past_key_values=cache,
                                     use_cache=True).last_hidden_state[0]
            target = head(rows).argmax(-1).tolist()
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == target[accepted]:
                accepted += 1
            if accepted < len(drafts):
                cache.crop(accepted - len(drafts))  # drop the rejected drafts' rows
            seq_hidden = torch.cat([seq_hidden, rows[: 1 + accepted]])
            seq_embeds = torch.cat([seq_embeds, self.embed(fed[0, : 1 + accepted])])
            seq_pos = torch.cat([seq_pos, pos[: 1 + accepted].expand(3, -1)], dim=1)
            run.rounds.append((len(drafts), accepted))
            for t in drafts[:accepted] + [target[accepted]]:
                if token in self.eos or len(run.tokens) >= max_tokens:
                    break
                token = t
                run.tokens.append(t)
        return run

    def _prompt_embeds(self, inputs) -> torch.Tensor:
        lm = self.model.model
        embeds = self.embed(inputs["input_ids"])[0]
        features = torch.cat(lm.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)
        embeds[inputs["input_ids"][0] == self.model.config.image_token_id] = features
        return embeds

    def _draft(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, k: int) -> list[int]:
        """k chained greedy drafts (fewer after an end-of-sequence draft)."""
        drafts: list[int] = []
        for _ in range(k):
            out = self.mtp(hidden, embeds, positions)
            drafts.append(int(self.model.lm_head(self.mtp.head_norm(out[-1])).argmax()))
            if drafts[-1] in self.eos:
                break
            hidden = torch.cat([hidden, out[-1:]])
            embeds = torch.cat([embeds, self.embed(torch.tensor(drafts[-1:]))])
            positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
        return drafts
