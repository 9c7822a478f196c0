"""MTP rounds launched before the last verdict is read (slot caches) against each round launched
after it (rollback caches, MtpOptions(pipeline=False)), alternating in one process: plain, early,
after, `--reps` times over the first N held-out open chat prompts (64 tokens, T=0); every output
checked equal to plain's.

    python bench/mtp_launch_early.py DRAFTER [--prompts 8] [--reps 3] [--steps 1] [--model PATH]
"""

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()  # the process environment `specscope` runs in

import resources  # noqa: E402
from engines.types import Request, SpecConfig  # noqa: E402
from engines.mlx_chat.engine import ChatEngine  # noqa: E402
from engines.mlx_chat.options import MtpOptions  # noqa: E402
from engines.mlx_chat.models import default_chat_model  # noqa: E402


def run(engine, prompts, spec, early: bool):
    engine.mtp_options = MtpOptions(pipeline=early)  # each request's cache is chosen by it
    outputs, seconds, tokens, proposed, accepted, launched = [], 0.0, 0, 0, 0, 0
    for prompt in prompts:
        rounds = list(engine.generate(Request(prompt=prompt, max_tokens=64, spec=spec)))
        decode = [r for r in rounds if not r.prefill]
        outputs.append([t for r in rounds for t in r.tokens])
        seconds += sum(r.wall_s for r in decode)
        tokens += sum(len(r.tokens) for r in decode)
        proposed += sum(r.proposed for r in decode)
        accepted += sum(r.accepted for r in decode)
        launched += sum(r.launched_early for r in decode)
    return outputs, tokens / seconds, accepted / max(proposed, 1), launched


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafter")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--model", default=None, help="the target (default: the embedded default)")
    args = ap.parse_args()
    prompts = [q["prompt"] for q in json.loads(resources.path("prompts", "open_chat.json").read_text())["prompts"]]
    prompts = prompts[: args.prompts]
    engine = ChatEngine.load(args.model or str(default_chat_model()))
    mtp = SpecConfig("mtp", args.steps, draft_model=args.drafter)
    run(engine, prompts[:1], SpecConfig(), True)  # warm up
    run(engine, prompts[:1], mtp, True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    speeds: dict[str, list[float]] = {"plain": [], "early": [], "after": []}
    same = True
    for rep in range(args.reps):
        plain, tok_s, _, _ = run(engine, prompts, SpecConfig(), True)
        speeds["plain"].append(tok_s)
        print(f"{rep} plain {tok_s:6.1f} tok/s", flush=True)
        for name, early in (("early", True), ("after", False)):
            outputs, tok_s, acc, launched = run(engine, prompts, mtp, early)
            same &= outputs == plain
            speeds[name].append(tok_s)
            print(f"{rep} {name:5} {tok_s:6.1f} tok/s  accepted {acc:.1%}  launched early {launched}  "
                  f"same as plain {outputs == plain}", flush=True)
    base = statistics.median(speeds["plain"])
    for name, values in speeds.items():
        print(f"median {name:5} {statistics.median(values):6.1f} tok/s  {statistics.median(values) / base:.3f}x")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
