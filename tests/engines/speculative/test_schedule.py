import pytest

from engines.speculative.schedule import (
    MAX_STEPS, PRESETS, AdaptiveDepth, DraftSchedule, SkipStreak, check_steps, preset_for_steps,
)


def test_presets_follow_the_reference_block_sizes():
    # B counts the target token, so a block proposes B - 1 drafts
    assert {n: (p.block_size, p.steps) for n, p in PRESETS.items()} == {
        "throughput": (2, 1), "lift": (3, 2), "balanced": (3, 2), "quality": (4, 3),
    }
    assert all(p.max_steps <= MAX_STEPS for p in PRESETS.values())


def test_preset_and_step_slider_stay_in_sync():
    assert preset_for_steps(1) == "throughput"
    assert preset_for_steps(2, current="balanced") == "balanced"
    assert preset_for_steps(2, current="lift") == "lift"
    assert preset_for_steps(3, current="lift") == "quality"
    assert preset_for_steps(0) is None and preset_for_steps(6) is None


def test_steps_range():
    assert check_steps(0) == 0 and check_steps(7) == 7
    for bad in (-1, 8):
        with pytest.raises(ValueError):
            check_steps(bad)


def test_adaptive_depth_moves_up_and_down_within_bounds():
    c = AdaptiveDepth(steps=3, min_steps=2, max_steps=5)
    seen = []
    for _ in range(20):
        seen.append(c.update(proposed=c.steps, accepted=c.steps))
    assert max(seen) == 5 and c.steps == 5  # climbs to the bound, never past it
    for _ in range(30):
        c.update(proposed=c.steps, accepted=0)
    assert c.steps == 2  # falls to the lower bound, never below


def test_adaptive_depth_holds_on_mixed_acceptance():
    c = AdaptiveDepth(steps=3)
    for _ in range(50):
        c.update(proposed=4, accepted=2)
    assert c.steps == 3


def skips_when_nothing_is_accepted(threshold: int, rounds: int = 6) -> list[bool]:
    """The skip decision of each round when every drafted round accepts nothing."""
    s = SkipStreak(threshold=threshold)
    decisions = []
    for _ in range(rounds):
        decisions.append(s.should_skip())
        if not decisions[-1]:
            s.record(proposed=3, accepted=0)
    return decisions


def test_skip_streak_skips_one_round_after_threshold_zero_accepts():
    assert skips_when_nothing_is_accepted(2) == [False, False, True, False, False, True]


def test_skip_streak_threshold_one_does_not_skip_forever():
    assert skips_when_nothing_is_accepted(1) == [False, True, False, True, False, True]


def test_skip_streak_resets_on_any_accept_and_off_by_default():
    s = SkipStreak(threshold=2)
    s.record(3, 0)
    s.record(3, 1)
    s.record(3, 0)
    assert not s.should_skip()
    off = SkipStreak()
    for _ in range(10):
        off.record(3, 0)
    assert not off.should_skip()


def test_schedule_never_exceeds_max_tokens_and_zero_is_plain():
    s = DraftSchedule(steps=5)
    assert s.next_steps(remaining=100) == 5
    assert s.next_steps(remaining=3) == 2  # 2 drafts + the target's token = 3
    assert s.next_steps(remaining=1) == 0
    assert DraftSchedule(steps=0).next_steps(100) == 0


def test_schedule_disable_is_graceful_degradation():
    s = DraftSchedule(steps=3, adaptive=True)
    s.disable()
    assert s.next_steps(100) == 0


def test_schedule_adaptive_follows_acceptance():
    s = DraftSchedule(steps=2, adaptive=True, min_steps=1, max_steps=4)
    for _ in range(20):
        k = s.next_steps(100)
        s.record(k, k)
    assert s.next_steps(100) == 4
