"""A tiny Gemma 4 target that copies where its context repeats and writes fresh text where
it does not -- what composed drafting is for, and what the random target of checkpoints.py
cannot show: its outputs neither copy their prompt nor follow any law an assistant could
learn well (n-gram lookup accepts ~2-6% of its drafts on any prompt; bench/composed.py).

The law it is trained on, over the word tokens (w6..w511) of a chat prompt and its answer:
the next word is the one that followed the current word's last earlier occurrence (an
induction head's copy), or, when the current word has not occurred before, its successor
in one fixed cycle through all 506 words. A prompt that repeats a phrase is then copied on
and on; a prompt of distinct words is continued along the cycle (which n-gram lookup cannot
predict) until the walk meets a word of the prompt and copies from there -- and the law is
learned only in part (`accuracy`), so some of those answers fall into loops of their own.
Which answers copy is measured where they are used (bench/composed.py), not assumed.

Trained with torch on the HF checkpoint build_target writes (its files, its config), 3,000
steps: ~6 minutes of one core here, once; kept in a cache directory keyed by BUILDER_VERSION
and the settings, like trained.py's assistant. Used by bench/composed.py (no test: too slow
to build for the quick suite)."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from pathlib import Path

from tests.engines.mlx_chat.gemma4.checkpoints import DENSE_TARGET, SPECIALS, VOCAB, TargetSpec, build_target

BUILDER_VERSION = 1  # bump when the law or the training below changes
FIRST_WORD = len(SPECIALS)
STEPS = 3000
BATCH = 32
ANSWER = 48  # answer words per training sequence (the bench generates 40)


def cycle(seed: int = 0) -> dict[int, int]:
    """The successor of each word: one cycle through all of them, in a random order."""
    words = list(range(FIRST_WORD, VOCAB))
    random.Random(seed).shuffle(words)
    return {w: words[(i + 1) % len(words)] for i, w in enumerate(words)}


def answer(prompt: list[int], successor: dict[int, int], n: int) -> list[int]:
    """The law's n answer words after the prompt's words."""
    seq, last = list(prompt), {}
    for i, w in enumerate(seq[:-1]):
        last[w] = i
    for _ in range(n):
        cur = seq[-1]
        nxt = seq[last[cur] + 1] if cur in last else successor[cur]
        last[cur] = len(seq) - 1
        seq.append(nxt)
    return seq[len(prompt):]


def random_prompt(rng: random.Random) -> list[int]:
    """Two in five prompts distinct words, the others a phrase said two to four times (cut anywhere)."""
    words = rng.sample(range(FIRST_WORD, VOCAB), rng.randint(3, 8))
    if rng.random() < 0.4:
        return words
    phrase = words[: rng.randint(2, min(6, len(words)))]
    return (phrase * 4)[: rng.randint(len(phrase) + 1, len(phrase) * rng.randint(2, 4))]


def chat_ids(tokenizer, words: list[int]) -> list[int]:
    prompt = " ".join(f"w{w}" for w in words)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def train_target(path: Path, steps: int, seed: int = 0) -> dict:
    """Train the checkpoint at `path` on the law in place; returns the last loss and `accuracy`."""
    import torch
    from transformers import AutoTokenizer, Gemma4ForCausalLM

    torch.manual_seed(seed)
    rng = random.Random(seed)
    successor = cycle(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = Gemma4ForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
    model.train()

    def batch(n: int):
        rows, starts = [], []
        for _ in range(n):
            words = random_prompt(rng)
            ids = chat_ids(tokenizer, words)
            rows.append(ids + answer(words, successor, ANSWER))
            starts.append(len(ids))
        width = max(map(len, rows))
        x = torch.zeros(n, width, dtype=torch.long)
        labels = torch.full((n, width), -100, dtype=torch.long)
        for i, (row, s) in enumerate(zip(rows, starts)):
            x[i, : len(row)] = torch.tensor(row)
            labels[i, s: len(row)] = torch.tensor(row[s:])  # the answer: the prompt is not the law's
        return x, labels

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.0, 1 - s / steps))
    for step in range(steps):
        x, labels = batch(BATCH)
        loss = model(input_ids=x, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    model.eval()
    config = (path / "config.json").read_text()  # build_target's, which save_pretrained would rewrite
    model.save_pretrained(str(path))
    (path / "config.json").write_text(config)
    return {"loss": float(loss.item()), "accuracy": accuracy(model, tokenizer, successor)}


def accuracy(model, tokenizer, successor: dict[int, int], sequences: int = 200, seed: int = 123) -> dict:
    """The target's greedy next word against the law's, teacher-forced on fresh sequences: where
    the current word is new (the cycle's successor) and where it occurred before (a copy).
    The build of BUILDER_VERSION 1 (3,000 steps): new 96%, copied 78%."""
    import torch

    rng = random.Random(seed)
    hits = {"new": [0, 0], "copied": [0, 0]}
    with torch.no_grad():
        for _ in range(sequences):
            words = random_prompt(rng)
            ids = chat_ids(tokenizer, words)
            ans = answer(words, successor, ANSWER)
            pred = model(input_ids=torch.tensor([ids + ans])).logits[0].argmax(-1).tolist()
            seq = words + ans
            for j, want in enumerate(ans):
                i = len(words) - 1 + j  # the current word's index in seq
                kind = "copied" if seq[i] in seq[:i] else "new"
                hits[kind][0] += pred[len(ids) - 1 + j] == want
                hits[kind][1] += 1
    return {kind: round(a / max(n, 1), 3) for kind, (a, n) in hits.items()}


def copying_target(root: Path | None = None, steps: int = STEPS, spec: TargetSpec = DENSE_TARGET) -> Path:
    """The trained target's directory (an HF checkpoint, as build_target's), built on first use:
    in a scratch directory renamed into place whole, so a killed build leaves nothing half-made."""
    key = json.dumps({"version": BUILDER_VERSION, "steps": steps, "spec": repr(spec)}, sort_keys=True)
    cache = Path(root or Path(tempfile.gettempdir()) / "specscope-test-cache")
    out = cache / f"gemma4-copying-target-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if not (out / "done").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=cache))
        build_target(scratch / "target", spec)
        info = train_target(scratch / "target", steps)
        (scratch / "done").write_text(json.dumps({"key": json.loads(key), **info}))
        shutil.rmtree(out, ignore_errors=True)
        scratch.replace(out)
    return out / "target"


if __name__ == "__main__":
    import sys
    import time

    import torch

    torch.set_num_threads(1)
    t0 = time.time()
    print(copying_target(Path(sys.argv[1]) if len(sys.argv) > 1 else None), f"{time.time() - t0:.0f} s")
