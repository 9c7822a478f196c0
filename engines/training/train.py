"""Training a drafter (engines/mlx_chat/drafter.py) by self-distillation, in MLX, resumable.

    prepare    the target's own answers to the prompt sets + the user's text -> sequences;
               one teacher-forced target forward per batch -> Features (data.py), kept in
               OUT/features.safetensors so a resumed run does not redo them; with --minutes,
               as many as fit in its preparation share (Clock)
    init       the drafter (seeded), its vocabulary = the K most frequent labels; the soft
               labels, the target's top 128 draft tokens per position (teacher_top_k), once
    loop       a batch of sequences of about one length (length_groups; chosen by (seed, step)
               alone) -> the chained loss -> Adam; every `save_every` steps (and at the end,
               and on cancel) a checkpoint; every `eval_every` steps held-out acceptance by
               depth (on a few held-out sequences, counted in the run's minutes; at the end on
               all of them)
    publish    OUT/config.json + model.safetensors + card.json + README.md: a drafter that
               `--spec mtp --draft-model OUT` runs

The chained loss (training-time test, EAGLE-3, Li et al. 2025): depth 1 reads the target's
hidden state h_{t-1} and embeds token t; depth d reads the drafter's own depth d-1 output
instead, so the drafter learns from the states it will really be fed when it drafts several
tokens in a row. Every depth learns the target's distribution over the draft vocabulary at
its position (soft labels, EAGLE), depth d weighted 0.8^(d-1) (later depths matter only if the
earlier ones were accepted). The rest of EAGLE's recipe -- regressing the target's hidden state
and noise on the state read -- is left out: it measures no better here (docs/drafter.md, "How
it is trained"). The K/V a depth-d query reads stop at position t-d, where the chain's first
token sits -- exactly what the drafter sees in the chat engine (mtp.MTPProposer: fixed query
position, the target cache before the chain). Adam, a linear warm-up, then a rate that decays
linearly to 0 at the run's end (TrainConfig.decay). No row is computed for chains that start in
a prompt (depth_outputs' `first`): the loss counts none of them.

--minutes bounds the whole run (Clock): preparing the data takes at most TrainConfig.
prepare_share of it -- answering, then teacher forcing as many sequences as fit, measured as
it goes -- training takes what is left less what the final measure and the files are measured
to need. A run ends within its minutes plus about one training step or one batch of teacher
forcing, whichever it was doing, and the error of that estimate.

Resume: a checkpoint holds the drafter, Adam's state and the step; batches depend on
(seed, step) only and the initial weights on the seed, so a run killed and resumed ends with
the same weights as one that never stopped.
"""

from __future__ import annotations

import errno
import gzip
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from engines.types import EngineError
from engines.mlx_chat.drafter import Drafter, DrafterArgs, TargetView, default_feature_layers, write_config
from engines.training import data as D
from engines import cpu

EVAL_DEPTH = 5  # acceptance is reported for depths 1..5
FORCE_BATCH = 4  # sequences per teacher-forced forward (data.features)
MIN_FORCED = 1  # batches teacher-forced whatever the budget: rows to hold out and to train on
# of the preparation's share, what answering may take: teacher forcing a token costs under half
# what answering it does (docs/drafter.md, Data), so what was answered then fits
ANSWERING_SHARE = 2 / 3
# held-out sequences the progress's acceptance is measured on (the card's: all of them): few
# enough that measuring every eval_every steps costs a few percent of the run, which it counts
PROGRESS_HELD_OUT = 16
LENGTH_GROUP = 64  # sequences per group of about one length that a batch is drawn from (length_groups)
DEPTH_DECAY = 0.8


class CheckpointError(EngineError):
    """A checkpoint could not be written (disk full...): the previous one is kept."""


