"""Composed n-gram + MTP with depth-2 overlap, through the chat engine's own loop (the tiny Gemma 4 edge
pair; a replaying drafter, always right): a chain round after a round that did not chain drafts
from its own state. The chain the MTP proposer anticipated behind the last chain round was for
the round that did not chain; kept, the next chain round took it as its own (it was marked
ready) and drafted for a position already passed -- every draft rejected. The chooser's choices
are scripted; nothing here depends on timings."""

import pytest

mx = pytest.importorskip("mlx.core")

import engines.speculative.composed as composed  # noqa: E402
from engines.types import Request, SpecConfig  # noqa: E402
from engines.mlx_chat.engine import ChatEngine  # noqa: E402
from engines.speculative.composed import Chooser  # noqa: E402
from tests.engines.gemma4.checkpoints import EDGE_TARGET, AssistantSpec, build_assistant, build_target  # noqa: E402
from tests.engines.gemma4.replay import replay_factory  # noqa: E402

PROMPT = "w10 w20 w30 w40 w50 w60 w70 w80"
CHAINS = [2, 0, 2, 0, 2, 2, 0, 0, 2]  # each round's chain as the chooser plans it, then 2


def test_a_chain_after_a_round_without_one_is_drafted_from_its_own_state(tmp_path, monkeypatch):
    target = build_target(tmp_path / "target", EDGE_TARGET)
    assistant = build_assistant(tmp_path / "assistant", target, AssistantSpec(centroid=True))
    engine = ChatEngine.load(str(target))
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    plain = [t for r in engine.generate(Request(prompt=PROMPT, max_tokens=40)) for t in r.tokens]
    engine.mtp_proposer = replay_factory(reference=ids + plain, error_rate=0.0, seed=0)
    monkeypatch.setattr(composed, "MEASURED", False)  # no probes: the script's choices only

    script, first = iter(CHAINS), {}

    def plan(self, found, k):  # the round's own choice from the script; any other call: chain
        if first.pop("round", False):
            return 0, next(script, 2)
        return 0, 2

    propose = composed.ComposedProposer.propose

    def scripted(self, ctx, k):
        first["round"] = True
        return propose(self, ctx, k)

    monkeypatch.setattr(Chooser, "plan", plan)
    monkeypatch.setattr(composed.ComposedProposer, "propose", scripted)
    spec = SpecConfig(method="mtp", steps=2, compose_ngram=True, draft_model=str(assistant))
    rounds = [r for r in engine.generate(Request(prompt=PROMPT, max_tokens=40, spec=spec))]
    assert [t for r in rounds for t in r.tokens] == plain
    decode = [r for r in rounds if not r.prefill]
    chains = [i for i, r in enumerate(decode) if r.draft_source and r.draft_source.startswith("mtp")]
    after_none = [i for i in chains if i and decode[i - 1].proposed == 0]
    assert len(after_none) >= 2, [(r.draft_source, r.proposed) for r in decode]
    # every chain's two drafts accepted (an n-gram tail after them may not be)
    assert all(decode[i].accepted >= 2 for i in chains), [(r.draft_source, r.proposed, r.accepted) for r in decode]
