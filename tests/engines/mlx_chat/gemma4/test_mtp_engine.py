"""Gemma 4 MTP through the real round loop (the chat engine's batch of one with --spec mtp), on
tiny HF checkpoints loaded by the product's loaders.

Lossless at T=0 for steps 1..7 (the random assistant, accepted ~never; and a replaying
drafter accepted often but not always), the drafter's view of the target (h_prev at the
last accepted position, K/V equal to plain decoding's, sliding window included), steps
launched ahead of their verdicts, graceful degradation (a drafter that raises, an
incompatible drafter).
"""

import functools

import numpy as np
import pytest
from tests.engines.chat import load_chat

mx = pytest.importorskip("mlx.core")

from engines.types import Request, SpecConfig  # noqa: E402
from engines.mlx_chat.mtp import Gemma4Target  # noqa: E402
from engines.mlx_chat.options import MtpOptions  # noqa: E402
from tests.engines.mlx_chat.gemma4.checkpoints import SLIDING_WINDOW  # noqa: E402
from tests.engines.mlx_chat.gemma4.reference import drafter_kv  # noqa: E402
from tests.engines.mlx_chat.gemma4.replay import replay_factory  # noqa: E402

PROMPT = "w10 w20 w30 w40 w50 w60 w70 w80"
MAX_TOKENS = 36  # prompt (~14 ids) + 36 > 6 sliding windows of 8


def tokens_of(rounds):
    return [t for r in rounds for t in r.tokens]


def run(engine, spec=None, max_tokens=MAX_TOKENS, prompt=PROMPT):
    return list(engine.generate(Request(prompt=prompt, max_tokens=max_tokens, spec=spec or SpecConfig())))


@pytest.fixture(scope="module")
def dense_engine(dense_pair):
    return load_chat(str(dense_pair.target))


@pytest.fixture(scope="module")
def edge_engine(edge_pair):
    return load_chat(str(edge_pair.target))


@pytest.fixture
def engine_and_pair(pair, request):
    engine = request.getfixturevalue(f"{pair.name}_engine")
    engine.__dict__.pop("mtp_group", None)
    yield engine, pair
    engine.__dict__.pop("mtp_group", None)


def mtp(pair, steps, **kw):
    return SpecConfig(method="mtp", steps=steps, draft_model=str(pair.assistant), **kw)


def test_generation_passes_the_sliding_window_and_varies(engine_and_pair):
    engine, _ = engine_and_pair
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    plain = tokens_of(run(engine))
    assert len(plain) == MAX_TOKENS and len(ids) + MAX_TOKENS > 6 * SLIDING_WINDOW
    assert len(set(plain[-2 * SLIDING_WINDOW:])) > SLIDING_WINDOW // 2  # not a one-token loop


@functools.lru_cache(maxsize=2)
def transformers_models(pair):
    from transformers import Gemma4ForCausalLM

    from tests.engines.mlx_chat.gemma4.checkpoints import load_assistant_hf

    return Gemma4ForCausalLM.from_pretrained(str(pair.target)).eval(), load_assistant_hf(pair.assistant)


def transformers_generate(pair, ids, steps):
    """transformers' own decoding of the same prompt ids at temperature 0: assisted generation
    with the Gemma4Assistant where the installed transformers can run it for this pair, else
    plain greedy. Either is transformers' greedy output (assisted generation at T=0 is lossless),
    so the tests compare tokens only, never which path ran: that is transformers' business and
    changes between releases (5.23 raised KeyError 'full_attention' for a target without KV
    sharing, our dense pair; 5.24 runs it assisted)."""
    import torch

    target, assistant = transformers_models(pair)
    assistant.generation_config.num_assistant_tokens = steps
    x = torch.tensor([ids])
    with torch.no_grad():
        try:
            out = target.generate(x, assistant_model=assistant, max_new_tokens=MAX_TOKENS, do_sample=False)
        except KeyError:
            out = target.generate(x, max_new_tokens=MAX_TOKENS, do_sample=False)
    return out[0, len(ids):].tolist()


