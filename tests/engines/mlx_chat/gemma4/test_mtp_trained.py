"""Gemma 4 MTP with a drafter trained on the target (tests/engines/mlx_chat/gemma4/trained.py), not a
replaying one: its drafts are accepted for what it learned, often but not always, and the
output is still plain greedy decoding, token for token.

Measured (3 drafts per round): 58 of 165 drafts accepted on the outputs it was trained on,
20 of 275 on three prompts it never saw (the tiny random target has little for 300 steps to
generalise from); the untrained drafter is accepted about never. Slow: the first run trains
(13 minutes on 2 heavily shared cores); later runs load the cached weights."""

import pytest
from tests.engines.chat import load_chat

pytest.importorskip("mlx.core")

from engines.types import Request, SpecConfig  # noqa: E402
from tests.engines.mlx_chat.gemma4.trained import TRAIN_PROMPTS, trained_assistant  # noqa: E402

PROMPTS = TRAIN_PROMPTS[:3]  # the outputs it was trained on, decoded again through the loop


@pytest.mark.slow
def test_a_trained_drafter_is_accepted_and_lossless(dense_pair):
    engine = load_chat(str(dense_pair.target))
    drafter = trained_assistant(engine, dense_pair.target, dense_pair.assistant)
    engine.__dict__.setdefault("mtp_drafters", {})[str(dense_pair.assistant)] = drafter
    proposed = accepted = 0
    for prompt in PROMPTS:
        plain = [t for r in engine.generate(Request(prompt=prompt, max_tokens=40)) for t in r.tokens]
        spec = SpecConfig(method="mtp", steps=3, draft_model=str(dense_pair.assistant))
        rounds = list(engine.generate(Request(prompt=prompt, max_tokens=40, spec=spec)))
        assert [t for r in rounds for t in r.tokens] == plain, prompt
        assert all(r.note is None for r in rounds)
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
    assert 0 < accepted < proposed
    assert accepted / proposed > 0.2, (accepted, proposed)
