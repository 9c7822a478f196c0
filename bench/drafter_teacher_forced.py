"""A drafter trained here for SmolLM2, teacher-forced on the greedy answers of the bench's held-out
open chat prompts (resources/prompts/open_chat.json): acceptance by depth 1..5 as training's own
`evaluate` measures it, and the share of the answers' labels the draft vocabulary holds.

At T=0 this is what real decoding accepts, if the trainer and the chat engine agree (2026-11-27:
48.1% teacher-forced against 47.4% in bench/drafter_smollm2.py's real rounds, for the same
drafter), in ~30 s instead of the ~2.5 minutes real decoding takes -- a quick read of a drafter
between training runs; bench/drafter_smollm2.py stays the measure of speed and acceptance.

    python bench/drafter_teacher_forced.py DIR [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json

from engines.cpu.preload import preload_cpu_libraries

preload_cpu_libraries()  # the process environment `specscope` runs in

import numpy as np  # noqa: E402

import resources  # noqa: E402
from engines.mlx_chat.drafter import TargetView, load_drafter  # noqa: E402
from engines.mlx_chat.loading import load_model  # noqa: E402
from engines.mlx_chat.models import default_chat_model  # noqa: E402
from engines.training import data as D  # noqa: E402
from engines.training.evaluation import evaluate  # noqa: E402
from engines.training.preparation import answer_starts  # noqa: E402

SEQ_LEN = 256  # as training's default rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drafter")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (the real bench's 64 by default)")
    p.add_argument("--prompts", default=str(resources.path("prompts", "open_chat.json")))
    args = p.parse_args()
    prompts = [q["prompt"] for q in json.loads(open(args.prompts).read())["prompts"]]
    loaded = load_model(str(default_chat_model()))
    drafter = load_drafter(args.drafter)
    target = TargetView.of(loaded.model, drafter.args.feature_layers)
    answers = D.own_answers(loaded.model, loaded.tokenizer, prompts, args.max_tokens, SEQ_LEN, rounds=1,
                            batch=len(prompts))  # greedy, as chat at T=0 writes
    feats = D.features(target, answers, SEQ_LEN)
    feats.starts = answer_starts(loaded.tokenizer, prompts, SEQ_LEN, feats.size)
    drafter.attach(target)
    by_depth = evaluate(drafter, feats, 4)
    vocab = set(np.array(drafter.vocab_ids).tolist())
    starts, labels, lengths = np.array(feats.starts), np.array(feats.labels), np.array(feats.lengths)
    answer_labels = [int(labels[n, t]) for n in range(feats.size) for t in range(starts[n], lengths[n] - 1)]
    print(f"{args.drafter}: {len(prompts)} prompts, {args.max_tokens} tokens, greedy answers, teacher-forced")
    print("acceptance by depth: " + " ".join(f"d{d}={a:.1%}" for d, a in enumerate(by_depth, 1)))
    print(f"answer labels in the draft vocabulary: {np.mean([t in vocab for t in answer_labels]):.1%} "
          f"of {len(answer_labels)}")


if __name__ == "__main__":
    main()
