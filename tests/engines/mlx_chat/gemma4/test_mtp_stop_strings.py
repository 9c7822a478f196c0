"""Stop strings across rounds with Gemma 4 MTP (a replaying drafter accepted often but not
always): see tests/engines/stop_cases.py."""

import pytest
from tests.engines.chat import load_chat

pytest.importorskip("mlx.core")

from engines.types import Request, SpecConfig  # noqa: E402
from tests.engines.mlx_chat.gemma4.replay import replay_factory  # noqa: E402
from tests.engines.stop_cases import check_stop_strings, tokens_of  # noqa: E402

PROMPT = "w10 w20 w30 w40 w50 w60 w70 w80"


def test_stop_strings_across_rounds(dense_pair):
    engine = load_chat(str(dense_pair.target))

    def runner(spec):
        return lambda stop: list(engine.generate(Request(prompt=PROMPT, max_tokens=30, stop=stop, spec=spec)))

    plain = runner(SpecConfig())
    reference = engine.prompt_ids(Request(prompt=PROMPT)) + tokens_of(plain([]))
    engine.mtp_group = replay_factory(reference=reference, error_rate=0.25, seed=1)
    mtp = SpecConfig(method="mtp", steps=3, draft_model=str(dense_pair.assistant))
    check_stop_strings(plain, {"mtp": runner(mtp)})
    assert 0 < sum(r.accepted for r in runner(mtp)([])) < sum(r.proposed for r in runner(mtp)([]))
