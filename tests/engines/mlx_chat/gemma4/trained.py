"""A Gemma 4 assistant trained for about a minute on the tiny target (as the GLM-OCR tests
train their MTP layer): its drafts are accepted for what it learned, not because a test
boosts the right token. Trained once and kept in a cache directory keyed by BUILDER_VERSION and
the two checkpoints' bytes, so later runs load it in a second."""

from __future__ import annotations

import hashlib
import random
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

from engines.types import Request
from engines.batch.cache import BatchCache
from engines.mlx_chat.mtp import Gemma4Target, load_drafter

BUILDER_VERSION = 1  # bump when the training below changes
TRAIN_PROMPTS = [f"w{a} w{b} w{c}" for a, b, c in [(10, 20, 30), (40, 50, 60), (70, 80, 90), (15, 25, 35),
                                                   (45, 55, 65), (75, 85, 95), (12, 24, 36), (48, 60, 72)]]
TOKENS_PER_PROMPT = 40
ITERATIONS = 300
BATCH = 24


def cache_path(target_dir: Path, assistant_dir: Path) -> Path:
    digest = hashlib.sha256()
    for f in sorted([*target_dir.glob("*.safetensors"), *assistant_dir.glob("*.safetensors")]):
        digest.update(f.read_bytes())
    root = Path(tempfile.gettempdir()) / "specscope-test-cache"
    root.mkdir(parents=True, exist_ok=True)
    return root / f"gemma4-trained-assistant-v{BUILDER_VERSION}-{digest.hexdigest()[:16]}.safetensors"


def examples(engine) -> list[tuple]:
    """(token embedding, h_prev, position, K/V view, label) of each drafting point along the
    target's greedy outputs: exactly what the batch's MTP rows hand the drafter's first step."""
    target = Gemma4Target.of(engine.model)
    out = []
    for prompt in TRAIN_PROMPTS:
        ids = engine.prompt_ids(Request(prompt=prompt))
        rounds = engine.generate(Request(prompt=prompt, max_tokens=TOKENS_PER_PROMPT))
        seq = ids + [t for r in rounds for t in r.tokens]
        cache = BatchCache(engine.model, 1)
        cache.begin(len(seq))
        _, hidden = target.forward(mx.array(seq)[None], cache.layers)
        cache.settle([len(seq)])
        for p in range(len(ids), len(seq) - 1):
            kv, masks = view_before(target, cache, p)
            embedding = target.embed(mx.array([seq[p]], dtype=mx.uint32))[0]
            out.append((embedding, hidden[0, p - 1], mx.array(p, dtype=mx.int32), kv, masks, seq[p + 1]))
    mx.eval([e[:2] for e in out])
    return out


def view_before(target: Gemma4Target, cache: BatchCache, p: int):
    """The drafter's K/V at position p from a one-row cache holding a longer sequence: whole
    buffers, masks showing positions < p (for sliding layers the last `sliding_window` of
    them), as BatchMTP.view shows a row whose cache ends before p."""
    kv, masks = {}, {}
    for kind, idx in target.kv_layers.items():
        layer = cache.layers[idx]
        size = layer.table.size
        positions = mx.array(layer.table.key_positions()[0])
        visible = (positions >= 0) & (positions < p)
        if kind == "sliding_attention":
            visible = visible & (positions >= p - target.sliding_window)
        kv[kind], masks[kind] = (layer.keys[..., :size, :], layer.values[..., :size, :]), visible
    return kv, masks


def train(engine, assistant_dir: Path):
    drafter = load_drafter(str(assistant_dir))
    data = examples(engine)
    rng = random.Random(0)

    def loss(batch):
        logits = mx.stack([drafter.step(e, h, p, kv, m).logits for e, h, p, kv, m, _ in batch])
        return nn.losses.cross_entropy(logits, mx.array([y for *_, y in batch]), reduction="mean")

    loss_and_grad = nn.value_and_grad(drafter, loss)
    opt = optim.Adam(learning_rate=3e-3)
    for _ in range(ITERATIONS):
        _, grads = loss_and_grad(rng.sample(data, BATCH))
        opt.update(drafter, grads)
        mx.eval(drafter.parameters(), opt.state)
    return drafter


def trained_assistant(engine, target_dir: Path, assistant_dir: Path):
    """The trained drafter (an engines.mlx_chat.gemma4_assistant.Model), from the cache if there."""
    path = cache_path(Path(target_dir), Path(assistant_dir))
    if path.exists():
        drafter = load_drafter(str(assistant_dir))
        drafter.load_weights(str(path))
        return drafter
    drafter = train(engine, Path(assistant_dir))
    partial = path.with_suffix(".partial.safetensors")
    drafter.save_weights(str(partial))
    partial.replace(path)  # whole or absent, for a run that is killed mid-write
    return drafter
