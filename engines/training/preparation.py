"""Preparing a drafter's training data: the target's answers to the prompts (kept, shipped or
written now) and the user's text, teacher-forced through the target into Features (data.py),
kept in OUT/features.safetensors so a resumed run does not redo them; with --minutes, as many
as fit in the preparation's share of the run (Clock)."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import mlx.core as mx

from engines.mlx_chat.drafter import TargetView
from engines.training import data as D
from engines.training.config import TrainConfig
from engines.training.progress import Clock, Progress, span

FORCE_BATCH = 4  # sequences per teacher-forced forward (data.features)
# batches teacher-forced whatever the budget: rows to hold out and to train on, and forcing_order's
# first two, so a run whose answering took the whole share still learns from the text as well
MIN_FORCED = 2
# of the preparation's share, what answering may take: teacher forcing a token costs under half
# what answering it does (docs/drafter.md, Data), so what was answered then fits
ANSWERING_SHARE = 2 / 3


# resources/prompts/: open chat, explain / how-to / compare over topics, and the kinds open chat
# asks (poems, stories, recipes, advice...); measured in docs/drafter.md, "How it is trained"
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
    clock's preparation share is spent (at least MIN_FORCED batches: one of each kind there is).
    Answers and text go in proportion to their counts (forcing_order), so a cut run learns from
    both; the answers in order, the greedy round first. Says how many and, once the speed is measured, how many fit."""
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
