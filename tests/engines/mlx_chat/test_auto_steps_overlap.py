"""`--steps auto` with an MTP drafter and depth-2 overlap, through the chat engine's own loop (the tiny
Gemma 4 edge pair; a replaying drafter, always right, so a chain drafted for the wrong state
would show as a rejected draft): what the loop tells auto of each round's cost, and which
chains it anticipates. On the rounds' bookkeeping, never on their timings.

- A round whose k is below the chain anticipated for it (at the last round's k) paid for drafts
  it did not verify: it is recorded as not priced, not as the price of its k.
- Behind a round that chose to draft nothing no chain is anticipated (it was computed and
  dropped every round while auto priced the drafter out), and the next drafting round chains
  from its own state, not from a chain anticipated before it.
"""

import pytest

mx = pytest.importorskip("mlx.core")

from engines.types import Request, SpecConfig  # noqa: E402
from engines.mlx_chat.engine import ChatEngine  # noqa: E402
from engines.speculative.tuning import AutoSteps  # noqa: E402
from tests.engines.gemma4.checkpoints import EDGE_TARGET, AssistantSpec, build_assistant, build_target  # noqa: E402
from tests.engines.gemma4.replay import replay_factory  # noqa: E402

PROMPT = "w10 w20 w30 w40 w50 w60 w70 w80"
# the k of each round (auto's choice, scripted): deeper, shallower, none, none again, back
SCRIPT = [3, 1, 1, 0, 0, 2, 2, 3, 0, 1, 1, 2, 0, 3]
# a round is wasted when its k is below the chain anticipated for it: the last drafting round's
# k, anticipated only behind a round that drafted
WASTED = [False, True, False, True, False, False, False, False, True, False, False, False, True, False]


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto_overlap")
    target = build_target(root / "target", EDGE_TARGET)
    assistant = build_assistant(root / "assistant", target, AssistantSpec(centroid=True))
    return ChatEngine.load(str(target)), str(assistant)


def test_auto_is_told_which_rounds_paid_for_drafts_they_did_not_verify(edge, monkeypatch):
    engine, assistant = edge
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    plain = [t for r in engine.generate(Request(prompt=PROMPT, max_tokens=60)) for t in r.tokens]
    made = []

    def factory(drafter, target, overlap=True, compiled=True):
        made.append(replay_factory(reference=ids + plain, error_rate=0.0, seed=0)(drafter, target, overlap, compiled))
        return made[-1]

    script = iter(SCRIPT)
    monkeypatch.setattr(AutoSteps, "choose", lambda self: next(script, None))
    recorded = []
    record = AutoSteps.record

    def spy(self, proposed, accepted, verify_s=None, draft_s=None, priced=True, asked=None):
        recorded.append((proposed, not priced))
        record(self, proposed, accepted, verify_s, draft_s, priced, asked)

    monkeypatch.setattr(AutoSteps, "record", spy)
    engine.mtp_proposer = factory
    try:
        spec = SpecConfig(method="mtp", steps=3, auto=True, draft_model=assistant)
        rounds = list(engine.generate(Request(prompt=PROMPT, max_tokens=60, spec=spec)))
    finally:
        engine.__dict__.pop("mtp_proposer", None)
    decode = [r for r in rounds if not r.prefill][: len(SCRIPT)]
    assert [t for r in rounds for t in r.tokens] == plain
    assert [r.proposed for r in decode] == SCRIPT  # the script ran (no EOS, max_tokens in the way)
    assert all(r.accepted == r.proposed for r in decode)  # every chain drafted from its own round's state
    assert recorded[: len(SCRIPT)] == list(zip(SCRIPT, WASTED))
    # a chain anticipated behind every round that drafted, none behind one that did not; a round
    # after one that did not drafts its own
    ks = [r.proposed for r in rounds if not r.prefill]
    chains = made[0].seen
    assert sum(c.anticipated for c in chains) == sum(1 for k in ks if k)
    assert sum(not c.anticipated for c in chains) == sum(1 for i, k in enumerate(ks) if k and (i == 0 or not ks[i - 1]))
