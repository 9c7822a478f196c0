"""What a drafter learns from: token sequences, and the target's own state over them.

Sequences come from two places, and nothing leaves the machine:
  - the target's own answers to a prompt set (the default sets ship in resources/prompts/):
    self-distillation on the target's own outputs, as Medusa-2 (Cai et al. 2024, sec. 3.2.2)
    does when no training set matches the model; one greedy answer per prompt and, by default,
    three sampled ones (more of the target's own text from the same prompts); generated in
    batches with mlx-lm's batch_generate -- or, for the embedded default and the shipped
    prompts, read from the answers that ship with Specscope (`shipped_answers`);
  - the user's text files, cut into segments of `seq_len` tokens.

Teacher forcing (`features`) runs the target once over each padded batch of sequences: that
one forward gives, for every position, the final-norm hidden state (the drafter's input), the
K/V of the layer the drafter reads, and the label -- the target's own greedy next token (what
acceptance at T=0 measures, and the hard label of training without soft labels; the soft
label, the target's distribution, comes from the final state through its head at training
time; DistillSpec, Zhou et al. 2024, finds the target's own outputs the data that matters).
No generation is needed for text files, so it is fast.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlx.core as mx

from engines.types import EngineError
from engines.mlx_chat.drafter import TargetView


class DataError(EngineError):
    """An unusable data file: one line, naming it."""


@dataclass
class Features:
    """The teacher-forced target state over N sequences of (padded) length L."""

    tokens: mx.array  # [N, L] int32
    lengths: mx.array  # [N] int32: real tokens per row (the rest is padding)
    hidden: mx.array  # [N, L, F] the target's features: final-norm state (last D), after any tapped layers'
    labels: mx.array  # [N, L] int32: the target's greedy token after position t
    keys: mx.array  # [N, kv_heads, L, head_dim] of the layer the drafter reads
    values: mx.array
    # [N] int32: each row's first answer position (0 for a text segment). Not stored with the
    # features: preparation.prepare recomputes it from the prompts (answer_starts).
    starts: mx.array | None = None
    # the soft labels kept once per run (losses.teacher_top_k), or None: [N, L, k] the target's
    # k most likely tokens at each position, as indices into the drafter's vocabulary, and
    # their probabilities renormalised over those k (float16)
    teacher_ids: mx.array | None = None
    teacher_probs: mx.array | None = None

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def rows(self, index) -> "Features":
        """Those rows, the states in float32 (they are stored in float16, see `features`)."""
        idx = mx.array(index, dtype=mx.int32)
        f32 = lambda a: a[idx].astype(mx.float32)
        pick = lambda a, dtype: None if a is None else a[idx].astype(dtype)
        return Features(self.tokens[idx], self.lengths[idx], f32(self.hidden), self.labels[idx],
                        f32(self.keys), f32(self.values), pick(self.starts, mx.int32),
                        pick(self.teacher_ids, mx.int32), pick(self.teacher_probs, mx.float32))

    def columns(self, stop: int) -> "Features":
        """Positions 0..stop-1 of every row."""
        if stop >= self.tokens.shape[1]:
            return self
        cut = lambda a: None if a is None else a[:, :stop]
        return Features(self.tokens[:, :stop], self.lengths, self.hidden[:, :stop], self.labels[:, :stop],
                        self.keys[:, :, :stop], self.values[:, :, :stop], self.starts,
                        cut(self.teacher_ids), cut(self.teacher_probs))

    STORED = ("tokens", "lengths", "hidden", "labels", "keys", "values")  # what save_features keeps

    def arrays(self) -> dict[str, mx.array]:
        return {k: getattr(self, k) for k in self.STORED}


def read_text_files(paths: list[str]) -> list[tuple[str, str]]:
    """(path, text) of each file; an empty or unreadable one is a DataError (one line)."""
    out = []
    for path in paths:
        p = Path(path).expanduser()
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read data file {path}: {getattr(e, 'strerror', None) or e}") from None
        if not text.strip():
            raise DataError(f"data file {path} is empty")
        out.append((str(p), text))
    return out


def text_segments(tokenizer, texts: list[tuple[str, str]], seq_len: int) -> list[list[int]]:
    """Each file's tokens cut into segments of seq_len (the last one kept if >= 8 tokens)."""
    segments = []
    for _, text in texts:
        ids = list(tokenizer.encode(text))
        segments += [ids[i:i + seq_len] for i in range(0, len(ids), seq_len) if len(ids[i:i + seq_len]) >= 8]
    return segments


