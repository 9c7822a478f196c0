"""MTP rounds launched before the last verdict is read (engines/mlx_chat/engine.py) on slot
caches (cache.SlotKVCache): a rejected draft stays in the buffer as a hole every later query's
mask hides, and a token's position is its slot minus the holes before it -- both still lazy when
the next verify is built. What the target computes must be what it computes on a cache that
never held the rejected drafts; the loop's outputs must be plain decoding's."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from engines.types import Request, Sampling, SpecConfig
from engines.mlx_chat.cache import RollbackError, SlotKVCache, make_slot_cache
from engines.mlx_chat.options import MtpOptions
from tests.engines.mlx_chat import checkpoints
from tests.engines.training.test_trained_drafter import FRESH, TRAINED_ON, tokens_of

PROMPT = [3, 17, 22, 9, 41, 5, 30, 12]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from engines.mlx_chat.loading import load_model

    return load_model(str(checkpoints.make_tiny_llama(tmp_path_factory.mktemp("slots") / "llama"))).model


def launched_after(engine, request: Request) -> list:
    """The request's rounds, each launched after the last verdict is read (rollback caches)."""
    engine.mtp_options = MtpOptions(pipeline=False)
    try:
        return list(engine.generate(request))
    finally:
        engine.mtp_options = MtpOptions()


def logits(model, tokens: list[int], cache) -> mx.array:
    return model(mx.array([tokens], dtype=mx.uint32), cache=cache)[0]


@pytest.mark.parametrize("lazy", [False, True])
def test_a_rejected_draft_is_a_hole_the_next_forwards_do_not_see(llama, lazy):
    """Plain: the prompt, then a, b, c one by one. Slots: [a, wrong] with the wrong draft
    rejected, [b, wrong, wrong] with both rejected, then [c, d]: every accepted position's
    logits are the plain run's, the position after the holes is the plain one's."""
    a, b, c, d, wrong = 11, 23, 35, 47, 60
    plain = make_prompt_cache(llama)
    mx.eval(logits(llama, PROMPT, plain))
    want = [logits(llama, [t], plain)[0] for t in (a, b, c, d)]

    slots = make_slot_cache(llama)
    assert slots is not None and all(isinstance(s, SlotKVCache) for s in slots)
    mx.eval(logits(llama, PROMPT, slots))
    got_a = logits(llama, [a, wrong], slots)[0]
    # the verdict as the loop has it before the host reads it: computed in the graph
    none = (mx.argmax(got_a) < 0).astype(mx.int32) if lazy else mx.array(0)
    slots[0].holes.reject(len(PROMPT), 1, none)
    got_b = logits(llama, [b, wrong, wrong], slots)[0]
    slots[0].holes.reject(len(PROMPT) + 2, 2, none)
    assert slots[0].slot == len(PROMPT) + 5
    assert int(mx.array(slots[0].offset)) == len(PROMPT) + 2  # c's position: 3 holes before it
    got_cd = logits(llama, [c, d], slots)
    for name, w, g in zip("abcd", want, [got_a, got_b, got_cd[0], got_cd[1]]):
        assert mx.allclose(g, w, atol=1e-5).item(), name
        assert int(mx.argmax(g)) == int(mx.argmax(w)), name


def test_a_slot_cache_refuses_to_roll_back_and_only_full_attention_gets_one(llama, tmp_path):
    from engines.mlx_chat.loading import load_model

    slots = make_slot_cache(llama)
    with pytest.raises(RollbackError):
        slots[0].trim(1)
    gemma3 = load_model(str(checkpoints.make_tiny_gemma3(tmp_path / "gemma3", sliding_window=8))).model
    assert make_slot_cache(gemma3) is None  # sliding windows keep the rollback caches


def early(rounds) -> int:
    return sum(r.launched_early for r in rounds)


