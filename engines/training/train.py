"""Training a drafter (engines/mlx_chat/drafter.py) by self-distillation, in MLX, resumable.

    prepare    the target's own answers to the prompt sets + the user's text -> sequences;
               one teacher-forced target forward per batch -> Features (preparation.py)
    init       the drafter (seeded), its vocabulary = the K most frequent labels; the soft
               labels, the target's top 128 draft tokens per position (losses.teacher_top_k), once
    loop       a batch of sequences of about one length (batches.py; chosen by (seed, step)
               alone) -> the chained loss (losses.py) -> Adam (optimiser.py); every `save_every`
               steps (and at the end, and on cancel) a checkpoint; every `eval_every` steps
               held-out acceptance by depth (evaluation.py: on a few held-out sequences, counted
               in the run's minutes; at the end on all of them)
    publish    OUT/config.json + model.safetensors + card.json + README.md (checkpoints.py): a
               drafter that `--spec mtp --draft-model OUT` runs

--minutes bounds the whole run (progress.Clock): preparing the data takes at most TrainConfig.
prepare_share of it -- answering, then teacher forcing as many sequences as fit, measured as
it goes -- training takes what is left less what the final measure and the files are measured
to need. A run ends within its minutes plus about one training step or one batch of teacher
forcing, whichever it was doing, and the error of that estimate.

Resume: a checkpoint holds the drafter, Adam's state and the step; batches depend on
(seed, step) only and the initial weights on the seed, so a run killed and resumed ends with
the same weights as one that never stopped.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engines import cpu
from engines.mlx_chat.drafter import Drafter, DrafterArgs, TargetView, default_feature_layers
from engines.training import data as D
from engines.training.batches import answer_rows_per_batch, batch_rows, length_groups, split
from engines.training.checkpoints import (checkpoint_state, latest_checkpoint, load_checkpoint, model_card, publish,
                                          save_checkpoint)
from engines.training.config import TrainConfig
from engines.training.evaluation import evaluate, timed_evaluate
from engines.training.losses import chained_loss, teacher_top_k
from engines.training.optimiser import adam, compiled_update
from engines.training.preparation import prepare
from engines.training.progress import Clock, OnProgress, Progress, Result, done, eta, plan, share_done

# held-out sequences the progress's acceptance is measured on (the card's: all of them): few
# enough that measuring every eval_every steps costs a few percent of the run, which it counts
PROGRESS_HELD_OUT = 16


def train(target_model, tokenizer, target_path: str, config: TrainConfig,
          on_progress: OnProgress = lambda p: None, should_stop: Callable[[], bool] = lambda: False) -> Result:
    # unsupported architecture or layers: one line naming what is supported
    if config.feature_layers is None:  # the card records the layers chosen
        config = replace(config, feature_layers=list(default_feature_layers(len(target_model.model.layers))))
    target = TargetView.of(target_model, config.feature_layers)
    out = Path(config.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    before = checkpoint_state(out)
    clock = Clock(config, before.get("prepare_s", 0.0) + before.get("train_s", 0.0))
    on_progress(plan(config, clock))
    feats, answers, sources = prepare(target, tokenizer, target_path, config, on_progress, should_stop, clock)
    train_rows, held = split(feats.size, answers, sources["prompt_count"], config.held_out, config.seed)

    drafter, opt, state = init_or_resume(target, feats, config, out)
    if mx.default_device() == mx.cpu and cpu.enabled():  # MLX's CPU exp is scalar (engines/cpu/numpy_ops.py)
        from engines.cpu import numpy_ops

        drafter.silu, drafter.attention = numpy_ops.silu, numpy_ops.attention
    if config.soft_labels and config.teacher_k:
        k = min(config.teacher_k, drafter.args.draft_vocab)
        on_progress(Progress(state["step"], config.steps, 0.0, None, clock.used(), None, "features",
                             f"the target's {k} most likely draft tokens at each of {feats.size} sequences' positions"))
        feats.teacher_ids, feats.teacher_probs = teacher_top_k(drafter, feats, k, config.batch)
    if clock.total_s is not None:  # what the final measure will cost, per held-out sequence
        timed_evaluate(drafter, feats.rows(held[:config.batch]), config.batch, clock)
    prepare_s = clock.used() - clock.before_s  # this run's, the soft labels and that measure included
    groups = length_groups(train_rows, np.array(feats.lengths))
    per_batch = answer_rows_per_batch(feats, train_rows, config.batch)
    loss_and_grad = nn.value_and_grad(drafter, lambda b: chained_loss(drafter, b, config, per_batch))
    update = compiled_update(drafter, opt)
    acceptance = state.get("acceptance") or []
    loss_avg = state.get("loss")
    step, train_s = state["step"], state["train_s"]
    prepared_s = state.get("prepare_s", 0.0) + prepare_s  # over resumes, as train_s
    save = partial(save_checkpoint, out, drafter, opt, prepare_s=prepared_s)
    limit = clock.training_limit(train_s, len(held))
    while not done(config, step, train_s, limit):
        if should_stop():
            break
        t = time.perf_counter()
        batch = feats.rows(batch_rows(groups, config.batch, config.seed, step))
        if config.decay:
            opt.rate.left = 1.0 - share_done(config, step, train_s, limit)
        loss, grads = loss_and_grad(batch)
        update(grads)
        mx.eval(loss, drafter.parameters(), opt.state)
        step += 1
        loss_avg = float(loss) if loss_avg is None else 0.9 * loss_avg + 0.1 * float(loss)
        if step % config.eval_every == 0 and not done(config, step, train_s + time.perf_counter() - t, limit):
            acceptance = timed_evaluate(drafter, feats.rows(held[:PROGRESS_HELD_OUT]), config.batch, clock)
        train_s += time.perf_counter() - t  # the progress's measure counted: --minutes is the user's wait
        limit = clock.training_limit(train_s, len(held))
        if done(config, step, train_s, limit):
            acceptance = evaluate(drafter, feats.rows(held), config.batch)  # the card's: the whole held-out set
        if step % config.save_every == 0:
            t = time.perf_counter()
            save(step, train_s, loss_avg, acceptance)
            clock.save_s = time.perf_counter() - t
        on_progress(Progress(step, config.steps, loss_avg, acceptance or None, clock.used(),
                             eta(config, step, train_s, limit)))
    finished = done(config, step, train_s, limit) and step > 0  # no step: not a drafter yet, resumable
    if not acceptance and step:
        acceptance = evaluate(drafter, feats.rows(held), config.batch)
    save(step, train_s, loss_avg, acceptance)
    card = model_card(target, target_path, config, sources, feats, held, step, train_s, prepared_s, acceptance, finished)
    publish(out, drafter, card)
    on_progress(Progress(step, config.steps, loss_avg or 0.0, acceptance or None, clock.used(), 0.0, "done"))
    return Result(out, step, finished, acceptance, train_s, prepare_s, int(np.array(feats.lengths).sum()),
                  clock.used() - clock.before_s)


def draft_vocabulary(feats: D.Features, size: int) -> mx.array:
    """The `size` most frequent labels (ties: lower id first), sorted by id."""
    labels = np.array(feats.labels)
    valid = np.arange(labels.shape[1])[None, :] < np.array(feats.lengths)[:, None]
    counts = np.bincount(labels[valid], minlength=size)
    top = np.argsort(-counts, kind="stable")[:size]
    return mx.array(np.sort(top).astype(np.int32))


def init_or_resume(target: TargetView, feats: D.Features, config: TrainConfig, out: Path):
    mx.random.seed(config.seed)
    drafter = Drafter(DrafterArgs.for_target(target, config.draft_vocab))
    drafter.vocab_ids = draft_vocabulary(feats, drafter.args.draft_vocab)
    drafter.freeze(keys=["vocab_ids"])
    opt = adam(config)  # the loop sets opt.rate.left
    state = {"step": 0, "train_s": 0.0}
    ckpt = latest_checkpoint(out)
    if ckpt is not None:
        state = load_checkpoint(ckpt, drafter, opt)
    else:
        opt.init(drafter.trainable_parameters())  # before compiled_update reads it
    drafter.attach(target)
    mx.eval(drafter.parameters())
    return drafter, opt, state
