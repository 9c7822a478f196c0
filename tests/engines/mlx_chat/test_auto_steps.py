"""`--steps auto` through the real round loop: k changes from round to round with this
machine's costs and the run's acceptance, and the output stays the target's -- token for token
at T=0, the target's exact law at T>0 (a broken verifier fails the same test)."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import pytest

from engines.types import Request, SpecConfig
from engines.speculative.schedule import MAX_STEPS
from engines.profiles import Profile, machine_id
from tests.engines.broken_verifiers import BROKEN
from tests.engines.mlx_chat.test_lossless_sampled import PROMPT, SAMPLING, exact_distribution, tiny  # noqa: F401
from tests.stats import chi_square_pvalue

COPY = "the cat is big and the dog is small . the cat is big and the dog is small ."
N = 500


def tokens(rounds):
    return [t for r in rounds for t in r.tokens]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_auto_equals_plain_at_t0_and_moves_k(engines, llama_draft_dir, method):
    engine = engines["llama"]
    plain = tokens(engine.generate(Request(prompt=COPY, max_tokens=80)))
    spec = SpecConfig(method, 3, auto=True, draft_model=llama_draft_dir if method == "draft" else None)
    rounds = list(engine.generate(Request(prompt=COPY, max_tokens=80, spec=spec)))
    assert tokens(rounds) == plain
    asked = {r.steps for r in rounds if not r.prefill}
    assert len(asked) > 1, asked  # the fallback, then the chooser: k moved
    chosen = [r for r in rounds if r.expected_tok_s]  # the telemetry: what auto expected of each k
    assert chosen and all(len(r.expected_tok_s) == MAX_STEPS + 1 for r in chosen)


def flat(width: int) -> float:
    return 0.01 * (1 + 0.3 * width)


def flat_profile(engine, tmp_path, method: str, drafter: str = "") -> str:
    """A machine on which verifying 8 tokens costs what 1 does: auto drafts deep, then less
    as the run's acceptance falls -- k varies within the first rounds."""
    path = tmp_path / "profile.json"
    Profile(machine=machine_id(), model=engine.model_path, method=method, drafter=drafter,
            target_s={w: flat(w) for w in range(1, 9)}, draft_s=0.0,
            acceptance=[0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2]).save(path)
    return str(path)


@pytest.fixture
def flat_machine(tiny, monkeypatch):  # noqa: F811
    """The rounds cost what the flat profile says, drafting free -- not what this machine's
    timing of the tiny pair says: auto prices whole rounds, drafting included, and a draft of
    the tiny draft model costs more than a forward of the tiny target, so on a CPU auto rightly
    drafts nothing, and these tests of the law would test nothing."""
    from engines.speculative.tuning import AutoSteps

    record = AutoSteps.record
    monkeypatch.setattr(AutoSteps, "record", lambda self, proposed, accepted, verify_s=None, draft_s=None, *rest:
                        record(self, proposed, accepted, flat(1 + proposed), 0.0, *rest))
    tiny.loop.auto_seen.clear()
    yield
    tiny.loop.auto_seen.clear()


def law(engine, spec):
    mx.random.seed(3)
    counts, proposed, accepted, asked = Counter(), 0, 0, set()
    for _ in range(N):
        rounds = list(engine.generate(Request(prompt=PROMPT, max_tokens=5, spec=spec, sampling=SAMPLING,
                                              ignore_chat_template=True)))
        counts[tuple(tokens(rounds))[:3]] += 1
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
        asked |= {r.steps for r in rounds if not r.prefill}
    return counts, proposed, accepted, asked


def test_auto_keeps_the_target_law_at_t_above_0(tiny, tmp_path, flat_machine):  # noqa: F811
    spec = SpecConfig("draft", 3, auto=True, profile=flat_profile(tiny, tmp_path, "draft", tiny.draft_path))
    spec.draft_model = tiny.draft_path
    counts, proposed, accepted, asked = law(tiny, spec)
    assert proposed > 0.5 * N and 0.03 * proposed < accepted < 0.95 * proposed
    assert len(asked) > 1 and max(asked) <= MAX_STEPS
    assert chi_square_pvalue(counts, exact_distribution(tiny), N) > 1e-3


def test_a_broken_verifier_fails_the_auto_law(tiny, tmp_path, monkeypatch, flat_machine):  # noqa: F811
    spec = SpecConfig("draft", 3, auto=True, profile=flat_profile(tiny, tmp_path, "draft", tiny.draft_path))
    spec.draft_model = tiny.draft_path
    BROKEN["resample_from_p"](monkeypatch)
    counts, _, _, _ = law(tiny, spec)
    assert chi_square_pvalue(counts, exact_distribution(tiny), N) < 1e-3


