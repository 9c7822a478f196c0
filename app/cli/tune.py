"""`specscope tune`: measure what speculation costs and gains on this machine for one model
and drafter, and keep it as the profile `--steps auto` chooses from
(engines/speculative/tuning.py; the measurements: engines/batch/tuning.py)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

from app.cli.common import (DEFAULT_CHAT_ID, Parser, UsageError, add_spec_arguments, advanced, load_chat_engine, load_prompts,
                            pick_drafter, profiles_dir, resolve_models, spec_config)


def parser() -> Parser:
    p = Parser(prog="specscope tune", description="Measure this machine's speculation costs for a model "
               "(forward latency by width, drafting cost, acceptance by position) for --steps auto.")
    p.add_argument("--model", default=None, metavar="ID|PATH",
                   help="the target: catalog id, hub repo id or path (default: the embedded SmolLM2)")
    p.add_argument("--draft-model", default=None, metavar="ID|PATH",
                   help="the draft model (--spec draft) or MTP drafter (--spec mtp)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    add_spec_arguments(p, ["ngram", "draft", "mtp"], "ngram")
    more = advanced(p)
    more.add_argument("--prompts", default=None, metavar="FILE",
                      help="calibration prompts (JSON or one per line; default: the copy-heavy set)")
    more.add_argument("--context", type=int, default=256, metavar="N",
                      help="context tokens while the latency curve is measured (default 256)")
    more.add_argument("--reps", type=int, default=9, metavar="N", help="forwards per width (the fastest kept; default 9)")
    return p


def cmd_tune(argv: list[str]) -> int:
    from engines.profiles import profile_file
    from engines.speculative.tuning import break_even, rates
    from engines.batch.tuning import measure

    args = parser().parse_args(argv)
    if args.context < 8 or args.reps < 1:
        raise UsageError("--context must be >= 8 and --reps >= 1")
    if args.steps is None:
        args.steps = 1  # any: tune measures every draft length
    pick_drafter(args)
    spec = spec_config(args)
    resolve_models(args, spec, "chat")
    prompts = [p for _, p in load_prompts(args.prompts)]
    say(f"loading {args.model or DEFAULT_CHAT_ID}")
    engine = load_chat_engine(args.model, spec.draft_model)
    model = engine.model_path
    stages = {"latency": f"the target's forward latency for 1..8 tokens after {args.context} tokens of context "
                         f"({args.reps} each)",
              "batch": "a batch's forward latency: 2, 4 and 8 sequences of 1, 2, 4 and 8 tokens",
              "acceptance": f"acceptance by draft position: {len(prompts)} calibration prompts at 7 drafts per round"}

    def progress(p) -> None:
        if p.done == 0:
            say(stages[p.stage])
        if p.stage == "acceptance":
            say(f"  prompt {p.done + 1}/{p.total}")

    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load >= max(1.0, 0.75 * cores):  # the fastest forward survives a burst, not a machine kept busy
        say(f"the machine is busy (load {load:.1f} on {cores} cores): wide forwards may be priced high; "
            "tune again when it is quiet")
    profile, cal = measure(engine, spec, prompts, args.max_tokens, args.context, args.reps, on_progress=progress)
    latency = profile.target_s
    path = profile_file(profiles_dir(), model, spec.method, spec.draft_model or "")
    profile.save(path)
    if args.json:
        print(json.dumps(asdict(profile) | {"path": str(path)}, indent=1))
        return 0
    expected = rates(profile.latency().at, profile.draft_s, profile.acceptance, len(profile.acceptance))
    best = max(range(len(expected)), key=expected.__getitem__)
    print(f"profile: {path}")
    print(f"machine: {profile.machine}")
    print("forward ms by width: " + "  ".join(f"{w}:{s * 1000:.1f}" for w, s in sorted(latency.items())))
    print("a batch's forward ms by sequences x width: " + "  ".join(
        f"{b}x{w}:{s * 1000:.1f}" for b, by_width in sorted(profile.batch_s.items()) for w, s in sorted(by_width.items())))
    print("acceptance by position: " + "  ".join(f"{i + 1}:{a:.2f}" for i, a in enumerate(cal.acceptance))
          + f"  ({cal.rounds} rounds)")
    print(f"drafting: {profile.draft_s * 1000:.2f} ms per token")
    evens = [break_even(profile.latency().at, profile.draft_s, k) for k in range(1, len(profile.acceptance) + 1)]
    print("break-even acceptance by k (below it speculation loses here): "
          + "  ".join(f"{k}:{'-' if a is None else f'{a:.2f}'}" for k, a in enumerate(evens, 1)))
    print("expected tok/s by k: " + "  ".join(f"{k}:{r:.1f}" for k, r in enumerate(expected)))
    print(f"best k here: {best}" + ("  (speculation does not pay on this machine for this set: plain decoding)"
                                    if best == 0 else "") + "; --steps auto starts from it and follows the run")
    return 0


def say(message: str) -> None:
    print(f"specscope: {message}", file=sys.stderr, flush=True)
