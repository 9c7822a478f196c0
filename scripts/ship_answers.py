"""Ship the answers a drafter run made, so `specscope drafter train` on the same model, prompts
and answer settings skips answering on every machine (engines/training/data.shipped_answers):

    python scripts/ship_answers.py DIR    # DIR: a finished `specscope drafter train --out DIR`

writes resources/answers/<model sha256>-<prompts>.json.gz from DIR/data/answers.json, for the
target and settings DIR/card.json names. The answers are text the target wrote; the labels a
drafter learns are still computed by teacher forcing on the user's machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from engines.training.config import TrainConfig
    from engines.training.preparation import ship_answers, shipped_answers_folder

    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = Path(sys.argv[1])
    card = json.loads((out / "card.json").read_text())
    config = TrainConfig.from_record(card["training"]["config"])
    path = ship_answers(card["target"]["path"], config, shipped_answers_folder())
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
