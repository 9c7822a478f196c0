"""Gemma 4 MTP in the real round loop: realized vs ideal speedup, depth-2 overlap on vs off,
and memory with and without the drafter.

    python bench/mtp_overlap.py [--error-rate 0.2] [--steps 3] [--tokens 128] [--size medium]

No Gemma 4 weights can be downloaded here, so the target is a random Gemma 4 of a realistic
shape (E2B-like: sliding + full layers, per-layer embeddings, KV sharing) built with
transformers' classes, and the assistant a random centroid-head drafter; both in HF format,
loaded by the product's loaders. Random drafts are never accepted, so acceptance is set by
the replay drafter (tests/engines/gemma4/replay.py): the real assistant forward runs every
step, then its token is replaced by the target's own greedy output, wrong at --error-rate.

Figures, all measured in this process:
  ideal speedup     = tau * t_plain / (t_draft(k) + t_verify(k)): isolated timings of one
                      plain target step, a k-step drafter chain and a verify forward of k + 1
                      tokens (+ rollback), with tau (tokens per round) from the MTP run.
  realized speedup  = decode tok/s with MTP / decode tok/s plain, both through ChatEngine.
  realized / ideal  = how much of the ideal the round loop keeps (goal >= 0.95).
  overlap gain      = decode tok/s with depth-2 overlap / without.
  memory            = drafter parameter bytes; peak MLX memory of a plain run and an MTP run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.launch import preload_openblas  # noqa: E402

preload_openblas()  # the process environment `specscope` runs in (MLX's CPU BLAS -> OpenBLAS)

import mlx.core as mx  # noqa: E402

from engines import Request, SpecConfig  # noqa: E402
from engines.mlx_chat.cache import make_rollback_cache, rollback  # noqa: E402
from engines.mlx_chat.engine import ChatEngine  # noqa: E402
from engines.mlx_chat.gemma4_assistant import assistant_info  # noqa: E402
from engines.mlx_chat.mtp import Gemma4Target, MTPProposer, preload_drafter  # noqa: E402
from engines.speculative.rounds import session_stats  # noqa: E402
from tests.engines.gemma4.checkpoints import AssistantSpec, TargetSpec, build_assistant, build_target  # noqa: E402
from tests.engines.gemma4.replay import ReplayMTPProposer  # noqa: E402

SIZES = {
    # E2B-like proportions at a size this CPU decodes at a few tokens per second to tens
    "small": (
        TargetSpec(vocab_size=4096, hidden_size=256, intermediate_size=1024,
                   layer_types=("sliding_attention",) * 3 + ("full_attention",) + ("sliding_attention",) * 3 + ("full_attention",),
                   num_attention_heads=4, num_key_value_heads=1, head_dim=64, global_head_dim=128,
                   hidden_size_per_layer_input=16, num_kv_shared_layers=2, sliding_window=64),
        AssistantSpec(hidden_size=128, intermediate_size=512, num_attention_heads=4, centroid=True,
                      num_centroids=64, centroid_intermediate_top_k=8),
    ),
    "medium": (
        TargetSpec(vocab_size=8192, hidden_size=512, intermediate_size=2048,
                   layer_types=(("sliding_attention",) * 4 + ("full_attention",)) * 3,
                   num_attention_heads=8, num_key_value_heads=1, head_dim=64, global_head_dim=128,
                   hidden_size_per_layer_input=32, num_kv_shared_layers=5, sliding_window=128),
        AssistantSpec(hidden_size=256, intermediate_size=1024, num_attention_heads=4, centroid=True,
                      num_centroids=128, centroid_intermediate_top_k=8),
    ),
}
PROMPT = " ".join(f"w{10 + 7 * i}" for i in range(40))


def checkpoints(size: str, root: Path) -> tuple[Path, Path]:
    target_spec, assistant_spec = SIZES[size]
    target, assistant = root / f"{size}_target", root / f"{size}_assistant"
    if not (target / "config.json").is_file():
        import torch

        torch.set_num_threads(1)
        build_target(target, target_spec)
        build_assistant(assistant, target, assistant_spec)
    return target, assistant


def decode(engine: ChatEngine, spec: SpecConfig, tokens: int):
    rounds = list(engine.generate(Request(prompt=PROMPT, max_tokens=tokens, spec=spec)))
    return rounds, session_stats(rounds)


def isolated_timings(engine: ChatEngine, proposer: MTPProposer, ids: list[int], k: int, n: int = 20):
    """Median seconds of: one plain target step; a k-step drafter chain; a verify forward of
    k + 1 tokens followed by the rollback of k (the worst case, every draft rejected)."""
    target = proposer.target
    cache = make_rollback_cache(engine.model)
    _, hidden = target.forward(mx.array(ids)[None], cache)
    mx.eval(hidden)
    h = hidden[0, -1]
    token = mx.array([ids[-1]], dtype=mx.uint32)

    def timed(fn):
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    def plain_step():
        logits, hid = target.forward(token[None], cache)
        mx.eval(mx.argmax(logits[0, -1]), hid)
        rollback(cache, 1)

    def draft_chain():
        kv = target.drafter_kv(cache)
        tok, hh, out = token, h, []
        for _ in range(k):
            step = proposer.drafter.step(target.embed(tok)[0], hh, len(ids), kv)
            tok = mx.argmax(step.logits, axis=-1, keepdims=True)
            hh = step.h_next
            out.append(tok)
        mx.eval(*out, hh)

    def verify():
        inputs = mx.concatenate([token, mx.zeros((k,), dtype=mx.uint32)])
        logits, hid = target.forward(inputs[None], cache)
        mx.eval(mx.argmax(logits[0], axis=-1), hid)
        rollback(cache, k + 1)

    return timed(plain_step), timed(draft_chain), timed(verify)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--steps", type=int, default=3, help="drafts per round (B - 1)")
    ap.add_argument("--error-rate", type=float, default=0.2, help="replayed drafts made wrong")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--root", default="/tmp/specscope_bench_mtp")
    args = ap.parse_args()

    target_dir, assistant_dir = checkpoints(args.size, Path(args.root))
    engine = ChatEngine.load(str(target_dir))  # the drafter comes later: memory without it first
    ids = engine._prompt_ids(Request(prompt=PROMPT))
    spec = SpecConfig(method="mtp", steps=args.steps, draft_model=str(assistant_dir))

    decode(engine, SpecConfig(), 8)  # warm-up
    mx.reset_peak_memory()
    plain_rounds, _ = decode(engine, SpecConfig(), args.tokens)
    peak_plain = mx.get_peak_memory()
    reference = ids + [t for r in plain_rounds for t in r.tokens]

    before = mx.get_active_memory()
    preload_drafter(engine, str(assistant_dir))
    resident = mx.get_active_memory() - before
    proposer = MTPProposer(engine.mtp_drafters[str(assistant_dir)], Gemma4Target.of(engine.model))
    info = assistant_info(proposer.drafter)

    def mtp_run(overlap: bool):
        def make(drafter, target, **_):
            return ReplayMTPProposer(drafter, target, overlap, reference=reference, error_rate=args.error_rate, seed=0)
        engine.mtp_proposer = make
        rounds, stats = decode(engine, spec, args.tokens)
        assert [t for r in rounds for t in r.tokens] == reference[len(ids):], "MTP output differs from plain"
        return stats

    mx.reset_peak_memory()
    mtp_run(True)  # warm-up
    peak_mtp = mx.get_peak_memory()

    # The machine is shared: each repeat measures everything back to back (isolated timings,
    # plain, overlap on, overlap off) and its ratios use only its own numbers; we report the
    # median over repeats.
    reps = []
    for _ in range(args.repeats):
        t_plain, t_draft, t_verify = isolated_timings(engine, proposer, ids, args.steps)
        _, plain = decode(engine, SpecConfig(), args.tokens)
        on, off = mtp_run(True), mtp_run(False)
        ideal = on.tau * t_plain / (t_draft + t_verify)
        reps.append(dict(
            t_plain=t_plain, t_draft=t_draft, t_verify=t_verify, ideal=ideal,
            plain=plain.decode_tok_s, on=on.decode_tok_s, off=off.decode_tok_s,
            ratio_on=on.decode_tok_s / plain.decode_tok_s / ideal,
            ratio_off=off.decode_tok_s / plain.decode_tok_s / ideal,
            efficiency=(t_draft + t_verify) / on.mean_round_s,
            gain=on.decode_tok_s / off.decode_tok_s,
            tau=on.tau, acceptance=on.acceptance_rate, draft_wait=on.draft_s / max(on.decode_rounds, 1),
            round=on.mean_round_s, plain_round=plain.mean_round_s,
        ))
    m = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    ratios = ", ".join(f"{r['ratio_on']:.3f}" for r in reps)
    gains = ", ".join(f"{r['gain']:.3f}" for r in reps)

    print(f"target {args.size}: {target_dir}  assistant: {info.head} head, {info.layers} layers, "
          f"hidden {info.hidden_size}")
    print(f"steps {args.steps} (B={args.steps + 1}), replay error rate {args.error_rate}, {args.tokens} tokens, "
          f"median of {args.repeats} repeats")
    print(f"acceptance {m['acceptance']:.3f}  tau {m['tau']:.2f} tokens/round")
    print(f"isolated: plain step {m['t_plain'] * 1e3:.1f} ms, draft chain x{args.steps} {m['t_draft'] * 1e3:.1f} ms "
          f"({m['t_draft'] / args.steps * 1e3:.1f} ms/step), verify {args.steps + 1} tokens {m['t_verify'] * 1e3:.1f} ms")
    print(f"in-loop: draft wait {m['draft_wait'] * 1e3:.1f} ms, MTP round {m['round'] * 1e3:.1f} ms, "
          f"plain round {m['plain_round'] * 1e3:.1f} ms")
    print(f"decode tok/s: plain {m['plain']:.1f}  mtp+overlap {m['on']:.1f}  mtp no-overlap {m['off']:.1f}")
    print(f"ideal speedup {m['ideal']:.3f}  realized/ideal {m['ratio_on']:.3f} (no overlap: {m['ratio_off']:.3f})  "
          f"per repeat: {ratios}")
    print(f"round efficiency (isolated draft + verify) / in-loop MTP round: {m['efficiency']:.3f}")
    print(f"depth-2 overlap gain: {m['gain']:.3f}x  per repeat: {gains}")
    print(f"memory: drafter parameters {info.bytes / 2**20:.2f} MiB ({info.parameters:,} params), "
          f"resident after loading {resident / 2**20:.2f} MiB; peak MLX memory plain {peak_plain / 2**20:.1f} MiB, "
          f"with MTP {peak_mtp / 2**20:.1f} MiB (+{(peak_mtp - peak_plain) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