def test_mtp_equals_plain_greedy_and_transformers_steps_1_to_7(engine_and_pair):
    """The random assistant: its drafts are (almost) always rejected -- every round rolls back.
    Our MTP output equals our plain greedy and transformers' greedy output (assisted where it
    can, see transformers_generate) for every draft length."""
    engine, pair = engine_and_pair
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    plain = tokens_of(run(engine))
    for steps in range(1, 8):
        rounds = run(engine, mtp(pair, steps))
        assert tokens_of(rounds) == plain, steps
        assert all(r.note is None for r in rounds)
        # a round asks for steps drafts, never more than leaves room for the target's token;
        # launched on the last round's verdict still in the graph, room after the most it can emit
        emitted = [sum(len(x.tokens) for x in rounds[:i]) for i in range(len(rounds) + 1)]
        room = [MAX_TOKENS - emitted[r.index - 1] - rounds[r.index - 1].proposed - 1 if r.launched_early
                else MAX_TOKENS - emitted[r.index] for r in rounds]
        assert all(r.proposed == min(steps, room[r.index] - 1) for r in rounds if not r.prefill)
        if pair.name == "edge" or steps == 1:
            assert transformers_generate(pair, ids, steps) == plain, steps


@pytest.mark.parametrize("adaptive", [False, True])
def test_replayed_drafts_lossless_and_accepted_often(engine_and_pair, adaptive):
    """A drafter accepted often but not always (the target's own output, 25% wrong): output
    still equals plain greedy, both verification branches run, and every chain started from
    the target's hidden state at the last accepted position and K/V equal to plain decoding's."""
    engine, pair = engine_and_pair
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    plain = tokens_of(run(engine))
    reference = ids + plain
    target = Gemma4Target.of(engine.model)
    # the target's final-norm hidden states over the whole greedy sequence, in one pass
    cache = engine.model.make_cache()
    _, hidden_all = target.forward(mx.array(reference)[None], cache)
    groups = []

    def factory(drafter, tgt, step):
        group = replay_factory(reference=reference, error_rate=0.25, seed=1)(drafter, tgt, step)
        groups.append(group)
        return group

    engine.mtp_group = factory
    proposed = accepted = 0
    for steps in (1, 2, 3, 5, 7):
        rounds = run(engine, mtp(pair, steps, adaptive=adaptive, max_steps=7))
        assert tokens_of(rounds) == plain, steps
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
        for r in rounds:
            assert len(r.accept_flags) == r.proposed and sum(r.accept_flags) == r.accepted
            assert r.from_draft == [i < r.accepted for i in range(len(r.tokens))]
    assert 0 < accepted < proposed
    assert 0.4 < accepted / proposed < 0.95, (accepted, proposed)

    # h_idx and rollback: what each chain read is what plain decoding holds at that point
    # (a chain launched ahead sees the K/V of every verified input; its masks must hide the
    # drafts its verdict rejects)
    checked = ahead = 0
    for group in groups:
        for seen in group.seen[::5]:
            position = int(np.array(seen.position))
            if position >= len(reference):  # launched ahead past max_tokens, never used
                continue
            np.testing.assert_allclose(np.array(seen.h_prev), np.array(hidden_all[0, position - 1]), atol=1e-4)
            fresh = engine.model.make_cache()
            engine.model(mx.array(reference[:position])[None], cache=fresh)
            want = drafter_kv(target, fresh)
            kv = seen.visible_kv()
            for kind in kv:
                assert kv[kind][0].shape == want[kind][0].shape
                np.testing.assert_allclose(kv[kind][0], np.array(want[kind][0]), atol=1e-4)
                np.testing.assert_allclose(kv[kind][1], np.array(want[kind][1]), atol=1e-4)
            assert kv["sliding_attention"][0].shape[2] == min(position, SLIDING_WINDOW)
            checked += 1
            ahead += seen.launched_ahead
    assert checked > 10 and 0 < ahead < checked


