"""A drafter trained here for SmolLM2 (the embedded default), on the held-out open chat prompts
(resources/prompts/open_chat.json, none of them in the training prompts), T=0:

    acceptance by depth 1..5   rounds of 5 drafts: the share of rounds whose drafts 1..d were
                               all accepted (the chat engine's own per-position acceptance)
    tok/s                      plain, then each case of --cases: --spec mtp with the drafter
                               (1, 2, 3 or 5 drafts a round, or --steps auto; ':after' = each
                               round launched after the last verdict) and n-gram lookup (4),
                               decode tok/s over all prompts; every output checked equal to
                               plain greedy

Train first (`specscope drafter train --minutes M --out DIR`: M minutes in all, preparation included), then:

    python bench/drafter_smollm2.py DIR [--max-tokens 128] [--cases mtp-1,mtp-auto] [--alternate] [--json OUT]

--alternate runs every case on each prompt in turn (the order rotating), so a drift in the
machine's speed touches them alike: the measure for cases within a few percent of each other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from engines.cpu.preload import preload_cpu_libraries

preload_cpu_libraries()  # the process environment `specscope` runs in (engines/cpu: MLX on OpenBLAS)

import resources  # noqa: E402
from engines.types import Request, SpecConfig  # noqa: E402
from engines.factory import load_engine  # noqa: E402
from engines.mlx_chat.options import MtpOptions  # noqa: E402
from engines.mlx_chat.models import default_chat_model  # noqa: E402


def run(engine, prompt: str, spec: SpecConfig, max_tokens: int):
    rounds = list(engine.generate(Request(prompt=prompt, max_tokens=max_tokens, spec=spec)))
    decode = [r for r in rounds if not r.prefill]
    tokens = [t for r in rounds for t in r.tokens]
    return tokens, decode


def measure(engine, prompts, spec, max_tokens, plain=None):
    """Totals over the prompts: decode tokens and seconds, proposed / accepted, per-depth
    acceptance, and whether every output equals plain greedy."""
    out = Totals()
    for i, (_, prompt) in enumerate(prompts):
        out.add(*run(engine, prompt, spec, max_tokens), None if plain is None else plain[i])
    return out.result()


class Totals:
    """One case's decode tokens and seconds, drafts proposed / accepted, per-depth acceptance,
    outputs, as its prompts' runs come in."""

    def __init__(self):
        self.out = {"tokens": 0, "seconds": 0.0, "proposed": 0, "accepted": 0, "rounds": 0, "same": True,
                    "outputs": []}
        self.depth_hits, self.depth_rounds = [0] * 7, [0] * 7

    def add(self, tokens, decode, plain_tokens=None) -> None:
        out = self.out
        out["outputs"].append(tokens)
        if plain_tokens is not None and tokens != plain_tokens:
            out["same"] = False
        out["tokens"] += sum(len(r.tokens) for r in decode)
        out["seconds"] += sum(r.wall_s for r in decode)
        out["proposed"] += sum(r.proposed for r in decode)
        out["accepted"] += sum(r.accepted for r in decode)
        out["rounds"] += len(decode)
        for r in decode:
            for d in range(r.proposed):
                self.depth_rounds[d] += 1
                self.depth_hits[d] += r.accepted > d

    def result(self) -> dict:
        out = dict(self.out)
        out["tok_s"] = out["tokens"] / out["seconds"] if out["seconds"] else 0.0
        out["acceptance"] = out["accepted"] / out["proposed"] if out["proposed"] else 0.0
        out["by_depth"] = [h / n for h, n in zip(self.depth_hits, self.depth_rounds) if n]
        return out


def alternating(engine, prompts, specs: dict, max_tokens) -> dict:
    """Every case on each prompt in turn, the order rotating from prompt to prompt (plain among
    them), so a drift in the machine's speed touches every case alike -- it drifts by more than
    the differences between close cases within minutes (docs/benchmarks.md, issue 26)."""
    names = list(specs)
    totals = {name: Totals() for name in names}
    for i, (_, prompt) in enumerate(prompts):
        for name in names[i % len(names):] + names[: i % len(names)]:
            set_pipeline(engine, name)
            totals[name].add(*run(engine, prompt, specs[name], max_tokens))
    results = {name: t.result() for name, t in totals.items()}
    plain = results["plain"]["outputs"]
    for r in results.values():
        r["same"] = r["outputs"] == plain
    return results


