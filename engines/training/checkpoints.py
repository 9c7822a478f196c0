"""A run's files: the checkpoint a resumed run starts from (written whole, then swapped in) and
the published drafter a chat run loads (config.json, model.safetensors, card.json, README.md)."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from engines.mlx_chat.drafter import Drafter, write_config
from engines.types import EngineError


class CheckpointError(EngineError):
    """A checkpoint could not be written (disk full...): the previous one is kept."""


def checkpoint_state(out: Path) -> dict:
    ckpt = latest_checkpoint(out)
    return json.loads((ckpt / "state.json").read_text()) if ckpt is not None else {}


def latest_checkpoint(out: Path) -> Path | None:
    """OUT/checkpoint, or OUT/checkpoint.old if a run was killed between the two renames."""
    for name in ("checkpoint", "checkpoint.old"):
        if (out / name / "state.json").is_file():
            return out / name
    return None


def load_checkpoint(ckpt: Path, drafter: Drafter, opt) -> dict:
    """The drafter's weights and Adam's state from `ckpt` (latest_checkpoint), and the run's
    state there (step, times, loss, acceptance)."""
    drafter.load_weights(str(ckpt / "model.safetensors"))
    opt.state = tree_unflatten(list(mx.load(str(ckpt / "optimizer.safetensors")).items()))
    return json.loads((ckpt / "state.json").read_text())


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
