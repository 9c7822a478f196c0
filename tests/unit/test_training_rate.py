"""The drafter trainer's learning rate: warm-up then constant, or with --decay falling linearly
to 0 by the run's end -- by step with --steps, by training time with --minutes."""

from pathlib import Path

import pytest

pytest.importorskip("mlx.core")

from engines.training.train import Rate, TrainConfig, share_done  # noqa: E402


def test_the_rate_warms_up_then_stays_or_falls_with_the_share_left():
    config = TrainConfig(out=Path("x"), learning_rate=1e-3, warmup=20, steps=100)
    rate = Rate(config)
    assert float(rate(0)) == pytest.approx(1e-3 / 20)
    assert float(rate(50)) == pytest.approx(1e-3)
    rate.left = 1.0 - share_done(config, 75, 0.0)
    assert float(rate(75)) == pytest.approx(0.25e-3)


def test_the_share_done_counts_steps_or_minutes_whichever_is_further():
    assert share_done(TrainConfig(out=Path("x"), steps=200), 50, 999.0) == 0.25
    assert share_done(TrainConfig(out=Path("x"), minutes=10), 50, 150.0) == 0.25
    assert share_done(TrainConfig(out=Path("x"), steps=100, minutes=10), 50, 450.0) == 0.75
    assert share_done(TrainConfig(out=Path("x"), steps=100), 150, 0.0) == 1.0