def load_prompts(path: str | Path) -> list[str]:
    data = json.loads(Path(path).read_text())
    return [p if isinstance(p, str) else p["prompt"] for p in (data["prompts"] if isinstance(data, dict) else data)]


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt as the chat engine sends it (chat template when the tokenizer has one)."""
    if getattr(tokenizer, "has_chat_template", False):
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True))
    return list(tokenizer.encode(prompt))


def query_prefix(tokenizer) -> list[int] | None:
    """The chat template up to where a user's message begins (system turn included, if the
    template adds one), or None when the tokenizer has no chat template."""
    if not getattr(tokenizer, "has_chat_template", False):
        return None
    marker = "\u2063MARKER\u2063"  # text no template writes itself
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    if marker not in text:
        return None
    return list(tokenizer.encode(text[: text.index(marker)], add_special_tokens=False))


def own_prompts(model, tokenizer, count: int, seed: int = 0, temperature: float = 1.0, max_tokens: int = 64,
                batch: int = 32, done: list[str] | None = None, attempts: int = 0,
                should_stop: Callable[[], bool] = lambda: False,
                on_batch: Callable[[list[str], int], None] = lambda written, attempts: None) -> list[str]:
    """`count` prompts the target writes itself: the chat template up to the user's turn, and
    the target samples what a user would say (Magpie, Xu et al. 2024: an aligned model prompted
    with only its pre-query template writes diverse user queries). The drafter then learns
    from the target's answers to many more distinct prompts than any shipped set holds, in the
    target's own notion of what users ask (on SmolLM2 they measure below the shipped prompts:
    docs/drafter.md, How it is trained). Kept: a finished turn
    (the target ended it) of 12..400 characters, not a repeat. A batch is seeded by (seed, the
    samples drawn before it): a run stopped after `done` prompts and `attempts` samples goes on
    with what one that never stopped would have written; on_batch(prompts, attempts) after
    each batch, for the caller to keep."""
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    prefix = query_prefix(tokenizer)
    if prefix is None:
        raise DataError("the target has no chat template: it cannot write prompts of its own (use --prompts or --data)")
    out = list(done or [])
    seen = set(out)
    sampler = make_sampler(temp=temperature)
    limit = attempts + 4 * count + 4 * batch  # a target that never ends its turn: give up
    while len(out) < count and attempts < limit:
        if should_stop():
            return out
        mx.random.seed(seed * 1_000_003 + 7919 + attempts)
        answer = batch_generate(model, tokenizer, [prefix] * batch, max_tokens=max_tokens, return_token_ids=True,
                                sampler=sampler)
        attempts += batch
        for ids in answer.token_ids:  # the turn's end token is not in ids: a full-length one was cut
            text = tokenizer.decode(list(ids)).strip()
            if len(ids) >= max_tokens or not 12 <= len(text) <= 400 or text in seen:
                continue
            seen.add(text)
            out.append(text)
        on_batch(out[:count], attempts)
    return out[:count]


def own_answers(model, tokenizer, prompts: list[str], max_tokens: int, seq_len: int, rounds: int = 1,
                temperature: float = 0.8, seed: int = 0, batch: int = 32, done: list[list[int]] | None = None,
                should_stop: Callable[[], bool] = lambda: False,
                on_batch: Callable[[list[list[int]]], None] = lambda answered: None) -> list[list[int]]:
    """prompt ids + the target's answer (cut at seq_len), `rounds` times over the prompts: the
    first round greedy (what chat at T=0 writes, and what acceptance is measured on), each
    further round sampled at `temperature` -- another answer to the same prompt from the
    target's own distribution, so more of its own text per prompt (the labels stay the
    target's greedy tokens: teacher forcing computes them). Row r answers prompt r % len(prompts).
    `done` holds the first rows, answered by an earlier, stopped run; on_batch(rows so far)
    after each batch (the caller keeps them, so a stop loses at most one batch). 32 at a time:
    on a 2-core CPU batch_generate's tokens/s rise up to 32 rows and fall past it. A sampled batch is seeded by (seed, its first row), so a resumed run writes
    the same rows as one that never stopped."""
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    out = list(done or [])
    n = len(prompts)
    for r in range(rounds):
        sampler = None if r == 0 else make_sampler(temp=temperature)
        for i in range(0, n, batch):
            first = r * n + i
            if first < len(out):
                continue
            if should_stop():
                return out
            ids = [chat_ids(tokenizer, p)[: seq_len - 8] for p in prompts[i:i + batch]]
            mx.random.seed(seed * 1_000_003 + first)
            answer = batch_generate(model, tokenizer, ids, max_tokens=max_tokens, return_token_ids=True, sampler=sampler)
            for prompt_ids, answer_ids in zip(ids, answer.token_ids):
                out.append((prompt_ids + list(answer_ids))[:seq_len])
            on_batch(out)
    return out


def features(target: TargetView, sequences: list[list[int]], seq_len: int, batch: int = 4,
             should_stop: Callable[[], bool] = lambda: False,
             on_batch: Callable[[int], None] = lambda done: None) -> Features:
    """Teacher-force the target over the sequences (right-padded to seq_len, `batch` at a time:
    4 x 256 tokens is the fastest shape on a 2-core CPU; longer rows or bigger batches are
    slower). Hidden states and K/V are kept in float16: half the memory, and EAGLE's own training adds
    noise of U(-0.1, 0.1) to these states, far above float16's rounding."""
    from mlx_lm.models.cache import make_prompt_cache

    if not sequences:
        raise DataError("no training text: the data gave no sequence of 8 tokens or more")
    parts: dict[str, list[mx.array]] = {k: [] for k in ("tokens", "lengths", "hidden", "labels", "keys", "values")}
    for i in range(0, len(sequences), batch):
        if should_stop():
            break
        rows = sequences[i:i + batch]
        tokens = mx.array([r + [0] * (seq_len - len(r)) for r in rows], dtype=mx.int32)
        cache = make_prompt_cache(target.model)
        logits, hidden = target.forward(tokens, cache)
        keys, values = cache[target.kv_layer].keys, cache[target.kv_layer].values  # full attention: position j at j
        parts["tokens"].append(tokens)
        parts["lengths"].append(mx.array([len(r) for r in rows], dtype=mx.int32))
        parts["hidden"].append(hidden.astype(mx.float16))
        parts["labels"].append(mx.argmax(logits, axis=-1).astype(mx.int32))
        parts["keys"].append(keys[:, :, :seq_len].astype(mx.float16))
        parts["values"].append(values[:, :, :seq_len].astype(mx.float16))
        mx.eval([v[-1] for v in parts.values()])
        on_batch(i + len(rows))
    return Features(**{k: mx.concatenate(v) for k, v in parts.items()})