@dataclass
class TrainConfig:
    """One run's settings (`specscope drafter train`'s options and the few the command line leaves
    out). A default chosen by measurement names where the measurement is: docs/drafter.md's
    table "How it is trained" (each default against its alternative on SmolLM2) or docs/
    benchmarks.md's "A drafter trained here for SmolLM2"."""

    out: Path
    data_files: list[str] = field(default_factory=list)
    prompts_file: str | None = None  # None: the shipped prompt sets (SHIPPED_PROMPTS); "" = none
    answer_tokens: int = 200  # per generated answer
    # the first greedy, the others sampled at answer_temperature (drafter.md: four to each prompt)
    answers_per_prompt: int = 4
    answer_temperature: float = 0.8
    own_prompts: int = 0  # prompts the target writes itself (data.own_prompts); drafter.md: fewer accepted
    steps: int | None = None
    # the whole run's time: preparing the data, training, the final measure (Clock); a resumed
    # run counts what the runs before it spent
    minutes: float | None = None
    # the share of `minutes` preparing the data may take at most (the rest trains): our choice,
    # trading data for steps evenly, not a measurement
    prepare_share: float = 0.5
    seed: int = 0
    # chained depths trained: one draft a round is what pays on a CPU (benchmarks.md, A drafter
    # trained here), and a depth-1 step costs ~0.4 of a depth-3 one (drafter.md)
    depth: int = 1
    seq_len: int = 256
    batch: int = 4  # sequences per step
    learning_rate: float = 1e-3
    adam_beta2: float = 0.95  # bias-corrected, as EAGLE's AdamW (drafter.md: against mlx's uncorrected 0.999)
    decay: bool = True  # the rate falls linearly to 0 at the run's end (drafter.md: against constant)
    warmup: int = 20
    soft_labels: bool = True  # the target's distribution, not its greedy token alone (drafter.md)
    # soft labels as the target's k most likely draft tokens a position, computed once; 0: the
    # whole distribution every step (drafter.md: 128 against 32 and against the whole)
    teacher_k: int = 128
    # each position's loss weighted by the target's probability of its greedy token there: at
    # T=0 a draft is accepted when it is the target's argmax, which the drafter rarely hits where
    # the target itself is torn (our own trial; drafter.md: against every position alike)
    confidence_weighting: bool = True
    draft_vocab: int = 4096  # the most frequent labels (drafter.md: against 8192)
    # target layers read beside the final state (EAGLE-3's fused features); None: drafter.
    # default_feature_layers, []: the final state only (drafter.md: against the final state only)
    feature_layers: list[int] | None = None
    held_out: float = 0.1  # fraction of sequences kept for acceptance
    save_every: int = 50
    eval_every: int = 200  # each measure is PROGRESS_HELD_OUT sequences, counted in the run's time

    def record(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        return d

    @classmethod
    def from_record(cls, record: dict) -> "TrainConfig":
        """The settings a card recorded (`record`), less any this trainer no longer has."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


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


# -- the run -----------------------------------------------------------------------------------------


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


def checkpoint_state(out: Path) -> dict:
    ckpt = latest_checkpoint(out)
    return json.loads((ckpt / "state.json").read_text()) if ckpt is not None else {}



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


def timed_evaluate(drafter: Drafter, held: D.Features, batch: int, clock: Clock) -> list[float]:
    """evaluate, its time per sequence kept as the clock's estimate of the final measure's."""
    t = time.perf_counter()
    acceptance = evaluate(drafter, held, batch)
    clock.eval_row_s = (time.perf_counter() - t) / max(held.size, 1)
    return acceptance


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


# -- data ---------------------------------------------------------------------------------------------


# resources/prompts/: open chat, explain / how-to / compare over topics, and the kinds open chat
# asks (poems, stories, recipes, advice...); drafter.md: four answers to these 690 against 8 to 384
SHIPPED_PROMPTS = ("drafter_train.json", "drafter_topics.json", "drafter_kinds.json")


def shipped_answers_folder() -> Path:
    """resources/answers/: the embedded default's answers to the shipped prompts (data.shipped_answers)."""
    import resources

    return resources.path("answers")


def default_prompts_files() -> list[Path]:
    import resources

    return [resources.path("prompts", name) for name in SHIPPED_PROMPTS]


def prompt_set(config: TrainConfig) -> tuple[list, list[str]]:
    """The prompt files a run reads (the shipped sets unless --prompts) and their prompts."""
    files = default_prompts_files() if config.prompts_file is None else [config.prompts_file] if config.prompts_file else []
    return files, [p for f in files for p in D.load_prompts(f)]


def prepare(target: TargetView, tokenizer, target_path: str, config: TrainConfig, on_progress, should_stop,
            clock: Clock | None = None):
    """(Features, answers, sources): the target's answers to the prompts first (`answers` rows),
    then the text files' segments. From OUT/features.safetensors when the same target, data
    and settings made them before (a resumed run), else computed and kept; the answers are
    kept batch by batch in OUT/data/answers.json, so a run stopped while the target answers
    resumes where it stopped. With the clock's preparation share, answering stops at
    ANSWERING_SHARE of it and teacher forcing at the whole (teacher_force)."""
    clock = clock or Clock(config)
    texts = D.read_text_files(config.data_files)  # bad files fail now, before any work
    files, prompts = prompt_set(config)
    stamp = [target_path, _file_stamp(target_path)]
    out = Path(config.out)
    if config.own_prompts:
        prompts += written_prompts(target, tokenizer, stamp, config, on_progress, should_stop)
    rounds = config.answers_per_prompt if prompts else 0
    sources = {"prompts": [str(f) for f in files] or None, "own_prompts": config.own_prompts or None,
               "prompt_count": len(prompts),
               "answer_tokens": config.answer_tokens, "answers_per_prompt": rounds,
               "answer_temperature": config.answer_temperature if rounds > 1 else None,
               "files": [p for p, _ in texts]}
    answers_key = answers_cache_key(stamp, prompts, config)
    sampling = answer_sampling(config)
    key = D.fingerprint(answers_key, [t for _, t in texts], config.seq_len, *([rounds, *sampling] if rounds > 1 else []),
                        *([list(target.feature_layers)] if target.feature_layers else []))
    cached = D.load_features(out / "features.safetensors", key)
    if cached is not None:
        feats, answers, available = cached
        on_progress(Progress(0, config.steps, 0.0, None, clock.used(), None, "features",
                             f"the target's states over {feats.size} of {available or feats.size} sequences, "
                             f"teacher-forced before, read from {out}", headline=True))
    else:
        sequences, answers = answered(target, tokenizer, target_path, prompts, rounds, config, clock, on_progress,
                                      should_stop)
        sequences += D.text_segments(tokenizer, texts, config.seq_len)
        available = len(sequences)
        feats, answers = teacher_force(target, sequences, answers, config, clock, on_progress, should_stop)
        D.save_features(out / "features.safetensors", feats, key, answers, available)
    sources["answer_sequences"], sources["sequences_available"] = answers, available or feats.size
    feats.starts = answer_starts(tokenizer, (prompts * rounds)[:answers], config.seq_len, feats.size)
    return feats, answers, sources


def answered(target: TargetView, tokenizer, target_path: str, prompts: list[str], rounds: int, config: TrainConfig,
             clock: Clock, on_progress, should_stop) -> tuple[list[list[int]], int]:
    """The target's answers (prompt + answer ids, round-major: the greedy round first): kept
    ones, shipped ones, then the target writes the rest -- as many as ANSWERING_SHARE of the
    preparation allows -- kept batch by batch."""
    out = Path(config.out)
    answers_key = answers_cache_key([target_path, _file_stamp(target_path)], prompts, config)
    sampling = answer_sampling(config)
    answers_file = out / "data" / "answers.json"
    sequences = D.load_answers(answers_file, answers_key, sampling, greedy=len(prompts))[: len(prompts) * rounds]
    asked = len(prompts) * rounds
    if len(sequences) < asked and prompts:
        shipped = D.shipped_answers(shipped_answers_folder(), target_path, prompts, config.answer_tokens, config.seq_len,
                                    sampling, greedy=len(prompts))[:asked]
        if len(shipped) > len(sequences):
            sequences = shipped
            D.save_answers(answers_file, sequences, answers_key, sampling)
            on_progress(Progress(0, config.steps, 0.0, None, clock.used(), None, "answers",
                                 f"{len(shipped)} of the {asked} answers ship with Specscope", headline=True))
    if len(sequences) < asked:
        start, t0 = len(sequences), time.perf_counter()
        fits = f", as many as fit in {span(clock.preparing_left(ANSWERING_SHARE))}" \
            if clock.prepare_s is not None else ""
        on_progress(Progress(0, config.steps, 0.0, None, clock.used(), None, "answers",
                             f"the target writes {asked - start} of {asked} answers ({rounds} per prompt){fits}",
                             headline=True))

        written = [start]  # answers so far: the first batch is written whatever the clock says

        def kept(done: list[list[int]]) -> None:
            D.save_answers(answers_file, done, answers_key, sampling)
            n, elapsed = len(done), time.perf_counter() - t0
            written[0] = n
            on_progress(Progress(0, config.steps, 0.0, None, clock.used(), elapsed * (asked - n) / (n - start), "answers",
                                 f"the target wrote {n} of {asked} answers ({span(elapsed)})"))

        out_of_time = lambda: written[0] > start and clock.preparing_left(ANSWERING_SHARE) <= 0  # noqa: E731
        sequences = D.own_answers(target.model, tokenizer, prompts, config.answer_tokens, config.seq_len, rounds,
                                  config.answer_temperature, config.seed, done=sequences,
                                  should_stop=lambda: should_stop() or out_of_time(), on_batch=kept)
        if should_stop():
            raise KeyboardInterrupt  # the answers so far are kept; nothing else to resume yet
    return sequences, len(sequences)


def teacher_force(target: TargetView, sequences: list[list[int]], answers: int, config: TrainConfig, clock: Clock,
                  on_progress, should_stop) -> tuple[D.Features, int]:
    """(Features, answer rows): the target over the sequences (the first `answers` of them the
    target's answers, the rest text segments), FORCE_BATCH at a time, until all are forced or the
    clock's preparation share is spent (at least MIN_FORCED batches). Answers and text go in
    proportion to their counts (forcing_order), so a cut run learns from both; the answers in
    order, the greedy round first. Says how many and, once the speed is measured, how many fit."""
    if not sequences:
        raise D.DataError("no training text: the data gave no sequence of 8 tokens or more")
    total = sum(len(s) for s in sequences)
    fits = f", as many as fit in {span(clock.preparing_left())}" if clock.prepare_s is not None else ""
    on_progress(Progress(0, config.steps, 0.0, None, clock.used(), None, "features",
                         f"teacher forcing the target over {len(sequences)} sequences ({total:,} tokens){fits}",
                         headline=True))
    parts: tuple[list, list] = ([], [])  # answers', text's
    rows = tokens = 0
    t0 = time.perf_counter()
    said = False
    for i, batch in enumerate(forcing_order(answers, len(sequences) - answers, FORCE_BATCH)):
        if should_stop():
            raise KeyboardInterrupt
        if i >= MIN_FORCED and clock.preparing_left() <= 0:
            break
        parts[batch[0] >= answers].append(D.features(target, [sequences[r] for r in batch], config.seq_len,
                                                     batch=FORCE_BATCH))
        rows, tokens = rows + len(batch), tokens + sum(len(sequences[r]) for r in batch)
        elapsed = time.perf_counter() - t0
        rate = tokens / max(elapsed, 1e-9)
        if not said and elapsed >= min(5.0, (clock.prepare_s or 20.0) / 4) and rows < len(sequences):
            said = True
            left = clock.preparing_left()
            fit = f"; about {min(len(sequences), rows + int(left * rate * len(sequences) / total))} fit" \
                if clock.prepare_s is not None and left < (total - tokens) / rate else ""
            on_progress(Progress(0, config.steps, 0.0, None, clock.used(), None, "features",
                                 f"{rate:,.0f} tokens/s here: all {len(sequences)} sequences would take "
                                 f"{span(total / rate)}{fit}", headline=True))
        if rows % 100 < FORCE_BATCH or rows == len(sequences):
            eta_s = min((total - tokens) / rate, max(clock.preparing_left(), 0))
            on_progress(Progress(0, config.steps, 0.0, None, clock.used(), eta_s, "features",
                                 f"teacher-forced {rows} of {len(sequences)} sequences ({span(elapsed)})"))
    kept = parts[0] + parts[1]
    feats = D.Features(**{k: mx.concatenate([getattr(f, k) for f in kept]) for k in D.Features.STORED})
    if rows < len(sequences):
        on_progress(Progress(0, config.steps, 0.0, None, clock.used(), None, "features",
                             f"teacher-forced {rows} of {len(sequences)} sequences ({tokens:,} of {total:,} tokens) "
                             f"in the {span(clock.prepare_s)} for preparing", headline=True))
    return feats, sum(f.size for f in parts[0])


def span(seconds: float) -> str:
    """`2.4 s`, `7.5 min`: a time as the progress says it."""
    seconds = max(seconds, 0.0)
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def forcing_order(answers: int, text: int, batch: int) -> list[list[int]]:
    """Batches of row numbers, answers (0..answers-1) and text segments (answers..) each in order,
    taken in proportion to their counts: any first batches hold about the same share of each."""
    order, a, t = [], 0, 0
    while a < answers or t < text:
        if t >= text or (a < answers and a * text <= t * answers):
            order.append(list(range(a, min(a + batch, answers))))
            a = min(a + batch, answers)
        else:
            order.append(list(range(answers + t, answers + min(t + batch, text))))
            t = min(t + batch, text)
    return order


def answers_cache_key(stamp: list, prompts: list[str], config: TrainConfig) -> str:
    """The kept answers' key (OUT/data/answers.json): the target file as installed, the prompts,
    the answers' length; not how many per prompt (asking more extends the kept ones)."""
    return D.fingerprint(*stamp, prompts, config.answer_tokens, config.seq_len)


def answer_sampling(config: TrainConfig) -> list:
    """What the answers past the first (greedy) round depend on."""
    return [config.answer_temperature, config.seed]


def ship_answers(target_path: str, config: TrainConfig, folder: Path) -> Path:
    """Write the answers a run of `config` kept (OUT/data/answers.json) into `folder` as a
    shipped answers file (data.shipped_answers): a later run on the same model, prompts and
    settings, on any machine, then skips answering. Only whole answer sets are shipped."""
    _, prompts = prompt_set(config)
    key = answers_cache_key([target_path, _file_stamp(target_path)], prompts, config)
    sampling = answer_sampling(config)
    sequences = D.load_answers(Path(config.out) / "data" / "answers.json", key, sampling, greedy=len(prompts))
    if len(sequences) != len(prompts) * config.answers_per_prompt:  # (prompts the target wrote: another key, none)
        raise D.DataError(f"{config.out} holds {len(sequences)} answers of this model to these prompts, "
                          f"not the {len(prompts) * config.answers_per_prompt} asked")
    model = D.model_files(target_path)
    digest = D.content_digest(model)
    record = D.answers_record(digest, sum(f.stat().st_size for f in model), prompts, config.answer_tokens,
                              config.seq_len, sampling, sequences)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest[:16]}-{record['prompts']}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(record, separators=(",", ":")).encode(), mtime=0))
    return path