def test_rounds_launched_ahead_on_and_off_agree(edge_engine, edge_pair, monkeypatch):
    """Each round launched on the last one's verdict still in the graph (its chain drafted from
    it), or after reading it (MtpOptions(ahead=False)): the same tokens, and -- the replay's
    errors depending on (position, step) only -- the same acceptance, round for round, until the
    last rounds (launched ahead, a round's k is chosen before the last verdict is read)."""
    ids = edge_engine.prompt_ids(Request(prompt=PROMPT))
    plain = tokens_of(run(edge_engine))
    edge_engine.mtp_group = replay_factory(reference=ids + plain, error_rate=0.25, seed=2)
    try:
        on = run(edge_engine, mtp(edge_pair, 3))
        monkeypatch.setattr(edge_engine, "mtp_options", MtpOptions(ahead=False))
        off = run(edge_engine, mtp(edge_pair, 3))
    finally:
        edge_engine.__dict__.pop("mtp_group", None)
    assert tokens_of(on) == tokens_of(off) == plain
    assert sum(r.launched_early for r in on) > len(on) // 2 and not any(r.launched_early for r in off)
    same = next(i for i, (a, b) in enumerate(zip(on, off)) if a.proposed != b.proposed)
    assert same >= len(off) - 3 and [r.accepted for r in on[:same]] == [r.accepted for r in off[:same]]
    assert sum(r.accepted for r in on) > 0


def test_the_compile_switch_from_the_engines_options(edge_engine, edge_pair, monkeypatch):
    from engines.mlx_chat.mtp import mtp_drafter

    monkeypatch.setattr(edge_engine, "mtp_options", MtpOptions(compiled=False))
    source = mtp_drafter(edge_engine, Request(spec=mtp(edge_pair, 3)))
    assert source.step == source.drafter.step  # eager
    monkeypatch.setattr(edge_engine, "mtp_options", MtpOptions())
    source = mtp_drafter(edge_engine, Request(spec=mtp(edge_pair, 3)))
    assert source.step != source.drafter.step  # compiled


def test_published_gemma4_layout_with_draft_model_at_load(tmp_path_factory):
    """model_type gemma4 (Gemma4ForConditionalGeneration, weights under
    model.language_model.*) as published, the assistant given at load time as the CLI does
    (load_chat(target, draft_model=ASSISTANT_DIR)), spec without a path."""
    from tests.engines.mlx_chat.gemma4.checkpoints import EDGE_TARGET, AssistantSpec, build_assistant, build_target

    root = tmp_path_factory.mktemp("gemma4_published")
    target = build_target(root / "target", EDGE_TARGET, multimodal=True)
    assistant = build_assistant(root / "assistant", target, AssistantSpec(centroid=True))
    engine = load_chat(str(target), draft_model=str(assistant))
    assert engine.model.model_type == "gemma4"
    plain = tokens_of(run(engine))
    rounds = run(engine, SpecConfig(method="mtp", steps=3))
    assert tokens_of(rounds) == plain
    assert all(r.note is None for r in rounds) and sum(r.proposed for r in rounds) > 0


class RaisingDrafter:
    """The real assistant, failing at its n-th forward (a drafter error mid-run)."""

    def __init__(self, drafter, fail_at: int):
        self.drafter, self.fail_at, self.calls = drafter, fail_at, 0

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def _call(self, forward, args):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("drafter exploded")
        return forward(*args)

    def step(self, *args):
        return self._call(self.drafter.step, args)

    def compiled_step(self):
        compiled = self.drafter.compiled_step()
        return lambda *args: self._call(compiled, args)


