"""`--steps auto` (engines/speculative/tuning.py): the chooser's pick is the best k on
synthetic machines whose latency and acceptance curves are known; it learns a machine from a
run's own rounds; a profile from another machine or model, or a corrupt one, is refused in one
line and the run measures itself instead."""

from __future__ import annotations

import json

import pytest

from engines.speculative.schedule import MAX_STEPS, DraftSchedule
from engines.speculative.tuning import AutoSteps, Profile, ProfileError, best_k, expected_tokens, machine_id, rates
from engines.types import SpecConfig


def brute_force(latency, draft_s, acc, max_k):
    def rate(k):
        e, reach = 1.0, 1.0
        for i in range(k):
            reach *= acc[i]
            e += reach
        return e / (latency(1 + k) + k * draft_s)

    return max(range(max_k + 1), key=rate)


MACHINES = {
    "gpu, flat to 8": lambda w: 0.020,
    "cpu, flat then linear": lambda w: 0.08 if w <= 2 else 0.08 + 0.015 * (w - 2),
    "dear verify": lambda w: 0.05 * w,
}
ACCEPTANCE = {
    "copying": [0.95] * MAX_STEPS,
    "falling": [0.8, 0.6, 0.4, 0.3, 0.2, 0.1, 0.1],
    "poor": [0.1] * MAX_STEPS,
}


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("acceptance", ACCEPTANCE)
@pytest.mark.parametrize("draft_s", [0.0, 0.01])
def test_the_pick_is_the_best_k(machine, acceptance, draft_s):
    latency, acc = MACHINES[machine], ACCEPTANCE[acceptance]
    assert best_k(latency, draft_s, acc, MAX_STEPS) == brute_force(latency, draft_s, acc, MAX_STEPS)


def test_the_extremes():
    assert best_k(MACHINES["gpu, flat to 8"], 0.0, ACCEPTANCE["copying"], MAX_STEPS) == MAX_STEPS
    assert best_k(MACHINES["dear verify"], 0.0, ACCEPTANCE["poor"], MAX_STEPS) == 0  # break-even: plain
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1.75)


def test_auto_learns_the_machine_from_its_own_rounds():
    """No profile: nothing is chosen until two widths were seen; then the pick is the best k
    for the costs and acceptance the rounds showed."""
    latency, acc = MACHINES["cpu, flat then linear"], ACCEPTANCE["falling"]
    auto = AutoSteps(MAX_STEPS)
    assert auto.choose() is None
    import random

    rng = random.Random(0)
    for r in range(4000):
        k = r % (MAX_STEPS + 1)
        accepted = 0
        while accepted < k and rng.random() < acc[accepted]:
            accepted += 1
        auto.record(k, accepted, latency(1 + k), 0.0)
    assert auto.choose() == brute_force(latency, 0.0, acc, MAX_STEPS)
    assert auto.last_rates == pytest.approx(rates(latency, 0.0, auto.acceptance(), MAX_STEPS))


def profile(tmp_path, **over) -> str:
    p = Profile(machine=machine_id(), model="/m", method="ngram", drafter="",
                target_s={w: MACHINES["dear verify"](w) for w in range(1, 9)}, draft_s=0.0,
                acceptance=ACCEPTANCE["poor"])
    for k, v in over.items():
        setattr(p, k, v)
    path = tmp_path / "profile.json"
    p.save(path)
    return str(path)


def test_a_profile_drives_the_schedule_from_the_first_round(tmp_path):
    spec = SpecConfig("ngram", 5, auto=True, profile=profile(tmp_path))
    schedule = DraftSchedule.of(spec, "/m")
    assert schedule.note is None and schedule.next_steps(100) == 0  # poor drafts on a dear verify: plain


@pytest.mark.parametrize("change,said", [
    ({"machine": "Darwin arm64 | Apple M9 | 99 cores"}, "another machine"),
    ({"model": "/other"}, "for /other"),
])
def test_a_profile_from_elsewhere_is_refused_in_one_line(tmp_path, change, said):
    spec = SpecConfig("ngram", 5, auto=True, profile=profile(tmp_path, **change))
    schedule = DraftSchedule.of(spec, "/m")
    assert said in schedule.note and "\n" not in schedule.note and "specscope tune" in schedule.note
    assert schedule.auto.profile is None and schedule.next_steps(100) == 5  # measured in the run


def test_a_corrupt_profile_is_refused_in_one_line(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text('{"machine": ')
    with pytest.raises(ProfileError) as e:
        Profile.load(path, "/m", "ngram")
    assert "unreadable" in str(e.value)
    path.write_text(json.dumps({"nothing": 1}))
    with pytest.raises(ProfileError):
        Profile.load(path, "/m", "ngram")


def test_a_profile_keeps_its_shape_at_the_level_the_run_pays(tmp_path):
    """The run's rounds cost twice the profile's forwards (a loaded machine, the loop's own
    work): the curve doubles, its shape -- and so the pick -- stays the profile's."""
    p = Profile.load(profile(tmp_path), "/m", "ngram")
    auto = AutoSteps(MAX_STEPS, profile=p)
    for _ in range(3):
        auto.record(1, 1, 2 * p.target_s[2], 0.0)
    for w in range(1, 9):
        assert auto.latency().at(w) == pytest.approx(2 * p.target_s[w])


def test_break_even_is_where_drafting_pays_exactly_plain():
    from engines.speculative.tuning import break_even

    latency = MACHINES["cpu, flat then linear"]
    for k in (1, 3, 7):
        a = break_even(latency, 0.0, k)
        assert expected_tokens([a], k) / latency(1 + k) == pytest.approx(1 / latency(1), rel=1e-6)
    assert break_even(MACHINES["gpu, flat to 8"], 0.0, 3) == pytest.approx(0.0, abs=1e-9)  # free verify: any a pays
    assert break_even(lambda w: 0.05 * w ** 2, 0.0, 3) is None  # a verify dearer than k + 1 tokens: never pays