def written_prompts(target: TargetView, tokenizer, stamp: list, config: TrainConfig, on_progress,
                    should_stop) -> list[str]:
    """The target's own prompts (data.own_prompts), kept batch by batch in OUT/data/
    own_prompts.json: a stopped run resumes where it stopped, a resumed one reuses them."""
    path = Path(config.out) / "data" / "own_prompts.json"
    key = D.fingerprint(*stamp, config.seed)  # not the count: asking more extends the kept ones
    done, attempts = D.load_own_prompts(path, key)
    if len(done) >= config.own_prompts:
        return done[: config.own_prompts]
    t0 = time.perf_counter()
    start = len(done)
    on_progress(Progress(0, config.steps, 0.0, None, 0.0, None, "prompts",
                         f"the target writes {config.own_prompts - start} prompts of its own"))

    def written(prompts: list[str], attempts: int) -> None:
        D.save_own_prompts(path, prompts, attempts, key)
        n, elapsed = len(prompts), time.perf_counter() - t0
        eta_s = elapsed * (config.own_prompts - n) / (n - start) if n > start else None
        on_progress(Progress(0, config.steps, 0.0, None, elapsed, eta_s, "prompts",
                             f"the target wrote {n} of {config.own_prompts} prompts ({elapsed / 60:.1f} min)"))

    prompts = D.own_prompts(target.model, tokenizer, config.own_prompts, config.seed, done=done, attempts=attempts,
                            should_stop=should_stop, on_batch=written)
    if should_stop():
        raise KeyboardInterrupt  # the prompts so far are kept
    return prompts