def fingerprint(*parts) -> str:
    """What the features depend on (target file, data, settings): a cache key."""
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def write_json(path: Path, data: dict) -> None:
    """Written whole or not at all (a run killed mid-write keeps the last file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def save_answers(path: Path, sequences: list[list[int]], key: str, sampling: list) -> None:
    """The target's answers so far (a stopped run resumes from them), written whole; `sampling`
    (temperature, seed) is what the rows past the greedy round were sampled with."""
    write_json(path, {"fingerprint": key, "sampling": sampling, "sequences": sequences})


def save_own_prompts(path: Path, prompts: list[str], attempts: int, key: str) -> None:
    """The prompts the target wrote so far and the samples drawn for them (own_prompts resumes)."""
    write_json(path, {"fingerprint": key, "prompts": prompts, "attempts": attempts})


def load_own_prompts(path: Path, key: str) -> tuple[list[str], int]:
    """The kept prompts and samples drawn for this key, or none."""
    try:
        kept = json.loads(path.read_text())
        return (kept["prompts"], int(kept["attempts"])) if kept.get("fingerprint") == key else ([], 0)
    except (OSError, ValueError, KeyError, TypeError):
        return [], 0


def model_files(path: str | Path) -> list[Path]:
    """What a model's answers depend on: the file (GGUF), or a folder's files but its README."""
    p = Path(path)
    return [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file() and f.suffix != ".md")


def content_digest(files: list[Path]) -> str:
    """sha256 over the files' names and bytes: the same model wherever it is installed (the
    answers' cache key has the path and mtime in it; shipped answers cannot)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def answers_record(digest: str, model_bytes: int, prompts: list[str], answer_tokens: int, seq_len: int,
                   sampling: list, sequences: list[list[int]]) -> dict:
    """A shipped answers file: the target's answers to `prompts`, round-major (row r * len(prompts)
    + i answers prompt i), as own_answers writes them, and what they depend on."""
    return {"model_sha256": digest, "model_bytes": model_bytes, "prompts": fingerprint(prompts),
            "answer_tokens": answer_tokens, "seq_len": seq_len, "sampling": sampling, "sequences": sequences}


