"""Drafters trained in seconds on the tiny real-format targets (tests/engines/mlx_chat/
checkpoints.py) through the product's own trainer (engines/training/train.py): the target
answers random word prompts, the drafter learns its greedy tokens. Kept in a cache directory
keyed by BUILDER_VERSION, the settings and the target's bytes, so later runs load them."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from pathlib import Path

from engines.training.config import TrainConfig
from engines.training.train import train

BUILDER_VERSION = 5  # bump when the training below changes (5: the drafter normalises its inputs); a
# changed TrainConfig default retrains by itself (the settings are in the cache key)
PROMPT_WORDS = 6


def prompts(words, n: int = 40, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(PROMPT_WORDS)) for _ in range(n)]


def config(out: Path, prompts_file: Path, steps: int, seed: int = 0, save_every: int = 50,
           feature_layers=()) -> TrainConfig:
    return TrainConfig(out=out, prompts_file=str(prompts_file), answer_tokens=40, steps=steps, seq_len=64,
                       batch=4, learning_rate=3e-3, seed=seed, save_every=save_every, eval_every=steps,
                       depth=3, draft_vocab=8192, answers_per_prompt=1,  # the tests draft chains of 2-3
                       feature_layers=list(feature_layers), decay=False,
                       # hard labels: the tests need a drafter accepted often but not always; a random
                       # tiny target's distribution is near flat, and learning it (the product's default)
                       # leaves the tiny llama's drafter accepted ~0.2, less than the greedy token gives --
                       # too rarely for the broken-verifier tests to have power
                       soft_labels=False)


def write_prompts(path: Path, words, n: int = 40) -> Path:
    path.write_text(json.dumps(prompts(words, n)))
    return path


def trained_drafter(engine, target_dir: str | Path, words, steps: int = 200, feature_layers=()) -> Path:
    """The directory of a drafter trained `steps` steps on `engine`'s target (cached);
    `feature_layers`: target layers it reads beside the final state (fused features)."""
    target_dir = Path(target_dir)
    settings = {k: v for k, v in config(Path(), Path(), steps, feature_layers=feature_layers).record().items()
                if k not in ("out", "prompts_file")}
    digest = hashlib.sha256(f"{BUILDER_VERSION}-{list(words)}-{settings}".encode())
    for f in sorted(target_dir.glob("*.safetensors")):
        digest.update(f.read_bytes())
    root = Path(tempfile.gettempdir()) / "specscope-test-cache"
    out = root / f"trained-drafter-v{BUILDER_VERSION}-{digest.hexdigest()[:16]}"
    if (out / "card.json").is_file():
        return out
    work = root / (out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prompts_file = write_prompts(work / "prompts.json", words)
    train(engine.model, engine.tokenizer, str(target_dir),
          config(work / "drafter", prompts_file, steps, feature_layers=feature_layers))
    shutil.rmtree(out, ignore_errors=True)
    (work / "drafter").rename(out)  # whole or absent, for a run killed mid-training
    shutil.rmtree(work, ignore_errors=True)
    return out