def set_pipeline(engine, name: str) -> None:
    """A case named `...:after` (e.g. mtp-1:after) launches each MTP step after the last verdict
    is read; any other, on that verdict still in the graph (MtpOptions.ahead)."""
    engine.mtp_options = MtpOptions(ahead=name.partition(":")[2] != "after")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drafter")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompts", default=str(resources.path("prompts", "open_chat.json")))
    p.add_argument("--json", default=None)
    p.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    p.add_argument("--cases", default="mtp-5,mtp-3,ngram-4",
                   help="beside plain: mtp-5, mtp-3, mtp-2, mtp-1, mtp-auto, ngram-4; an mtp case with ':after' "
                        "launches each step after the last verdict is read, for A/B")
    p.add_argument("--alternate", action="store_true",
                   help="run the cases prompt by prompt, in turn (plain among them), not one case after another")
    args = p.parse_args()
    prompts = [(q["name"], q["prompt"]) for q in json.loads(open(args.prompts).read())["prompts"]]
    engine = load_engine("chat", str(default_chat_model()))
    load0 = os.getloadavg()[0]
    run(engine, "Hello", SpecConfig(), 8)  # warm up (first-call costs)
    run(engine, "Hello", SpecConfig(method="mtp", steps=3, draft_model=args.drafter), 8)
    results = {}
    t0 = time.time()
    print(f"{'case':<9} {'tok/s':>7} {'speedup':>8} {'accept':>7} {'same':>5}  acceptance by depth", flush=True)

    def report(name: str, r: dict) -> None:  # each case as it ends: a cut-short run still says something
        depth = " ".join(f"{a:.0%}" for a in r["by_depth"])
        speedup = r["tok_s"] / results["plain"]["tok_s"]
        print(f"{name:<9} {r['tok_s']:>7.1f} {speedup:>7.2f}x {r['acceptance']:>7.1%} {str(r['same']):>5}  {depth}", flush=True)

    cases = {"mtp-5": SpecConfig(method="mtp", steps=5, draft_model=args.drafter),
             "mtp-3": SpecConfig(method="mtp", steps=3, draft_model=args.drafter),
             "mtp-2": SpecConfig(method="mtp", steps=2, draft_model=args.drafter),
             "mtp-1": SpecConfig(method="mtp", steps=1, draft_model=args.drafter),
             "mtp-auto": SpecConfig(method="mtp", steps=3, auto=True, draft_model=args.drafter),  # measured in the run
             "ngram-4": SpecConfig(method="ngram", steps=4)}
    names = args.cases.split(",")
    if args.alternate:
        specs = {"plain": SpecConfig(), **{name: cases[name.partition(":")[0]] for name in names}}
        results.update(alternating(engine, prompts[: args.limit], specs, args.max_tokens))
        for name in results:
            report(name, results[name])
    else:
        results["plain"] = measure(engine, prompts[: args.limit], SpecConfig(), args.max_tokens)
        report("plain", results["plain"])
        plain = results["plain"]["outputs"]
        for name in names:
            set_pipeline(engine, name)
            spec = cases[name.partition(":")[0]]
            results[name] = measure(engine, prompts[: args.limit], spec, args.max_tokens, plain)
            report(name, results[name])
    print(f"SmolLM2-135M, {len(prompts[: args.limit])} open chat prompts, T=0, {args.max_tokens} tokens; "
          f"load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end; {time.time() - t0:.0f} s")
    if args.json:
        for r in results.values():
            r.pop("outputs")
        with open(args.json, "w") as f:
            json.dump({"drafter": args.drafter, "max_tokens": args.max_tokens, "results": results,
                       "loadavg_start": load0, "loadavg_end": os.getloadavg()[0]}, f, indent=1)
    return 0 if all(r["same"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
