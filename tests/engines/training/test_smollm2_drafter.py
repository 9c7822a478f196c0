"""Slow: a drafter for SmolLM2-135M (the embedded default) trained by `specscope drafter train`
for a few minutes on the shipped prompts, then --spec mtp on 12 of the held-out open chat
prompts (resources/prompts/open_chat.json, none of them trained on), measured as the goal's bench
measures it (one draft a round, 64 tokens): plain greedy token for token on every prompt, and
drafts accepted far above what an untrained drafter gets (~1%). The goal's bench (>= 55% at
depth 1, >= 1.3x) is bench/drafter_smollm2.py; docs/benchmarks.md has its figures.

To fit CI, the run reads only the greedy round of the answers that ship with Specscope (690
answers, no answering) and trains for a fixed number of steps, so what it learns does not
depend on the machine's speed, only how long it takes: about 15 minutes on a quiet 2-core
machine (docs/benchmarks.md, A drafter trained here for SmolLM2: the slow test)."""

import json
import subprocess
import sys

import pytest

import resources
from engines.types import Request, SpecConfig
from tests.engines.chat import load_chat

pytestmark = pytest.mark.slow
STEPS = 1300
# of the 24 held-out prompts, the first 12, each decoded plainly and with the drafter: on a 2-core
# AVX2 EPYC beside another test worker all 24 took 24.8 minutes; a drafter this test trained there
# had 47.6% accepted on these 12, 47.9% on all 24
PROMPTS = 12


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2_drafter") / "drafter"
    cmd = [sys.executable, "-c", "import sys; from app.cli.main import main; sys.exit(main(sys.argv[1:]))",
           "drafter", "train", "--steps", str(STEPS), "--answers-per-prompt", "1", "--no-register",
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-2000:]
    # the greedy round of the shipped answers was read, not answered here
    assert "of the 690 answers ship with Specscope" in done.stderr, done.stderr[-2000:]
    return out


def test_smollm2_drafter_is_lossless_and_accepted_on_held_out_prompts(trained):
    from engines.mlx_chat.models import default_chat_model

    card = json.loads((trained / "card.json").read_text())
    assert card["acceptance_by_depth"][0] > 0.4, card["acceptance_by_depth"]
    engine = load_chat(str(default_chat_model()))
    prompts = [p["prompt"] for p in json.loads(resources.path("prompts", "open_chat.json").read_text())["prompts"]]
    assert len(prompts) >= 20
    proposed = accepted = 0
    for prompt in prompts[:PROMPTS]:
        plain = [t for r in engine.generate(Request(prompt=prompt, max_tokens=64)) for t in r.tokens]
        rounds = list(engine.generate(Request(prompt=prompt, max_tokens=64,
                                              spec=SpecConfig(method="mtp", steps=1, draft_model=str(trained)))))
        assert [t for r in rounds for t in r.tokens] == plain, prompt
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
    print(f"SmolLM2 drafter, {STEPS} steps on the greedy round: card d1 {card['acceptance_by_depth'][0]:.1%}, "
          f"real d1 {accepted / proposed:.1%} ({accepted} of {proposed}) on {PROMPTS} held-out prompts")
    assert accepted / proposed > 0.4, (accepted, proposed)
