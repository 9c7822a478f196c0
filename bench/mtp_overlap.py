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
  ideal, apart      = tau * t_plain / (t_draft(k) + t_verify(k)): isolated costs of one plain
                      target step, a k-step drafter chain (the proposer's own code) and a
                      verify forward of k + 1 tokens (+ rollback), with tau (tokens per round)
                      from the MTP run. The costs are "streamed": n ops issued back to back,
                      one wait, divided by n -- what an op costs in a pipelined loop, which is
                      how ChatEngine runs both plain decoding and MTP rounds. ("Synced" costs,
                      each op waited for on its own, are printed too; they add a host round
                      trip to every op, and so overstate the plain step most.)
  ideal, alternating = tau * t_plain / t_round: the chain and the verify of its drafts streamed
                      in a round's order with nothing of the loop's own (draft_and_verify).
                      On a CPU that costs more than the two apart: switching models every
                      round has a price that any loop pays, which the apart ideal leaves out.
  realized speedup  = decode tok/s with MTP / decode tok/s plain, both through ChatEngine.
  realized / ideal  = how much of the ideal the round loop keeps (goal >= 0.95); against the
                      alternating ideal that is the loop's own cost, against the apart ideal
                      the loop is also charged for switching models.
  overlap gain      = decode tok/s with depth-2 overlap / without (MtpOptions.overlap off).
  compile gain      = decode tok/s with the compiled drafter step / eager (MtpOptions.compiled off).
  memory            = drafter parameter bytes; peak MLX memory of a plain run and an MTP run.

One BLAS thread, unless OPENBLAS_NUM_THREADS says otherwise. What this measures is whether the
loop keeps the device busy while the host reads verdicts, rolls back and builds graphs, which
presumes a device beside the host, as a Mac's GPU is. On this 2-core machine MLX's CPU
"device" with OpenBLAS's default two threads takes both cores, so host work can only take
time from it and no overlap exists to measure (the repeats then also spread twice as wide).
One BLAS thread leaves the device one core and the host the other.

The machine is shared and noisy: every repeat measures everything back to back, in an order
that rotates between repeats; each ratio uses one repeat's own numbers; we print the median
and the spread (min..max) over repeats, and the same ratios from the best of the repeats
(fastest run, cheapest op), since interference only ever slows a measurement down.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the device one core, the host the other (see above)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()  # the process environment `specscope` runs in (engines/cpu: MLX on OpenBLAS)

import mlx.core as mx  # noqa: E402

from engines.types import Request, Sampling, SpecConfig  # noqa: E402
from engines.mlx_chat.cache import make_rollback_cache, rollback  # noqa: E402
from engines.mlx_chat.engine import ChatEngine  # noqa: E402
from engines.mlx_chat.gemma4_assistant import assistant_info  # noqa: E402
from engines.mlx_chat.options import MtpOptions  # noqa: E402
from engines.mlx_chat.mtp import Gemma4Target, MTPProposer, preload_drafter  # noqa: E402
from engines.mlx_chat.proposers import ProposerContext  # noqa: E402
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


CHECKPOINTS_VERSION = "2"  # bump when the builders change: older cached checkpoints are rebuilt


def checkpoints(size: str, root: Path) -> tuple[Path, Path]:
    target_spec, assistant_spec = SIZES[size]
    target, assistant = root / f"{size}_target", root / f"{size}_assistant"
    stamp = root / f"{size}.version"
    if not stamp.is_file() or stamp.read_text() != CHECKPOINTS_VERSION:
        import torch

        torch.set_num_threads(1)
        build_target(target, target_spec)
        build_assistant(assistant, target, assistant_spec)
        stamp.write_text(CHECKPOINTS_VERSION)
    return target, assistant


def decode(engine: ChatEngine, spec: SpecConfig, tokens: int):
    rounds = list(engine.generate(Request(prompt=PROMPT, max_tokens=tokens, spec=spec)))
    return rounds, session_stats(rounds)


def isolated_timings(engine: ChatEngine, proposer: MTPProposer, ids: list[int], k: int, n: int = 20):
    """Seconds per op of: one plain target step; a k-step drafter chain (proposer.propose on
    the settled state, as the loop without overlap calls it); a verify forward of k + 1
    tokens followed by the rollback of k + 1; and (streamed only) the two in a round's order
    (draft_and_verify). Two ways, as dicts {plain, draft, verify[, round]}:

    synced    median of n ops, each built, evaluated and waited for on its own.
    streamed  n ops issued back to back with async_eval, one wait at the end, divided by n:
              the host builds op i+1 while op i runs, as in the round loop."""
    target = proposer.target
    cache = make_rollback_cache(engine.model)
    _, hidden = target.forward(mx.array(ids)[None], cache)
    mx.eval(hidden)
    ctx = ProposerContext(list(ids), Sampling(), engine.model, cache, hidden=hidden[0, -1])
    token = mx.array([ids[-1]], dtype=mx.uint32)

    def plain_step(tok):
        logits, hid = target.forward(tok[None], cache)
        return mx.argmax(logits[0, -1:], axis=-1).astype(mx.uint32), hid

    def plain():
        out = plain_step(token)
        rollback(cache, 1)
        return list(out)

    def draft_chain():
        return [proposer.propose(ctx, k).tokens]

    def verify():
        inputs = mx.concatenate([token, mx.zeros((k,), dtype=mx.uint32)])
        logits, hid = target.forward(inputs[None], cache)
        rollback(cache, k + 1)
        return [mx.argmax(logits[0], axis=-1), hid]

    def draft_and_verify():
        """A round's device work and nothing else: a chain, queued, then the verify of its
        drafts (reading them in the graph), then the rollback of k + 1; no verdict read, no
        bookkeeping, no report. Streamed, this is what a loop that added nothing would cost
        per round: the drafter's and the target's ops alternate, as in the loop, which on a
        CPU costs more than the two streamed apart (not for the data dependency: interleaving
        them without it costs the same)."""
        drafts = proposer.propose(ctx, k).tokens
        mx.async_eval(drafts)
        logits, hid = target.forward(mx.concatenate([token, drafts])[None], cache)
        rollback(cache, k + 1)
        return [mx.argmax(logits[0], axis=-1), hid]

    def synced(op):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            mx.eval(op())
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def streamed(op):
        mx.eval(op())  # warm
        t0 = time.perf_counter()
        outs = []
        for _ in range(n):
            outs.append(op())
            mx.async_eval(outs[-1])
        mx.eval(outs)
        return (time.perf_counter() - t0) / n

    def plain_streamed():
        """n plain steps, each fed the previous one's lazy token (as the loop does)."""
        mx.eval(plain())
        t0 = time.perf_counter()
        tok = token
        for _ in range(n):
            tok, hid = plain_step(tok)
            mx.async_eval(tok, hid)
        mx.eval(tok)
        elapsed = (time.perf_counter() - t0) / n
        rollback(cache, n)
        return elapsed

    return (
        {"plain": synced(plain), "draft": synced(draft_chain), "verify": synced(verify)},
        {"plain": plain_streamed(), "draft": streamed(draft_chain), "verify": streamed(verify),
         "round": streamed(draft_and_verify)},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--steps", type=int, default=3, help="drafts per round (B - 1)")
    ap.add_argument("--error-rate", type=float, default=0.2, help="replayed drafts made wrong")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--root", default="/tmp/specscope_bench_mtp")
    args = ap.parse_args()

    target_dir, assistant_dir = checkpoints(args.size, Path(args.root))
    engine = ChatEngine.load(str(target_dir))  # the drafter comes later: memory without it first
    ids = engine.prompt_ids(Request(prompt=PROMPT))
    spec = SpecConfig(method="mtp", steps=args.steps, draft_model=str(assistant_dir))

    decode(engine, SpecConfig(), 8)  # warm-up
    mx.reset_peak_memory()
    plain_rounds, _ = decode(engine, SpecConfig(), args.tokens)
    peak_plain = mx.get_peak_memory()
    reference = ids + [t for r in plain_rounds for t in r.tokens]

    before = mx.get_active_memory()
    preload_drafter(engine, str(assistant_dir))
    resident = mx.get_active_memory() - before
    drafter = engine.mtp_drafters[str(assistant_dir)]
    # the drafter the MTP runs use, replay included, so the ideal prices the same chain
    proposer = ReplayMTPProposer(drafter, Gemma4Target.of(engine.model), overlap=False, reference=reference,
                                 error_rate=args.error_rate, seed=0)
    info = assistant_info(drafter)

    def replaying(drafter, target, overlap: bool, compiled: bool):  # as the engine's options say
        return ReplayMTPProposer(drafter, target, overlap, compiled, reference=reference,
                                 error_rate=args.error_rate, seed=0)

    engine.mtp_proposer = replaying

    def mtp_run(overlap: bool = True, compiled: bool = True):
        engine.mtp_options = MtpOptions(overlap=overlap, compiled=compiled)
        rounds, stats = decode(engine, spec, args.tokens)
        assert [t for r in rounds for t in r.tokens] == reference[len(ids):], "MTP output differs from plain"
        return stats

    mx.reset_peak_memory()
    mtp_run()  # warm-up (and the compiled step's first trace)
    mtp_run(compiled=False)
    peak_mtp = mx.get_peak_memory()

    runs = {
        "plain": lambda: decode(engine, SpecConfig(), args.tokens)[1],
        "on": lambda: mtp_run(),
        "off": lambda: mtp_run(overlap=False),
        "eager": lambda: mtp_run(compiled=False),
    }
    reps = []
    for i in range(args.repeats):
        synced, streamed = isolated_timings(engine, proposer, ids, args.steps)
        order = list(runs)[i % len(runs):] + list(runs)[: i % len(runs)]
        stats = {name: runs[name]() for name in order}
        plain, on = stats["plain"], stats["on"]
        ideal = on.tau * streamed["plain"] / (streamed["draft"] + streamed["verify"])
        ideal_synced = on.tau * synced["plain"] / (synced["draft"] + synced["verify"])
        ideal_round = on.tau * streamed["plain"] / streamed["round"]
        speedup = {name: st.decode_tok_s / plain.decode_tok_s for name, st in stats.items()}
        reps.append(dict(
            **{f"sync_{k}": v for k, v in synced.items()}, **{f"stream_{k}": v for k, v in streamed.items()},
            ideal=ideal, ideal_synced=ideal_synced, ideal_round=ideal_round,
            **{f"tok_s_{name}": st.decode_tok_s for name, st in stats.items()},
            **{f"speedup_{name}": v for name, v in speedup.items()},
            ratio=speedup["on"] / ideal, ratio_off=speedup["off"] / ideal, ratio_synced=speedup["on"] / ideal_synced,
            ratio_round=speedup["on"] / ideal_round, ratio_round_off=speedup["off"] / ideal_round,
            overlap_gain=on.decode_tok_s / stats["off"].decode_tok_s,
            compile_gain=on.decode_tok_s / stats["eager"].decode_tok_s,
            tau=on.tau, acceptance=on.acceptance_rate, draft_wait=on.draft_s / max(on.decode_rounds, 1),
            round=on.mean_round_s, round_off=stats["off"].mean_round_s, plain_round=plain.mean_round_s,
        ))

    def med(key):
        return statistics.median(r[key] for r in reps)

    def spread(key):
        values = [r[key] for r in reps]
        return f"{med(key):.3f} ({min(values):.3f}..{max(values):.3f})"

    def ms(key):
        return f"{med(key) * 1e3:.1f} ms"

    print(f"target {args.size}: {target_dir}  assistant: {info.head} head, {info.layers} layers, "
          f"hidden {info.hidden_size}")
    print(f"steps {args.steps} (B={args.steps + 1}), replay error rate {args.error_rate}, {args.tokens} tokens, "
          f"{args.repeats} repeats, OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}: medians (min..max)")
    print(f"acceptance {med('acceptance'):.3f}  tau {med('tau'):.2f} tokens/round")
    for kind in ("stream", "sync"):
        print(f"isolated, {kind}ed: plain step {ms(kind + '_plain')}, draft chain x{args.steps} "
              f"{ms(kind + '_draft')}, verify {args.steps + 1} tokens {ms(kind + '_verify')}")
    print(f"in-loop: draft wait {ms('draft_wait')}, MTP round {ms('round')} (no overlap {ms('round_off')}), "
          f"plain round {ms('plain_round')}")
    print(f"decode tok/s: plain {med('tok_s_plain'):.1f}  mtp {med('tok_s_on'):.1f}  "
          f"no overlap {med('tok_s_off'):.1f}  eager drafter {med('tok_s_eager'):.1f}")
    print(f"speedup over plain: {spread('speedup_on')}; no overlap {spread('speedup_off')}; "
          f"eager drafter {spread('speedup_eager')}")
    print(f"  draft and verify alternating as in a round, streamed: {ms('stream_round')} "
          f"(apart: {(med('stream_draft') + med('stream_verify')) * 1e3:.1f} ms)")
    print(f"ideal speedup: {spread('ideal')} (from synced costs: {spread('ideal_synced')}; "
          f"from the alternating round: {spread('ideal_round')})")
    print(f"realized / ideal: {spread('ratio')}; no overlap {spread('ratio_off')}; "
          f"against the synced ideal {spread('ratio_synced')}")
    print(f"realized / ideal of the alternating round (the loop's own cost): {spread('ratio_round')}; "
          f"no overlap {spread('ratio_round_off')}")
    print(f"depth-2 overlap gain: {spread('overlap_gain')}x   drafter compile gain: {spread('compile_gain')}x")
    # Interference on a shared machine only ever slows a run down, so the fastest of the repeats
    # is the least disturbed estimate of each quantity (timeit's rule): ratios of the bests.
    best = {k: (min if k.startswith(("stream_", "sync_")) else max)(r[k] for r in reps) for k in reps[0]}
    best_ideal = med("tau") * best["stream_plain"] / (best["stream_draft"] + best["stream_verify"])
    best_ideal_round = med("tau") * best["stream_plain"] / best["stream_round"]
    best_speedup = best["tok_s_on"] / best["tok_s_plain"]
    print(f"best of {args.repeats} (fastest run or op of each kind): speedup {best_speedup:.3f}, ideal "
          f"{best_ideal:.3f}, realized / ideal {best_speedup / best_ideal:.3f} (of the alternating round "
          f"{best_speedup / best_ideal_round:.3f}); overlap gain "
          f"{best['tok_s_on'] / best['tok_s_off']:.3f}x, compile gain {best['tok_s_on'] / best['tok_s_eager']:.3f}x")
    print(f"memory: drafter parameters {info.bytes / 2**20:.2f} MiB ({info.parameters:,} params), "
          f"resident after loading {resident / 2**20:.2f} MiB; peak MLX memory plain {peak_plain / 2**20:.1f} MiB, "
          f"with MTP {peak_mtp / 2**20:.1f} MiB (+{(peak_mtp - peak_plain) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
