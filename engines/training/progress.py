"""What a training run reports as it goes (Progress, Result) and its time against --minutes
(Clock, done, share_done, eta)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engines.training.config import TrainConfig


@dataclass
class Progress:
    step: int
    steps: int | None
    loss: float
    acceptance: list[float] | None  # held-out, by depth 1..EVAL_DEPTH (None until measured)
    elapsed_s: float
    eta_s: float | None
    phase: str = "train"  # "prompts" | "answers" | "features" | "train" | "done"
    note: str = ""
    headline: bool = False  # the note says what the run will do (a line of its own), not how far it is


@dataclass
class Result:
    out: Path
    step: int
    finished: bool  # reached --steps / --minutes (False: cancelled, resumable)
    acceptance: list[float]
    train_s: float
    prepare_s: float  # this run's
    tokens: int
    run_s: float = 0.0  # this run's whole time, from train() to the files written


OnProgress = Callable[[Progress], None]


class Clock:
    """The run's time against TrainConfig.minutes, which bounds the whole run: preparing the
    data (at most prepare_share of it), training, and the final measure and files, whose cost
    (`reserve`) is measured as the run goes. `before_s`: what earlier runs of the same output
    spent (their checkpoint). Without minutes, nothing runs out."""

    def __init__(self, config: TrainConfig, before_s: float = 0.0):
        self.total_s = None if config.minutes is None else 60 * config.minutes
        self.prepare_s = None if self.total_s is None else config.prepare_share * self.total_s
        self.before_s = before_s
        self.start = time.perf_counter()
        self.eval_row_s = 0.0  # the final measure's cost per held-out sequence
        self.save_s = 0.5  # a checkpoint's, until one is timed

    def used(self) -> float:
        return self.before_s + time.perf_counter() - self.start

    def preparing_left(self, share: float = 1.0) -> float:
        return float("inf") if self.prepare_s is None else share * self.prepare_s - self.used()

    def training_limit(self, train_s: float, held: int) -> float | None:
        """The training time (train_s, counted over resumes) at which training stops, leaving
        the final measure over `held` sequences and the files their time, with a margin."""
        if self.total_s is None:
            return None
        reserve = 1.5 * self.eval_row_s * held + 2 * self.save_s
        return train_s + self.total_s - self.used() - reserve


def done(config: TrainConfig, step: int, train_s: float, limit_s: float | None = None) -> bool:
    """`limit_s`: the training time the run's clock allows (Clock.training_limit); default all of
    --minutes."""
    if config.steps is not None and step >= config.steps:
        return True
    limit_s = limit_s if limit_s is not None or config.minutes is None else 60 * config.minutes
    return limit_s is not None and train_s >= limit_s


def eta(config: TrainConfig, step: int, train_s: float, limit_s: float | None = None) -> float | None:
    left = []
    if config.steps is not None and step:
        left.append((config.steps - step) * train_s / step)
    limit_s = limit_s if limit_s is not None or config.minutes is None else 60 * config.minutes
    if limit_s is not None:
        left.append(limit_s - train_s)
    return max(0.0, min(left)) if left else None


def share_done(config: TrainConfig, step: int, train_s: float, limit_s: float | None = None) -> float:
    """The share of the run's training done, by step or by time (`limit_s` as in `done`)."""
    shares = []
    if config.steps is not None:
        shares.append(step / config.steps)
    limit_s = limit_s if limit_s is not None or config.minutes is None else 60 * config.minutes
    if limit_s is not None:
        shares.append(train_s / limit_s if limit_s > 0 else 1.0)
    return min(1.0, max(shares, default=0.0))


def span(seconds: float) -> str:
    """`2.4 s`, `7.5 min`: a time as the progress says it."""
    seconds = max(seconds, 0.0)
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def plan(config: TrainConfig, clock: Clock) -> Progress:
    """What the run will do, said before it starts."""
    if clock.total_s is None:
        what = f"{config.steps} training steps, after preparing the data (--minutes would bound both)"
    else:
        what = (f"at most {config.minutes:g} min in all: preparing the data up to {span(clock.prepare_s)} "
                f"(as much of it as fits), then training, then the final measure")
        if clock.before_s:
            what += f"; {span(clock.before_s)} of it spent by the runs before"
    return Progress(0, config.steps, 0.0, None, clock.before_s, None, "features", what, headline=True)
