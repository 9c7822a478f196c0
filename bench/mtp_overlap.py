"""Gemma 4 MTP through the product's chat engine, where a lone request is a batch of one:
realized vs ideal speedup, MTP steps launched ahead of their verdicts vs after them, the
compiled drafter step vs eager, and memory with and without the drafter.

    python bench/mtp_overlap.py [--error-rate 0.2] [--steps 3] [--tokens 128] [--size small] [--repeats 9]

No Gemma 4 weights can be downloaded here, so the target is a random Gemma 4 of a realistic
shape (E2B-like: sliding + full layers, per-layer embeddings, KV sharing) built with
transformers' classes, and the assistant a random centroid-head drafter; both in HF format,
loaded by the product's loaders (engines.factory.load_engine). Random drafts are never
accepted, so acceptance is set by the replay drafter (tests/engines/mlx_chat/gemma4/replay.py, the
engine's `mtp_group`): the batch's MTP group and the real assistant forward run every step,
then each draft is replaced by the target's own greedy output, wrong at --error-rate.

Figures, all measured in this process:
  ideal, apart      = tau * t_plain / (t_draft(k) + t_verify(k)): isolated costs, on a one-row
                      BatchCache holding the prompt, of one plain target step, a k-step drafter
                      chain (BatchMTP.propose of the replaying group the runs use) and a verify
                      forward of k + 1 tokens (its slots then abandoned, so every op sees the
                      same context), with tau (tokens per round) from the MTP run. The costs
                      are "streamed": n ops issued back to back, one wait, divided by n -- what
                      an op costs in a pipelined loop, as the batch runs MTP steps launched
                      ahead. ("Synced" costs, each op waited for on its own, are printed too;
                      they add a host round trip to every op, and so overstate the plain step
                      most.) The plain run's steps are launched ahead, as the product does
                      (BatchEngine.launches_ahead).
  ideal, alternating = tau * t_plain / t_round: the chain and the verify of its drafts streamed
                      in a round's order with nothing of the loop's own. On a CPU that can cost
                      more than the two apart: switching models every round may have a price
                      that any loop pays, which the apart ideal leaves out.
  realized speedup  = decode tok/s with MTP / decode tok/s plain, both through the engine
                      load_engine("chat", ...) returns.
  realized / ideal  = how much of the ideal the loop keeps (goal >= 0.95); against the
                      alternating ideal that is the loop's own cost, against the apart ideal
                      the loop is also charged for switching models.
  ahead gain        = decode tok/s with MTP steps launched on the last step's verdicts still in
                      the graph / launched after those verdicts are read (MtpOptions.ahead off).
  compile gain      = decode tok/s with the compiled drafter step / eager (MtpOptions.compiled off).
  memory            = drafter parameter bytes; peak MLX memory of a plain run and an MTP run.

One BLAS thread, unless OPENBLAS_NUM_THREADS says otherwise. What this measures is whether the
loop keeps the device busy while the host reads verdicts, settles the cache and builds graphs,
which presumes a device beside the host, as a Mac's GPU is. On this 2-core machine MLX's CPU
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

from engines.batch.cache import BatchCache  # noqa: E402
from engines.batch.mtp import BatchMTP  # noqa: E402
from engines.factory import load_engine  # noqa: E402
from engines.mlx_chat.gemma4_assistant import assistant_info  # noqa: E402
from engines.mlx_chat.mtp import mtp_drafter, preload_drafter  # noqa: E402
from engines.mlx_chat.options import MtpOptions  # noqa: E402
from engines.mlx_chat.proposers import LazyVerdict  # noqa: E402
from engines.speculative.proposer import Context  # noqa: E402
from engines.speculative.rounds import session_stats  # noqa: E402
from engines.types import Request, Sampling, SpecConfig  # noqa: E402
from tests.engines.mlx_chat.gemma4.checkpoints import AssistantSpec, TargetSpec, build_assistant, build_target  # noqa: E402
from tests.engines.mlx_chat.gemma4.replay import replay_factory  # noqa: E402

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


def decode(engine, spec: SpecConfig, tokens: int):
    rounds = list(engine.generate(Request(prompt=PROMPT, max_tokens=tokens, spec=spec)))
    return rounds, session_stats(rounds)


class Unkept(list):
    """The replay's record of every chain's start (`seen`, for the tests), keeping nothing: its
    entries are lazy slices of the K/V buffers, which would keep every step's buffers alive
    (and out of MLX's in-place updates) and grow the memory figures run by run."""

    def append(self, item) -> None:
        pass


def isolated_timings(model, group: BatchMTP, ids: list[int], k: int, n: int = 20):
    """Seconds per op, on a one-row BatchCache holding `ids` (the row's next token pending, as
    between steps), of: one plain target step; a k-step drafter chain (group.propose); a verify
    forward of k + 1 tokens through the target view MTP rows use (logits and hidden states);
    and (streamed only) the two in a round's order. The verify's and a lone plain step's slots
    are abandoned after the forward (the next op writes over them), so every op sees the same
    context. Two ways, as dicts {plain, draft, verify[, round]}:

    synced    median of n ops, each built, evaluated and waited for on its own; the chain as
              the loop drafts after reading a verdict (propose evaluates its drafts).
    streamed  n ops issued back to back with async_eval, one wait at the end, divided by n:
              the host builds op i+1 while op i runs. The chain as a step launched ahead
              drafts it (propose with `after`: left in the graph), from the same start."""
    target = group.target
    base = BatchCache(model, 1)
    base.begin(len(ids))
    logits, hidden = target.forward(mx.array(ids, dtype=mx.uint32)[None], base.layers)
    base.settle([len(ids)])
    first = mx.argmax(logits[0, -1:], axis=-1).astype(mx.uint32)
    mx.eval(base.arrays(), first, hidden)
    ctx = Context(ids + [first.item()], Sampling(), hidden=hidden[0, -1])
    token = first
    asks = [(0, ctx, k, None)]
    # a verdict "in the graph" whose next position is ctx.position: the chain starts where asks' does
    start = [LazyVerdict(ctx.position - 1, mx.array([], dtype=mx.uint32), mx.array(0, dtype=mx.int32), token, ctx.hidden)]

    def fresh() -> BatchCache:
        return base.clone(model)

    def plain_step(cache, tok):
        cache.begin(1)
        return mx.argmax(model(tok[None], cache=cache.layers)[0, -1:], axis=-1).astype(mx.uint32)

    def plain(cache):
        out = plain_step(cache, token)
        cache.abandon()
        return [out]

    def draft_synced(cache):
        return [group.propose(cache, asks)[0].tokens]

    def draft_streamed(cache):
        return [group.propose(cache, asks, start)[0].tokens]

    def verify_of(cache, drafts):
        cache.begin(k + 1)
        logits, hid = target.forward(mx.concatenate([token, drafts])[None], cache.layers)
        cache.abandon()
        return [mx.argmax(logits[0], axis=-1), hid]

    def verify(cache):
        return verify_of(cache, mx.zeros((k,), dtype=mx.uint32))

    def draft_and_verify(cache):
        """A round's device work and nothing else: a chain left in the graph, then the verify
        of its drafts (reading them in the graph); no verdict read, no settle, no report.
        Streamed, this is what a loop that added nothing would cost per round: the drafter's
        and the target's ops alternate, as in the loop."""
        return verify_of(cache, group.propose(cache, asks, start)[0].tokens)

    def synced(op):
        cache, times = fresh(), []
        for _ in range(n + 1):  # (the first op of a fresh cache copies the buffers it shares)
            t0 = time.perf_counter()
            mx.eval(op(cache))
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def streamed(op):
        cache = fresh()
        mx.eval(op(cache))  # warm
        t0 = time.perf_counter()
        outs = []
        for _ in range(n):
            outs.append(op(cache))
            mx.async_eval(outs[-1])
        mx.eval(outs)
        return (time.perf_counter() - t0) / n

    def plain_streamed():
        """n plain steps, each fed the previous one's lazy token (as a loop launching plain
        steps ahead does); the context grows by one a step."""
        cache = fresh()
        mx.eval(plain(cache))
        t0 = time.perf_counter()
        tok = token
        for _ in range(n):
            tok = plain_step(cache, tok)
            cache.settle([1])
            mx.async_eval(tok)
        mx.eval(tok)
        return (time.perf_counter() - t0) / n

    return (
        {"plain": synced(plain), "draft": synced(draft_synced), "verify": synced(verify)},
        {"plain": plain_streamed(), "draft": streamed(draft_streamed), "verify": streamed(verify),
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
    engine = load_engine("chat", str(target_dir))  # the drafter comes later: memory without it first
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
    info = assistant_info(engine.mtp_drafters[str(assistant_dir)])

    replay = replay_factory(reference=reference, error_rate=args.error_rate, seed=0)
    groups: list[BatchMTP] = []

    def replaying(drafter, target, step) -> BatchMTP:
        """The engine's MTP group maker: one replaying group per drafter step (compiled or
        eager), kept, so switching MtpOptions.compiled does not rebuild the replay's table."""
        for group in groups:
            if group.drafter is drafter and group.step == step:
                return group
        group = replay(drafter, target, step)
        group.seen = Unkept()
        groups.append(group)
        return group

    engine.mtp_group = replaying
    # the group the MTP runs draft with (compiled step, replay included), so the ideal prices the same chain
    source = mtp_drafter(engine, Request(prompt=PROMPT, spec=spec))
    group = replaying(source.drafter, source.target, source.step)

    def mtp_run(ahead: bool = True, compiled: bool = True):
        engine.mtp_options = MtpOptions(ahead=ahead, compiled=compiled)
        rounds, stats = decode(engine, spec, args.tokens)
        assert [t for r in rounds for t in r.tokens] == reference[len(ids):], "MTP output differs from plain"
        decoding = [r for r in rounds if not r.prefill]
        stats.launched_ahead = sum(r.launched_early for r in decoding) / max(len(decoding), 1)
        return stats

    mx.reset_peak_memory()
    mtp_run()  # warm-up (and the compiled step's first trace)
    mtp_run(compiled=False)
    peak_mtp = mx.get_peak_memory()

    runs = {
        "plain": lambda: decode(engine, SpecConfig(), args.tokens)[1],
        "ahead": lambda: mtp_run(),
        "after": lambda: mtp_run(ahead=False),
        "eager": lambda: mtp_run(compiled=False),
    }
    isolated_timings(engine.model, group, ids, args.steps)  # warm-up: the drafter's step traced for this cache
    reps = []
    for i in range(args.repeats):
        synced, streamed = isolated_timings(engine.model, group, ids, args.steps)
        order = list(runs)[i % len(runs):] + list(runs)[: i % len(runs)]
        stats = {name: runs[name]() for name in order}
        plain, ahead = stats["plain"], stats["ahead"]
        ideal = ahead.tau * streamed["plain"] / (streamed["draft"] + streamed["verify"])
        ideal_synced = ahead.tau * synced["plain"] / (synced["draft"] + synced["verify"])
        ideal_round = ahead.tau * streamed["plain"] / streamed["round"]
        speedup = {name: st.decode_tok_s / plain.decode_tok_s for name, st in stats.items()}
        reps.append(dict(
            **{f"sync_{k}": v for k, v in synced.items()}, **{f"stream_{k}": v for k, v in streamed.items()},
            ideal=ideal, ideal_synced=ideal_synced, ideal_round=ideal_round,
            **{f"tok_s_{name}": st.decode_tok_s for name, st in stats.items()},
            **{f"speedup_{name}": v for name, v in speedup.items()},
            ratio=speedup["ahead"] / ideal, ratio_after=speedup["after"] / ideal,
            ratio_synced=speedup["ahead"] / ideal_synced,
            ratio_round=speedup["ahead"] / ideal_round, ratio_round_after=speedup["after"] / ideal_round,
            ahead_gain=ahead.decode_tok_s / stats["after"].decode_tok_s,
            compile_gain=ahead.decode_tok_s / stats["eager"].decode_tok_s,
            tau=ahead.tau, acceptance=ahead.acceptance_rate, launched_ahead=ahead.launched_ahead,
            draft_host=ahead.draft_s / max(ahead.decode_rounds, 1),
            draft_host_after=stats["after"].draft_s / max(stats["after"].decode_rounds, 1),
            round=ahead.mean_round_s, round_after=stats["after"].mean_round_s, plain_round=plain.mean_round_s,
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
          f"{args.repeats} repeats, OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}, "
          f"load {os.getloadavg()[0]:.2f}: medians (min..max)")
    print(f"acceptance {med('acceptance'):.3f}  tau {med('tau'):.2f} tokens/round  "
          f"rounds launched ahead {med('launched_ahead'):.0%}")
    for kind in ("stream", "sync"):
        print(f"isolated, {kind}ed: plain step {ms(kind + '_plain')}, draft chain x{args.steps} "
              f"{ms(kind + '_draft')}, verify {args.steps + 1} tokens {ms(kind + '_verify')}")
    print(f"in-loop: drafting (host) per round {ms('draft_host')} (launched after {ms('draft_host_after')}), "
          f"MTP round {ms('round')} (launched after {ms('round_after')}), plain round {ms('plain_round')}")
    print(f"decode tok/s: plain {med('tok_s_plain'):.1f}  mtp {med('tok_s_ahead'):.1f}  "
          f"launched after {med('tok_s_after'):.1f}  eager drafter {med('tok_s_eager'):.1f}")
    print(f"speedup over plain: {spread('speedup_ahead')}; launched after {spread('speedup_after')}; "
          f"eager drafter {spread('speedup_eager')}")
    print(f"  draft and verify alternating as in a round, streamed: {ms('stream_round')} "
          f"(apart: {(med('stream_draft') + med('stream_verify')) * 1e3:.1f} ms)")
    print(f"ideal speedup: {spread('ideal')} (from synced costs: {spread('ideal_synced')}; "
          f"from the alternating round: {spread('ideal_round')})")
    print(f"realized / ideal: {spread('ratio')}; launched after {spread('ratio_after')}; "
          f"against the synced ideal {spread('ratio_synced')}")
    print(f"realized / ideal of the alternating round (the loop's own cost): {spread('ratio_round')}; "
          f"launched after {spread('ratio_round_after')}")
    print(f"ahead gain: {spread('ahead_gain')}x   drafter compile gain: {spread('compile_gain')}x")
    # Interference on a shared machine only ever slows a run down, so the fastest of the repeats
    # is the least disturbed estimate of each quantity (timeit's rule): ratios of the bests.
    best = {k: (min if k.startswith(("stream_", "sync_")) else max)(r[k] for r in reps) for k in reps[0]}
    best_ideal = med("tau") * best["stream_plain"] / (best["stream_draft"] + best["stream_verify"])
    best_ideal_round = med("tau") * best["stream_plain"] / best["stream_round"]
    best_speedup = best["tok_s_ahead"] / best["tok_s_plain"]
    print(f"best of {args.repeats} (fastest run or op of each kind): speedup {best_speedup:.3f}, ideal "
          f"{best_ideal:.3f}, realized / ideal {best_speedup / best_ideal:.3f} (of the alternating round "
          f"{best_speedup / best_ideal_round:.3f}); ahead gain "
          f"{best['tok_s_ahead'] / best['tok_s_after']:.3f}x, compile gain {best['tok_s_ahead'] / best['tok_s_eager']:.3f}x")
    print(f"memory: drafter parameters {info.bytes / 2**20:.2f} MiB ({info.parameters:,} params), "
          f"resident after loading {resident / 2**20:.2f} MiB; peak MLX memory plain {peak_plain / 2**20:.1f} MiB, "
          f"with MTP {peak_mtp / 2**20:.1f} MiB (+{(peak_mtp - peak_plain) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