def test_ngram_auto_measures_deep_positions_from_whole_continuations(engines, tmp_path, monkeypatch):
    """A profile that says the second draft is hardly ever accepted starts n-gram auto at k = 1
    on a machine where verifying is nearly free. The lookup's whole continuations, scored as
    the output arrives, measure positions 2..7 every round, and k follows what they show; from
    the drafts alone position 2 is measured only in the probes (one round in nine), and k stays
    lower (the second half of the test)."""
    from engines.speculative.tuning import AutoSteps

    engine = engines["llama"]
    path = tmp_path / "profile.json"

    def nearly_flat(width: int) -> float:
        return 0.01 * (1 + 0.02 * width)

    Profile(machine=machine_id(), model=engine.model_path, method="ngram", drafter="",
            target_s={w: nearly_flat(w) for w in range(1, 9)}, draft_s=0.0,
            acceptance=[0.9, 0.02]).save(path)
    # the rounds cost what the profile says, not what this machine's timing of them says (timed,
    # the test failed now and then: a busy machine's slow rounds priced drafting out)
    record = AutoSteps.record
    monkeypatch.setattr(AutoSteps, "record", lambda self, proposed, accepted, verify_s=None, draft_s=None, *rest:
                        record(self, proposed, accepted, nearly_flat(1 + proposed), 0.0, *rest))
    engine.loop.auto_seen.clear()
    plain = tokens(engine.generate(Request(prompt=COPY, max_tokens=80)))
    spec = SpecConfig("ngram", 3, auto=True, profile=str(path))

    def chosen():
        rounds = list(engine.generate(Request(prompt=COPY, max_tokens=80, spec=spec)))
        assert tokens(rounds) == plain
        return [r.steps for r in rounds if not r.prefill and r.expected_tok_s]

    ks = chosen()
    engine.loop.auto_seen.clear()  # the second run starts where the first did
    monkeypatch.setattr(AutoSteps, "continuation", lambda self, found, at: None)  # the drafts alone
    monkeypatch.setattr(AutoSteps, "passed", lambda self, found, at: None)  # (and no replay of other k)
    drafts_only = chosen()
    assert ks[0] <= 1 and drafts_only[0] <= 1
    assert sum(ks) > 1.3 * sum(drafts_only), (ks, drafts_only)


def test_ngram_auto_replays_every_fixed_k_round_for_round(engines, monkeypatch):
    """n-gram auto replays, from the lookup at every position, what each fixed k would have done
    on the run's output (replay.Replay): at every choice, for every k, the rounds it counts are
    those of a real run at that k -- the same tokens, round boundaries and widths. `specscope
    tune` replays a finished text the same way (replay.replay_text)."""
    from engines.speculative.replay import replay_text
    from engines.speculative.tuning import AutoSteps

    engine = engines["llama"]
    max_tokens = 100
    snapshots, runs = [], []
    choose = AutoSteps.choose

    def snapshotting(self):
        if self.replay is not None:
            snapshots.append((list(self.replay.rounds.tokens), [dict(w) for w in self.replay.rounds.widths]))
        runs[-1:] = [self]
        return choose(self)

    monkeypatch.setattr(AutoSteps, "choose", snapshotting)
    engine.loop.auto_seen.clear()
    request = Request(prompt=COPY, max_tokens=max_tokens, spec=SpecConfig("ngram", 3, auto=True))
    rounds = list(engine.generate(request))
    auto = tokens(rounds)
    engine.loop.auto_seen.clear()
    # the fixed runs' last rounds are cut to the tokens left: compare before them
    made, widths = next(s for s in reversed(snapshots) if max(s[0]) <= max_tokens - 2 * MAX_STEPS)
    assert min(made) >= max_tokens // 2  # the replay kept up with the output
    drafted = 0
    for k in range(1, MAX_STEPS + 1):
        fixed = list(engine.generate(Request(prompt=COPY, max_tokens=max_tokens, spec=SpecConfig("ngram", k))))
        assert tokens(fixed) == auto
        counted, seen = 0, Counter()
        for r in (r for r in fixed if not r.prefill):
            if counted == made[k]:
                break
            counted += len(r.tokens)
            seen[1 + r.proposed] += 1
        assert counted == made[k], (k, counted, made[k])  # a round boundary of the real run at k
        assert seen == Counter(widths[k]), (k, seen, widths[k])
        drafted += sum(n * (w - 1) for w, n in widths[k].items())
    assert drafted > 0  # the lookup found continuations: widths past 1 were compared
    # the run's replay last scored the output before its final round (no commit after it)
    prompt_ids = engine.prompt_ids(request)
    offline = replay_text(prompt_ids + auto[: len(auto) - len(rounds[-1].tokens)], len(prompt_ids) + 1, MAX_STEPS)
    assert (offline.tokens, offline.widths) == (runs[0].replay.rounds.tokens, runs[0].replay.rounds.widths)


def test_the_kept_round_costs_follow_the_load_across_requests(engines, monkeypatch):
    """The engine keeps auto's round costs across requests with the same drafter. The first
    request drafts 1, 2 and 3 a round; the second, whose rounds cost twice as much (another
    process started), drafts 1: once its rounds show the load, the widths only the first
    request measured are priced twice as dear too -- kept at their quiet price beside the dear
    narrow ones, deep drafts looked free (tests/engines/speculative/test_tuning.py). k is scripted here (the
    chooser's own picks are tested there); the costs are a model, not timings."""
    import itertools

    from engines.speculative.tuning import AutoSteps

    engine = engines["llama"]
    load, script = [1.0], [itertools.cycle([1, 2, 3])]
    record = AutoSteps.record
    monkeypatch.setattr(AutoSteps, "record", lambda self, proposed, accepted, verify_s=None, draft_s=None, *rest:
                        record(self, proposed, accepted, load[0] * flat(1 + proposed), 0.0, *rest))
    monkeypatch.setattr(AutoSteps, "choose", lambda self: next(script[0]))
    engine.loop.auto_seen.clear()
    spec = SpecConfig("ngram", 3, auto=True)
    try:
        list(engine.generate(Request(prompt=COPY, max_tokens=80, spec=spec)))
        [(costs, *_)] = engine.loop.auto_seen.values()
        quiet = dict(costs.seconds)
        assert {3, 4} <= set(quiet)
        load[0], script[0] = 2.0, itertools.repeat(1)
        list(engine.generate(Request(prompt=COPY, max_tokens=80, spec=spec)))
        assert {w: costs.seconds[w] for w in quiet} == pytest.approx({w: 2 * s for w, s in quiet.items()})
    finally:
        engine.loop.auto_seen.clear()
