"""The drafter trainer's learning rate: warm-up then constant, or with --decay falling linearly
to 0 by the run's end -- by step with --steps, by training time with --minutes."""

from pathlib import Path

import pytest

pytest.importorskip("mlx.core")

from engines.training.config import TrainConfig  # noqa: E402
from engines.training.optimiser import Rate  # noqa: E402
from engines.training.progress import share_done  # noqa: E402


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


def test_the_compiled_update_is_adams_and_follows_the_share_left():
    """The loop's update is compiled (optimiser.compiled_update); the share left is an input of it,
    not a constant traced in: with none left the weights stay, and every step equals an
    uncompiled Adam's."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    from engines.training.optimiser import compiled_update

    def made():
        mx.random.seed(0)
        model = nn.Linear(8, 4)
        rate = Rate(TrainConfig(out=Path("x"), warmup=2))
        opt = optim.Adam(learning_rate=rate, betas=[0.9, 0.95], bias_correction=True)
        opt.rate = rate
        opt.init(model.trainable_parameters())
        return model, opt

    def grads(model, i):
        x = mx.random.normal((16, 8), key=mx.random.key(i))
        return nn.value_and_grad(model, lambda x: (model(x) ** 2).mean())(x)[1]

    (compiled, copt), (plain, popt) = made(), made()
    update = compiled_update(compiled, copt)
    for i, left in enumerate([1.0, 0.5, 0.0, 0.25]):
        before = [p for _, p in tree_flatten(compiled.parameters())]
        copt.rate.left = popt.rate.left = left
        update(grads(compiled, i))
        popt.update(plain, grads(plain, i))
        mx.eval(compiled.parameters(), plain.parameters())
        after = [p for _, p in tree_flatten(compiled.parameters())]
        moved = max(mx.abs(a - b).max().item() for a, b in zip(after, before))
        assert (moved == 0) == (left == 0), (i, moved)
        for (_, a), (_, b) in zip(tree_flatten(compiled.parameters()), tree_flatten(plain.parameters())):
            assert mx.allclose(a, b, atol=1e-7).item(), i
