"""The drafter's optimiser: Adam, a linear warm-up, then a rate that decays linearly to 0 at the
run's end (Rate, TrainConfig.decay); its update compiled and, on a CPU, spread over two streams."""

from __future__ import annotations

from functools import partial
from typing import Callable

import mlx.core as mx
import mlx.optimizers as optim

from engines.mlx_chat.drafter import Drafter
from engines.training.config import TrainConfig


class Rate:
    """The learning rate by step: a linear warm-up, then constant -- times `left`, the share of
    the run still to go, which the loop lowers step by step when config.decay is set. `left` is
    kept as an array in `state`, an input of the compiled update (compiled_update): a float
    would be traced into it as a constant."""

    def __init__(self, config: TrainConfig):
        lr, warmup = config.learning_rate, config.warmup
        self.schedule = optim.join_schedules([optim.linear_schedule(lr / warmup, lr, warmup), lambda _: lr], [warmup])
        self.state = {"left": mx.array(1.0)}

    @property
    def left(self) -> float:
        return self.state["left"].item()

    @left.setter
    def left(self, share: float) -> None:
        self.state["left"] = mx.array(share, dtype=mx.float32)

    def __call__(self, step):
        return self.schedule(step) * self.state["left"]


def compiled_update(drafter: Drafter, opt: optim.Optimizer) -> Callable[[dict], None]:
    """Adam's update of the drafter from its gradients, compiled: MLX runs each element-wise op
    of an uncompiled update as its own pass over the ~5M parameters (docs/benchmarks.md, A drafter
    trained here: what a step costs). The optimizer's state must exist first (init_or_resume)."""
    state = [drafter.state, opt.state, opt.rate.state]
    if mx.default_device() == mx.cpu:
        spread_over_two_streams(opt)

    @partial(mx.compile, inputs=state, outputs=state)
    def update(grads: dict) -> None:
        opt.update(drafter, grads)

    return update


def spread_over_two_streams(opt: optim.Optimizer) -> None:
    """Each parameter's update on one of two CPU streams, each to the less loaded so far:
    MLX runs a CPU stream's work on its own thread, and an update's element-wise work on one thread
    leaves the other core idle. The gradient made contiguous first: a Linear weight's comes out of
    the backward pass transposed, which sends the compiled update down its strided path. Same
    operations, same values (docs/benchmarks.md, A drafter trained here: what a step costs)."""
    streams = (mx.new_stream(mx.cpu), mx.new_stream(mx.cpu))
    single = opt.apply_single
    load = [0, 0]

    def apply_single(gradient: mx.array, parameter: mx.array, state: dict):
        i = load.index(min(load))
        load[i] += gradient.size
        with mx.stream(streams[i]):
            return single(mx.contiguous(gradient), parameter, state)

    opt.apply_single = apply_single


def adam(config: TrainConfig) -> optim.Adam:
    """Adam, bias-corrected at betas (0.9, config.adam_beta2), at the rate Rate gives; the loop
    sets `opt.rate.left`."""
    rate = Rate(config)
    betas = [0.9, config.adam_beta2]
    opt = optim.Adam(learning_rate=rate, betas=betas, bias_correction=True)
    opt.rate = rate
    return opt