def shipped_answers(folder: Path, model_path: str | Path, prompts: list[str], answer_tokens: int, seq_len: int,
                    sampling: list, greedy: int) -> list[list[int]]:
    """The answers shipped in `folder` (*.json.gz, `answers_record`) for this model and these
    prompts and settings, or none: every row when they were sampled as asked, else the greedy
    round only (as `load_answers`). Why ship them: answering costs a first run on the embedded
    default more than twice what teacher forcing does (docs/drafter.md, Data), for the same text
    on every machine; the labels are still the target's own, from teacher forcing here. The model is
    hashed only when a shipped file names its size."""
    files = model_files(model_path)
    size = sum(f.stat().st_size for f in files)
    digest = None
    for path in sorted(folder.glob("*.json.gz")) if folder.is_dir() else []:
        try:
            record = json.loads(gzip.decompress(path.read_bytes()))
        except (OSError, ValueError):
            continue
        if record.get("model_bytes") != size:
            continue
        digest = digest or content_digest(files)
        if (record.get("model_sha256"), record.get("prompts"), record.get("answer_tokens"), record.get("seq_len")) \
                != (digest, fingerprint(prompts), answer_tokens, seq_len):
            continue
        rows = record["sequences"]
        return rows if record.get("sampling") == sampling else rows[:greedy]
    return []


def load_answers(path: Path, key: str, sampling: list, greedy: int) -> list[list[int]]:
    """The kept answers for this key; only the first `greedy` rows (the greedy round) when the
    rest were sampled otherwise -- a run asking more answers per prompt reuses the greedy ones."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if data.get("fingerprint") != key:
        return []
    return data["sequences"] if data.get("sampling") == sampling else data["sequences"][:greedy]


def save_features(path: Path, f: Features, key: str, answers: int, available: int = 0) -> None:
    """The features, how many of their first rows are the target's answers (the rest: text),
    and of how many sequences the data held they are (a run short of time forces fewer)."""
    tmp = path.with_suffix(".partial.safetensors")
    meta = {"fingerprint": key, "answers": str(answers), "available": str(available or f.size)}
    mx.save_safetensors(str(tmp), f.arrays(), metadata=meta)
    tmp.replace(path)


def load_features(path: Path, key: str) -> tuple[Features, int, int] | None:
    """(features, answer rows, sequences the data held) for this key, or None."""
    if not path.is_file():
        return None
    arrays, meta = mx.load(str(path), return_metadata=True)
    if meta.get("fingerprint") != key:
        return None
    return Features(**arrays), int(meta.get("answers", 0)), int(meta.get("available", 0))
