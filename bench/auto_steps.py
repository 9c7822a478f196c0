"""`--steps auto` against fixed draft lengths (issue "Speculation that tunes itself"): SmolLM2
with n-gram lookup, on the copy-heavy set and on open chat prompts, decode tok/s per
configuration -- steps 1..7 fixed, the method's default (5), and auto with a profile `specscope
tune` measured just before (forward latency by width, acceptance by position on the copy-heavy
set). Every configuration runs every prompt in turn (round-robin, so a change in the machine's
load touches them alike); outputs are checked identical.

"Best fixed" read off the same sweep is the highest of seven noisy figures, biased up by the
noise alone (on the copy-heavy set neighbouring k differ by up to 0.1x run to run). With
`--confirm N`, the k the sweep found best is then run again beside auto, plain and the default,
N passes alternating prompt by prompt, and auto is compared with it there: the sweep finds the
best k, fresh runs measure it.

    python bench/auto_steps.py [--max-tokens 96] [--runs 1] [--open 4] [--confirm 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()  # the process environment `specscope` runs in (engines/cpu: MLX on OpenBLAS)


# Short, highly repetitive requests (about 100 tokens each): what a user asks when a reply copies
# most of its prompt -- a list, a table, a sentence said again.
SHORT_REPETITIVE = [
    "Copy this list exactly: apples, bread, butter, cheese, eggs, flour, honey, jam, milk, oats, pasta, "
    "rice, salt, sugar, tea, yoghurt, apples, bread, butter, cheese.",
    "Repeat this table exactly:\n| name | age | city |\n|---|---|---|\n| Ann | 31 | Oslo |\n"
    "| Ben | 42 | Rome |\n| Cat | 27 | Lima |\n| Dan | 35 | Kyiv |",
    "Write the sentence 'The quick brown fox jumps over the lazy dog.' five times, one per line.",
    "Repeat after me, word for word: To be, or not to be, that is the question: whether 'tis nobler "
    "in the mind to suffer the slings and arrows of outrageous fortune.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--open", type=int, default=4, help="open chat prompts used (the first N)")
    ap.add_argument("--sets", default="copy-heavy,open chat,short repetitive",
                    help="which prompt sets to run (comma-separated)")
    ap.add_argument("--confirm", type=int, default=0,
                    help="passes that run the sweep's best k again beside auto, plain and the default")
    args = ap.parse_args()

    import resources
    from engines.factory import load_engine
    from engines.mlx_chat.models import default_chat_model
    from engines.batch.tuning import calibrate, forward_latency
    from engines.profiles import Profile, machine_id, profile_file
    from engines.speculative.tuning import rates
    from engines.types import SpecConfig

    load = lambda name: [p["prompt"] for p in json.loads(resources.path("prompts", name).read_text())["prompts"]]  # noqa: E731
    sets = {"copy-heavy": load("copy_heavy.json"), "open chat": load("open_chat.json")[: args.open],
            "short repetitive": SHORT_REPETITIVE}
    sets = {name: sets[name] for name in args.sets.split(",")}
    engine = load_engine("chat", str(default_chat_model()))
    folder = Path(tempfile.mkdtemp(prefix="specscope-profiles-"))
    t0 = time.perf_counter()
    copy_heavy = load("copy_heavy.json")  # the profile is tuned on it, whichever sets run
    context = engine.tokenizer.encode(" ".join(copy_heavy))[:256]
    latency = forward_latency(engine.model, context)
    cal = calibrate(engine, copy_heavy, SpecConfig("ngram", 5), args.max_tokens)
    profile = Profile(machine_id(), engine.model_path, "ngram", "", latency, cal.draft_s, cal.acceptance, len(context),
                      replayed=cal.replayed.record())
    profile.save(profile_file(folder, engine.model_path, "ngram"))
    expected = rates(profile.latency().at, profile.draft_s, profile.acceptance, 7)
    print(f"tune: {time.perf_counter() - t0:.0f} s; forward ms by width "
          + " ".join(f"{w}:{s * 1000:.0f}" for w, s in sorted(latency.items()))
          + "; acceptance " + " ".join(f"{a:.2f}" for a in cal.acceptance)
          + f"; expected tok/s by k " + " ".join(f"{r:.1f}" for r in expected)
          + "; replayed tok/s by k " + " ".join(f"{t / s:.1f}" for t, s in
                                                 (cal.replayed.per_round(k, profile.latency().at) for k in range(8))),
          flush=True)

    configs = {f"steps {k}": SpecConfig("ngram", k) for k in range(1, 8)}
    configs["plain"] = SpecConfig("off", 0)
    configs["auto"] = SpecConfig("ngram", 5, auto=True, profile=str(folder))
    results = {}
    for set_name, prompts in sets.items():
        rel = speed_ups(engine, prompts, configs, args.runs, args.max_tokens)
        best = max((n for n in rel if n.startswith("steps")), key=rel.get)
        results[set_name] = {"sweep": rel}
        print(f"\n{set_name} ({len(prompts)} prompts, {args.max_tokens} tokens, median speed-up over plain):")
        for name in configs:
            print(f"  {name:<8} {rel[name]:.2f}x")
        print(f"  auto vs best fixed ({best}): {rel['auto'] / rel[best]:.2f}; auto vs default (steps 5): "
              f"{rel['auto'] / rel['steps 5']:.2f}", flush=True)
        if args.confirm:
            again = {name: configs[name] for name in dict.fromkeys(["plain", best, "steps 5", "auto"])}
            rel = speed_ups(engine, prompts, again, args.confirm, args.max_tokens)
            results[set_name] |= {"best": best, "confirm": rel}
            print(f"  confirmed over {args.confirm} more passes: " + ", ".join(f"{n} {v:.2f}x" for n, v in rel.items())
                  + f"; auto vs {best}: {rel['auto'] / rel[best]:.2f}; auto vs steps 5: {rel['auto'] / rel['steps 5']:.2f}",
                  flush=True)
    out = ROOT / "bench" / "results" / f"auto-steps-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    import os

    out.write_text(json.dumps({"load": os.getloadavg(), "profile": profile.__dict__ | {"target_s": latency},
                               "results": results}, indent=1, default=str))
    print(f"wrote {out}")


def speed_ups(engine, prompts: list[str], configs: dict, runs: int, max_tokens: int) -> dict[str, float]:
    """Per configuration, the median over prompts and runs of its decode tok/s over plain's on
    the same prompt in the same pass; every configuration runs each prompt in turn."""
    from engines.types import Request

    tok_s = {name: [] for name in configs}
    outputs = {}
    for _ in range(runs):
        for i, prompt in enumerate(prompts):
            for name, spec in configs.items():
                rounds = list(engine.generate(Request(prompt=prompt, max_tokens=max_tokens, spec=spec)))
                tokens = [t for r in rounds for t in r.tokens]
                assert outputs.setdefault(i, tokens) == tokens, (name, i)  # lossless
                tok_s[name].append(sum(len(r.tokens) for r in rounds if not r.prefill)
                                   / max(sum(r.wall_s for r in rounds if not r.prefill), 1e-9))
    plain = tok_s["plain"]
    return {name: statistics.median(v / p for v, p in zip(vals, plain)) for name, vals in tok_s.items()}


if __name__ == "__main__":
    main()