@pytest.mark.parametrize("ahead", [True, False])
def test_drafter_that_raises_mid_run(edge_engine, edge_pair, ahead, monkeypatch):
    from engines.mlx_chat.mtp import load_drafter

    monkeypatch.setattr(edge_engine, "mtp_options", MtpOptions(ahead=ahead))
    path = str(edge_pair.assistant)
    plain = tokens_of(run(edge_engine))
    drafters = edge_engine.__dict__.setdefault("mtp_drafters", {})
    drafters[path] = RaisingDrafter(load_drafter(path), fail_at=7)
    try:
        rounds = run(edge_engine, mtp(edge_pair, 3))
    finally:
        drafters.pop(path)
    assert tokens_of(rounds) == plain
    noted = [r for r in rounds if r.note]
    assert len(noted) == 1 and "speculation stopped" in noted[0].note and "drafter exploded" in noted[0].note
    after = rounds[noted[0].index + 1:]
    assert after and all(r.proposed == 0 for r in after)
    assert sum(r.proposed for r in rounds[: noted[0].index]) > 0  # it did speculate before


@pytest.mark.parametrize("field,value,message", [
    ("backbone_hidden_size", 96, "backbone of width 96"),
    ("vocab_size", 1024, "vocabulary 1024 vs 512"),
])
def test_incompatible_drafter_turns_speculation_off(dense_engine, edge_pair, field, value, message):
    """A drafter built for another backbone width or vocabulary (our tiny pairs agree on
    both, so the mismatch is set on the loaded drafter): plain decoding, one clear note."""
    from engines.mlx_chat.mtp import load_drafter

    path = str(edge_pair.assistant)
    drafter = load_drafter(path)
    setattr(drafter, field, value)
    drafters = dense_engine.__dict__.setdefault("mtp_drafters", {})
    drafters[path] = drafter
    try:
        rounds = run(dense_engine, mtp(edge_pair, 3))
    finally:
        drafters.pop(path)
    assert tokens_of(rounds) == tokens_of(run(dense_engine))
    assert rounds[0].note and message in rounds[0].note and "speculation unavailable" in rounds[0].note
    assert all(r.proposed == 0 for r in rounds)


def test_missing_or_wrong_drafter_is_one_clear_line(dense_engine, dense_pair, tmp_path):
    rounds = run(dense_engine, SpecConfig(method="mtp", steps=3, draft_model=str(tmp_path / "nope")))
    assert "MTP drafter not found" in rounds[0].note
    rounds = run(dense_engine, SpecConfig(method="mtp", steps=3, draft_model=str(dense_pair.target)))
    assert "gemma4_assistant" in rounds[0].note and "\n" not in rounds[0].note


def test_skip_streak_with_mtp(edge_engine, edge_pair):
    """The random assistant is never right: with skip_streak=2, a round after two rejected ones
    skips drafting -- still lossless. (A round launched before the last verdict is read is
    chosen one rejection later: the first skip is the fourth round.)"""
    plain = tokens_of(run(edge_engine))
    rounds = run(edge_engine, mtp(edge_pair, 3, skip_streak=2))
    assert tokens_of(rounds) == plain
    decode = [r for r in rounds if not r.prefill]
    skipped = [r for r in decode if r.proposed == 0]
    assert skipped and len(skipped) < len(decode) / 2
    assert decode[3].proposed == 0 and decode[0].proposed == decode[1].proposed == decode[2].proposed == 3


def test_mtp_output_is_mlx_lm_greedy(engine_and_pair):
    """Against mlx-lm's own generate_step, not only this engine with speculation off (a
    replaying drafter, so drafts are accepted and rejected)."""
    from mlx_lm.generate import generate_step

    engine, pair = engine_and_pair
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    want = [t for t, _ in generate_step(mx.array(ids), engine.model, max_tokens=MAX_TOKENS)]
    engine.mtp_group = replay_factory(reference=ids + want, error_rate=0.25, seed=1)
    rounds = run(engine, mtp(pair, 3))
    assert tokens_of(rounds) == want
    assert 0 < sum(r.accepted for r in rounds) < sum(r.proposed for r in rounds)