def verdicts_alike(rounds, after) -> int:
    """The tokens over which two runs' rounds drafted as many and had as many accepted: they
    draft alike until a round launched early drafts for the tokens left before the last verdict
    (fewer, near the end), or the skip streak, told of a verdict one round later, skips later."""
    same = next((i for i, (x, y) in enumerate(zip(rounds, after)) if x.proposed != y.proposed),
                min(len(rounds), len(after)))
    assert [(r.tokens, r.accepted) for r in rounds[:same]] == [(r.tokens, r.accepted) for r in after[:same]]
    return len(tokens_of(rounds[:same]))


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_mtp_rounds_launch_before_the_verdict_and_equal_plain_greedy(targets, steps):
    engine, _, drafter_dir = targets["llama"]
    spec = SpecConfig(method="mtp", steps=steps, draft_model=str(drafter_dir))
    proposed = accepted = launched = 0
    for prompt in TRAINED_ON[:2] + FRESH:
        plain = tokens_of(engine.generate(Request(prompt=prompt, max_tokens=48)))
        rounds = list(engine.generate(Request(prompt=prompt, max_tokens=48, spec=spec)))
        assert tokens_of(rounds) == plain, prompt
        assert all(r.note is None for r in rounds)
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
        launched += early(rounds)
        after = launched_after(engine, Request(prompt=prompt, max_tokens=48, spec=spec))  # none early
        assert tokens_of(after) == plain and early(after) == 0
        assert verdicts_alike(rounds, after) >= 24  # the drafter read the same K/V: the holes hidden
    assert 0 < accepted < proposed  # drafts kept and drafts made holes
    assert launched > len(rounds) // 2  # most rounds were launched on a verdict still in the graph


def test_seeded_sampling_is_the_same_launched_early_or_not(targets):
    """At T>0 the random draws are made in the same order either way (verify r, chain r+1,
    verify r+1, ...), so a seeded run gives the same tokens and verdicts while both draft alike:
    the exact-law tests (test_trained_sampled.py), which run with rounds launched early, speak
    for both loops."""
    engine, _, drafter_dir = targets["llama"]
    sampling = Sampling(temperature=0.9, seed=7)
    for steps in (1, 3):
        spec = SpecConfig(method="mtp", steps=steps, draft_model=str(drafter_dir))
        for prompt in TRAINED_ON[:2]:
            rounds = list(engine.generate(Request(prompt=prompt, max_tokens=40, spec=spec, sampling=sampling)))
            after = launched_after(engine, Request(prompt=prompt, max_tokens=40, spec=spec, sampling=sampling))
            assert early(rounds) > 0 and early(after) == 0
            assert verdicts_alike(rounds, after) >= 24, (steps, prompt)


def test_a_round_launched_early_is_priced_only_between_rounds_of_its_k(targets, monkeypatch):
    """--steps auto prices a width by its rounds' time, settle to settle. When rounds launch
    before the last verdict, part of a round's time is its neighbours' (the host enqueues the
    next round while the device runs this one), so a round whose neighbour launched early with
    another k, or did not launch early while it did, is not a price (ChatEngine._priced): told to
    auto as priced=False."""
    from engines.speculative.tuning import AutoSteps

    engine, _, drafter_dir = targets["llama"]
    script = iter([1, 1, 1, 2, 2, 2, 1, 1, 3, 3, 1, 1, 1, 2, 1, 1])
    monkeypatch.setattr(AutoSteps, "choose", lambda self: next(script, None))
    recorded = []
    record = AutoSteps.record

    def spy(self, proposed, accepted, verify_s=None, draft_s=None, priced=True, asked=None):
        recorded.append(priced)
        record(self, proposed, accepted, verify_s, draft_s, priced, asked)

    monkeypatch.setattr(AutoSteps, "record", spy)
    spec = SpecConfig(method="mtp", steps=3, auto=True, draft_model=str(drafter_dir))
    rounds = [r for r in engine.generate(Request(prompt=TRAINED_ON[0], max_tokens=60, spec=spec)) if not r.prefill]
    ks = [r.proposed for r in rounds]
    assert ks[:16] == [1, 1, 1, 2, 2, 2, 1, 1, 3, 3, 1, 1, 1, 2, 1, 1]  # the script ran
    assert early(rounds[1:16]) == 15
    want = []
    for i, r in enumerate(rounds):
        next_early = i + 1 < len(rounds) and rounds[i + 1].launched_early
        if i and ks[i - 1] > r.proposed:  # a chain anticipated deeper, cut (depth-2 overlap)
            want.append(False)
        elif r.launched_early or next_early:  # between rounds launched early, of its k
            want.append(r.launched_early and next_early and ks[i - 1] == r.proposed == ks[i + 1])
        else:
            want.append(True)
    assert recorded == want
    assert want[:15] == [False, True, False, False, True, False, False, False, False, False, False, True, False,
                         False, False]  # round 0, launched after the prefill, is no price; round 1 is