def _file_stamp(path: str) -> list:
    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    return [(f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in files]


def answer_starts(tokenizer, prompts: list[str], seq_len: int, rows: int) -> mx.array:
    """[rows] int32, each row's first answer position: the prompt's length for the target's
    answers (rows 0..len(prompts)-1, as data.own_answers cut them; `prompts` repeated once per
    round of answers, as many as are rows), 0 for text segments.
    Recomputed from the prompts, so the features file needs no field for it."""
    starts = [len(D.chat_ids(tokenizer, p)[: seq_len - 8]) for p in prompts]
    return mx.array((starts + [0] * rows)[:rows], dtype=mx.int32)


def split(n: int, answers: int, prompts: int, held_out: float, seed: int) -> tuple[list[int], list[int]]:
    """Train and held-out rows (at least one of each when n >= 2), fixed by the seed. The
    held-out rows are drawn from the target's greedy answers (rows 0..prompts-1) when there are
    any: acceptance is then measured on what the target itself writes at T=0, as in chat, and
    every other answer to a held-out prompt (row r < answers answers prompt r % prompts) is
    left out of training, so held-out prompts stay unseen; text files are all for training."""
    pool = min(prompts, answers) if answers >= 2 else n
    order = np.random.default_rng([seed, 7]).permutation(pool).tolist()
    k = min(max(1, round(pool * held_out)), pool - 1) if pool >= 2 else 0
    held = sorted(order[:k]) or order
    unseen = set(held)
    if answers >= 2:
        unseen |= {r for r in range(pool, answers) if r % pool in unseen}
    return sorted(set(range(n)) - unseen) or order, held


def length_groups(rows: list[int], lengths: np.ndarray, size: int = LENGTH_GROUP) -> list[list[int]]:
    """The rows sorted by length and cut into groups of `size` (a short last group joins the one
    before), which batch_rows draws a batch from: its rows then have about one length, and the
    batch's rectangle little padding: the shorter answers end early, and a batch drawn at random
    computes their padding (HF Trainer's `group_by_length` does the same; docs/benchmarks.md, A
    drafter trained here: what a step costs)."""
    order = sorted(rows, key=lambda r: (int(lengths[r]), r))
    groups = [order[i:i + size] for i in range(0, len(order), size)]
    if len(groups) > 1 and len(groups[-1]) < size // 2:
        tail = groups.pop()
        groups[-1] += tail
    return groups


def batch_rows(groups: list[list[int]], batch: int, seed: int, step: int) -> list[int]:
    """The rows of batch `step`: a group drawn with probability by its size, then `batch` of its
    rows, so every row is as likely as with one group. A function of (seed, step) only -- what
    makes resume exact."""
    rng = np.random.default_rng([seed, step])
    sizes = np.array([len(g) for g in groups], dtype=float)
    group = groups[int(rng.choice(len(groups), p=sizes / sizes.sum()))]
    return rng.choice(group, size=batch, replace=len(group) < batch).tolist()


def answer_rows_per_batch(feats: D.Features, rows: list[int], batch: int) -> float:
    """The positions whose depth-1 draft a batch's loss counts, on average over the training rows
    (a row's answer positions from max(start, 1)): chained_loss's fixed divisor, so that a batch of
    short answers weighs each position as much as a batch of long ones (length_groups makes both)."""
    lengths = np.array(feats.lengths)[rows]
    starts = np.array(feats.starts)[rows] if feats.starts is not None else np.zeros(len(rows), int)
    return batch * float(np.mean(lengths - np.maximum(starts, 1)))


def draft_vocabulary(feats: D.Features, size: int) -> mx.array:
    """The `size` most frequent labels (ties: lower id first), sorted by id."""
    labels = np.array(feats.labels)
    valid = np.arange(labels.shape[1])[None, :] < np.array(feats.lengths)[:, None]
    counts = np.bincount(labels[valid], minlength=size)
    top = np.argsort(-counts, kind="stable")[:size]
    return mx.array(np.sort(top).astype(np.int32))


# -- the model and its loss ------------------------------------------------------------------------------


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


def share_done(config: TrainConfig, step: int, train_s: float, limit_s: float | None = None) -> float:
    """The share of the run's training done, by step or by time (`limit_s` as in `done`)."""
    shares = []
    if config.steps is not None:
        shares.append(step / config.steps)
    limit_s = limit_s if limit_s is not None or config.minutes is None else 60 * config.minutes
    if limit_s is not None:
        shares.append(train_s / limit_s if limit_s > 0 else 1.0)
    return min(1.0, max(shares, default=0.0))


def init_or_resume(target: TargetView, feats: D.Features, config: TrainConfig, out: Path):
    mx.random.seed(config.seed)
    drafter = Drafter(DrafterArgs.for_target(target, config.draft_vocab))
    drafter.vocab_ids = draft_vocabulary(feats, drafter.args.draft_vocab)
    drafter.freeze(keys=["vocab_ids"])
    rate = Rate(config)
    betas = [0.9, config.adam_beta2]
    opt = optim.Adam(learning_rate=rate, betas=betas, bias_correction=True)
    opt.rate = rate  # the loop sets rate.left
    state = {"step": 0, "train_s": 0.0}
    ckpt = latest_checkpoint(out)
    if ckpt is not None:
        drafter.load_weights(str(ckpt / "model.safetensors"))
        opt.state = tree_unflatten(list(mx.load(str(ckpt / "optimizer.safetensors")).items()))
        state = json.loads((ckpt / "state.json").read_text())
    else:
        opt.init(drafter.trainable_parameters())  # before compiled_update reads it
    drafter.attach(target)
    mx.eval(drafter.parameters())
    return drafter, opt, state


def teacher_top_k(drafter: Drafter, feats: D.Features, k: int, batch: int) -> tuple[mx.array, mx.array]:
    """The soft labels of every position, once: the target's k most likely tokens of the
    drafter's vocabulary ([N, L, k] indices into it: uint16, uint32 past 65,536 tokens) and their
    probabilities under the target's distribution over that vocabulary, renormalised over the k
    (float16). The drafter's
    vocabulary is fixed before this (draft_vocabulary) and the target's head is frozen, so these
    are the labels chained_loss would compute each step, less the tail past the k-th token.
    Keeping a teacher's top-k probabilities is the usual way to distil from a cache; Anshumann et
    al. 2025 ("Sparse Logit Sampling") show it biased (the tail's mass goes to the top k) and
    sample the labels instead; the k here is measured (TrainConfig.teacher_k)."""
    ids, probs = [], []
    d = drafter.args.hidden_size
    index_type = mx.uint16 if drafter.args.draft_vocab <= 1 << 16 else mx.uint32
    for i in range(0, feats.size, batch):
        final = feats.hidden[i:i + batch, :, -d:].astype(mx.float32)
        logits = drafter.sub_logits(final)
        top = mx.argpartition(-logits, kth=k - 1, axis=-1)[..., :k]
        p = mx.softmax(mx.take_along_axis(logits, top, axis=-1), axis=-1)  # renormalised over the k
        ids.append(top.astype(index_type))
        probs.append(p.astype(mx.float16))
        mx.eval(ids[-1], probs[-1])
    return mx.concatenate(ids), mx.concatenate(probs)


def depth_outputs(drafter: Drafter, batch: D.Features, depth: int, first: int = 0):
    """The chain over a batch, all positions at once: yields (d, states [B, L-d-first, D]) where
    row j is position t = first + j + d, whose label is batch.labels[:, t]. `first`: the
    first chain start computed, less one -- a row's query reads only its own input and the
    target's fixed K/V, so rows no loss counts (chains that start in the prompts) can be left
    out without changing any other row."""
    L = batch.tokens.shape[1]
    emb = drafter.target.embed(batch.tokens)
    h = batch.hidden[:, first:]  # depth 0: the target's own states, by position
    for d in range(1, depth + 1):
        if L - d - first < 1:
            break
        # position t = i + d (i = first + j) embeds token t and reads h at t-1 (row j of the
        # previous depth, which starts one position earlier); it sees K/V at positions <= t - d = i,
        # and its query sits at the chain's first position t - d + 1 = i + 1.
        x = drafter.inputs(emb[:, first + d:], h[:, : L - d - first])
        mask = mx.arange(L)[None, :] <= mx.arange(first, L - d)[:, None]
        h = drafter.layer(x, batch.keys, batch.values, mask, first + 1)
        yield d, h
        # next depth's row j (position first + j + d + 1) reads position first + j + d: this depth's row j


def chained_loss(drafter: Drafter, batch: D.Features, config: TrainConfig, per_batch: float | None = None) -> mx.array:
    """The depths' losses, depth d weighted DEPTH_DECAY^(d-1), padding left out. At position t
    the target's state h_t gives, through the target's head, the distribution the drafter should
    draft from (EAGLE's classification target: soft labels, which carry the target's whole
    ranking per token where a hard label carries one id -- more signal from the same
    teacher-forced data; DistillSpec, Zhou et al. 2024, also distils the target's distribution).
    Hard labels outside the draft vocabulary are left out, and so are chains that start in a
    prompt (batch.starts): the drafter only ever drafts answers. Each depth's sum
    is divided by `per_batch` (training: answer_rows_per_batch, the same for every batch) or, when
    None, by the rows it counts."""
    batch = batch.columns(int(batch.lengths.max()))  # padding past the longest row: no loss reads it
    L = batch.tokens.shape[1]
    real = mx.arange(L)[None, :] < batch.lengths[:, None]
    # the first row computed: no chain starts in a prompt (below), so depth_outputs leaves
    # the rows before the earliest answer out
    first = max(0, int(batch.starts.min()) - 1) if batch.starts is not None else 0
    final = batch.hidden[..., -drafter.args.hidden_size:]  # the final-norm state (the features end with it)
    kept = config.soft_labels and batch.teacher_ids is not None  # the top-k soft labels, computed once
    if config.soft_labels and not kept:
        teacher = mx.softmax(drafter.sub_logits(final), axis=-1)  # over the draft vocabulary, renormalised
    elif not config.soft_labels:
        lookup = mx.full((drafter.args.vocab_size,), -1, dtype=mx.int32)
        lookup = lookup.at[drafter.vocab_ids].add(mx.arange(drafter.vocab_ids.size, dtype=mx.int32) + 1)
        sub = lookup[batch.labels]
    total, weights = mx.array(0.0), 0.0
    for d, h in depth_outputs(drafter, batch, config.depth, first):
        at = slice(first + d, None)  # the positions of this depth's rows
        logits = drafter.sub_logits(h)
        real_d = real[:, at]
        if batch.starts is not None:  # only chains that start in an answer, as in chat (see above)
            # position t's depth-d draft belongs to the chain that starts at t - d + 1
            real_d = real_d & ((mx.arange(first + d, L) - d + 1)[None, :] >= batch.starts[:, None])
        if kept:
            keep = real_d
            loss = kept_labels_loss(logits, batch.teacher_ids[:, at], batch.teacher_probs[:, at])
            if config.confidence_weighting:
                loss = loss * batch.teacher_probs[:, at].max(-1)
        elif config.soft_labels:
            keep = real_d
            loss = -(teacher[:, at] * nn.log_softmax(logits, axis=-1)).sum(-1)
            if config.confidence_weighting:
                loss = loss * teacher[:, at].max(-1)
        else:
            keep = real_d & (sub[:, at] >= 0)
            loss = nn.losses.cross_entropy(logits, mx.maximum(sub[:, at], 0), reduction="none")
        w = DEPTH_DECAY ** (d - 1)
        total = total + w * (loss * keep).sum() / (per_batch or mx.maximum(keep.sum(), 1))
        weights += w
    return total / weights


def kept_labels_loss(logits: mx.array, ids: mx.array, probs: mx.array) -> mx.array:
    """Per row, the cross-entropy to the kept soft labels: -sum_k p_k log softmax(logits)_{ids_k}
    = logsumexp(logits) - sum_k p_k logits_{ids_k} (the p_k sum to 1). On the CPU through numpy
    (numpy_ops.kept_labels_loss), the same function with its own gradient."""
    if mx.default_device() == mx.cpu and cpu.enabled():  # (sub_logits are float32)
        from engines.cpu import numpy_ops

        return numpy_ops.kept_labels_loss(logits, ids, probs)
    picked = mx.take_along_axis(logits, ids, axis=-1)
    return mx.logsumexp(logits, axis=-1) - (probs * picked).sum(-1)


def evaluate(drafter: Drafter, held: D.Features, batch: int) -> list[float]:
    """Held-out acceptance by depth 1..EVAL_DEPTH, teacher-forced: the share of chain starts
    whose drafts 1..d all equal the target's greedy tokens (on the target's own answers this
    is what the chat engine's rounds accept at T=0). Chains start at a row's first answer
    position (held.starts) or later, as in chat, where the drafter never drafts the
    prompt (counting the prompt's positions would flatter it: every answer opens with the same
    system prompt, which the drafter learns by heart)."""
    hits = np.zeros(EVAL_DEPTH)
    starts = 0
    for i in range(0, held.size, batch):
        b = held.rows(list(range(i, min(i + batch, held.size))))
        L = b.tokens.shape[1]
        lengths = np.array(b.lengths)
        labels = np.array(b.labels)
        first = np.array(b.starts) if b.starts is not None else np.zeros(b.size, int)
        # correct[d][n, t]: the depth-d draft at position t equals the target's token
        correct = {}
        for d, h in depth_outputs(drafter, b, EVAL_DEPTH):
            ids = np.array(drafter.vocab_ids[mx.argmax(drafter.sub_logits(h), axis=-1)])
            correct[d] = np.zeros((b.size, L), bool)
            correct[d][:, d:] = ids == labels[:, d:]
        for n in range(b.size):
            # a chain starts at p (its first token) and its depth-d draft sits at p + d - 1;
            # starts from 1 (depth 1 reads h_{p-1}) while the chain stays inside the row
            for p in range(max(1, int(first[n])), int(lengths[n]) - EVAL_DEPTH + 1):
                starts += 1
                ok = True
                for d in range(1, EVAL_DEPTH + 1):
                    ok = ok and d in correct and bool(correct[d][n, p + d - 1])
                    hits[d - 1] += ok
    return [float(x) for x in hits / max(starts, 1)]


# -- files --------------------------------------------------------------------------------------------


def latest_checkpoint(out: Path) -> Path | None:
    """OUT/checkpoint, or OUT/checkpoint.old if a run was killed between the two renames."""
    for name in ("checkpoint", "checkpoint.old"):
        if (out / name / "state.json").is_file():
            return out / name
    return None


def save_checkpoint(out: Path, drafter: Drafter, opt, step: int, train_s: float, loss, acceptance,
                    prepare_s: float = 0.0) -> None:
    """Write OUT/checkpoint.partial whole, then swap it in: a kill or a full disk at any
    moment leaves the previous checkpoint readable."""
    partial, current, old = out / "checkpoint.partial", out / "checkpoint", out / "checkpoint.old"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        drafter.save_weights(str(partial / "model.safetensors"))
        mx.save_safetensors(str(partial / "optimizer.safetensors"), dict(tree_flatten(opt.state)))
        state = {"step": step, "train_s": train_s, "prepare_s": prepare_s, "loss": loss, "acceptance": acceptance}
        (partial / "state.json").write_text(json.dumps(state))
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        kept = latest_checkpoint(out)
        kept_step = json.loads((kept / "state.json").read_text())["step"] if kept else None
        what = "disk full" if e.errno == errno.ENOSPC else f"cannot write ({e.strerror or e})"
        raise CheckpointError(f"{what} at the step {step} checkpoint in {out}; "
                              + (f"the step {kept_step} checkpoint is kept" if kept else "no earlier checkpoint")) from None
    if current.exists():
        shutil.rmtree(old, ignore_errors=True)
        current.rename(old)
    partial.rename(current)
    shutil.rmtree(old, ignore_errors=True)


def model_card(target, target_path, config, sources, feats, held, step, train_s, prepare_s, acceptance, finished) -> dict:
    lengths = np.array(feats.lengths)
    return {
        "target": {"path": str(target_path), "model_type": target.model_type, "hidden_size": target.hidden_size},
        "data": {**sources, "sequences": feats.size, "tokens": int(lengths.sum()),
                 "held_out_sequences": len(held), "held_out_tokens": int(lengths[held].sum()),
                 "note": "teacher-forced on this machine; nothing left it"},
        "training": {"steps": step, "finished": finished, "train_minutes": round(train_s / 60, 2),
                     "prepare_minutes": round(prepare_s / 60, 2), "config": config.record()},
        "acceptance_by_depth": [round(a, 4) for a in acceptance],
        "acceptance_note": "held-out, teacher-forced, answer positions only: share of chain starts whose drafts 1..d all equal the target's greedy tokens",
        "method": "one decoder layer over [target final hidden state; next token embedding], the target's K/V and "
                  "LM head; self-distillation on the target's " + ("distribution (soft labels)" if config.soft_labels
                  else "greedy tokens (hard labels)") + "; chained depths (EAGLE, EAGLE-3, "
                  "Gemma 4 assistant); see engines/training/train.py",
    }


def publish(out: Path, drafter: Drafter, card: dict) -> None:
    """The drafter directory a chat run loads: config.json, model.safetensors, card.json,
    README.md -- each file written whole and renamed into place."""
    tmp = out / "model.partial.safetensors"
    drafter.save_weights(str(tmp))
    tmp.replace(out / "model.safetensors")
    drafter.args.extra = {"card": "card.json"}
    write_config(out, drafter.args)
    for name, text in (("card.json", json.dumps(card, indent=1)), ("README.md", card_markdown(card))):
        (out / (name + ".partial")).write_text(text)
        (out / (name + ".partial")).replace(out / name)


def card_markdown(card: dict) -> str:
    acc = ", ".join(f"d{i + 1} {a:.0%}" for i, a in enumerate(card["acceptance_by_depth"]))
    t, d, tr = card["target"], card["data"], card["training"]
    return (f"# Drafter for {Path(t['path']).name}\n\n"
            f"Trained by Specscope on this machine (`specscope drafter train`).\n\n"
            f"- target: `{t['path']}` ({t['model_type']})\n"
            f"- data: {d['prompt_count']} prompts answered by the target ({d['prompts']}), files {d['files']}; "
            f"{d['tokens']} tokens in {d['sequences']} sequences, {d['held_out_tokens']} held out\n"
            f"- steps: {tr['steps']} ({'finished' if tr['finished'] else 'stopped early, resumable'}), "
            f"{tr['train_minutes']} min training + {tr['prepare_minutes']} min preparing data\n"
            f"- held-out acceptance by depth (teacher-forced): {acc}\n\n"
            f"Method: {card['method']}.\n")
