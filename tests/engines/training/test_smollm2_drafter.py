"""Slow: a drafter for SmolLM2-135M (the embedded default) trained by `specscope drafter train`
for a few minutes on the shipped prompts, then --spec mtp on held-out open chat prompts
(resources/prompts/open_chat.json): plain greedy token for token, and drafts accepted far
above what an untrained drafter gets. The issue's goal (>= 55% at depth 1 after <= 15
minutes, >= 1.3x) is measured by bench/drafter_smollm2.py; docs/benchmarks.md has the figures."""

import json
import os
import subprocess
import sys

import pytest

import resources
from engines.types import Request, SpecConfig

# Written at the end of a session and never run (answering the 90 prompts alone took about 10
# minutes here): opt-in until it has been run and timed against CI's limit.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.environ.get("SPECSCOPE_SLOW_TRAINING") != "1",
                                                   reason="trains SmolLM2's drafter for minutes, not yet timed "
                                                          "against CI: SPECSCOPE_SLOW_TRAINING=1 runs it")]
MINUTES = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2_drafter") / "drafter"
    cmd = [sys.executable, "-c", "import sys; from app.cli.main import main; sys.exit(main(sys.argv[1:]))",
           "drafter", "train", "--minutes", str(MINUTES), "--answer-tokens", "128", "--answers-per-prompt", "1", "--no-register", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=3600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_smollm2_drafter_is_lossless_and_accepted_on_held_out_prompts(trained):
    from engines.mlx_chat.engine import ChatEngine
    from engines.mlx_chat.models import default_chat_model

    card = json.loads((trained / "card.json").read_text())
    assert card["acceptance_by_depth"][0] > 0.2, card["acceptance_by_depth"]
    engine = ChatEngine.load(str(default_chat_model()))
    prompts = [p["prompt"] for p in json.loads(resources.path("prompts", "open_chat.json").read_text())["prompts"]][:6]
    proposed = accepted = 0
    for prompt in prompts:
        plain = [t for r in engine.generate(Request(prompt=prompt, max_tokens=48)) for t in r.tokens]
        rounds = list(engine.generate(Request(prompt=prompt, max_tokens=48,
                                              spec=SpecConfig(method="mtp", steps=3, draft_model=str(trained)))))
        assert [t for r in rounds for t in r.tokens] == plain, prompt
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
    assert accepted / proposed > 0.15, (accepted, proposed)
