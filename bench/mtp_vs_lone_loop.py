"""Gemma 4 MTP and plain decoding, a single stream: this tree's loop (a batch of one) against the
lone loop it replaced (commit e423d69, ChatEngine's own round loop), both in this process,
decodes alternating, so the machine's drifts fall on both alike.

    python bench/mtp_vs_lone_loop.py [--runs 30] [--tokens 128] [--commit e423d69]

The old tree's engines/ and its replaying MTP proposer (tests/engines/gemma4/replay.py) are
extracted with `git archive` into a temporary folder and imported under other names (lone_engines,
lone_replay), their imports rewritten to match. Both engines read bench/mtp_overlap.py's small
random Gemma 4 and its assistant (built once, kept in /tmp/specscope_bench_mtp), 3 drafts a
round, the drafts replayed from plain decoding's tokens with 20% made wrong (the same seed in both
trees, so both accept the same drafts: tau is printed for each). The CPU kernels (engines/cpu)
patch mlx-lm for the whole process, so both trees run this tree's kernels: what differs is the
loop and the caches. Every output is checked equal to plain decoding's. One BLAS thread (the
device one core, the host the other, as in bench/mtp_overlap.py).

Prints each configuration's decode tok/s (median, range) and the ratios this tree / the lone loop
(median of the per-pair ratios, geometric mean with its 95% interval).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()

import bench.mtp_overlap as mo  # noqa: E402
from engines.factory import load_engine  # noqa: E402
from engines.mlx_chat.mtp import preload_drafter  # noqa: E402
from engines.speculative.rounds import session_stats  # noqa: E402
import engines.types as types  # noqa: E402
from tests.engines.mlx_chat.gemma4.replay import replay_factory  # noqa: E402

ERROR_RATE, SEED, STEPS = 0.2, 0, 3


def extract_old_tree(commit: str, into: Path) -> None:
    """engines/ and the replaying proposer of `commit`, importable as lone_engines and lone_replay."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "engines", "tests/engines/gemma4/replay.py"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into / "old", filter="data")
    (into / "old" / "engines").rename(into / "lone_engines")
    (into / "old" / "tests" / "engines" / "gemma4" / "replay.py").rename(into / "lone_replay.py")
    for path in [*(into / "lone_engines").rglob("*.py"), into / "lone_replay.py"]:
        text = path.read_text()
        text = re.sub(r"\b(from|import) engines\b", r"\1 lone_engines", text)
        path.write_text(text.replace('"engines.', '"lone_engines.'))
    sys.path.insert(0, str(into))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30, help="decodes of each configuration")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--commit", default="e423d69", help="the lone loop's tree")
    args = ap.parse_args()

    target_dir, assistant_dir = mo.checkpoints("small", Path("/tmp/specscope_bench_mtp"))
    ours = load_engine("chat", str(target_dir))
    ids = ours.prompt_ids(types.Request(prompt=mo.PROMPT))
    plain_rounds = list(ours.generate(types.Request(prompt=mo.PROMPT, max_tokens=args.tokens)))
    reference = ids + [t for r in plain_rounds for t in r.tokens]

    preload_drafter(ours, str(assistant_dir))
    replay = replay_factory(reference=reference, error_rate=ERROR_RATE, seed=SEED)
    groups = []

    def replaying(drafter, target, step):  # one group per drafter step, kept (as bench/mtp_overlap.py)
        for group in groups:
            if group.drafter is drafter and group.step == step:
                return group
        group = replay(drafter, target, step)
        group.seen = mo.Unkept()
        groups.append(group)
        return group

    ours.mtp_group = replaying

    tmp = tempfile.TemporaryDirectory()
    extract_old_tree(args.commit, Path(tmp.name))
    import lone_engines.types as old_types
    from lone_engines.mlx_chat.engine import ChatEngine as LoneChatEngine
    from lone_engines.mlx_chat.mtp import preload_drafter as old_preload_drafter
    from lone_engines.speculative.rounds import session_stats as old_session_stats
    from lone_replay import ReplayMTPProposer

    lone = LoneChatEngine.load(str(target_dir))
    old_preload_drafter(lone, str(assistant_dir))

    def old_replaying(drafter, target, **_):
        proposer = ReplayMTPProposer(drafter, target, True, True, reference=reference, error_rate=ERROR_RATE, seed=SEED)
        proposer.seen = mo.Unkept()
        return proposer

    lone.mtp_proposer = old_replaying

    def decode(engine, tree_types, stats_of, method: str | None):
        spec = (tree_types.SpecConfig(method=method, steps=STEPS, draft_model=str(assistant_dir)) if method
                else tree_types.SpecConfig())
        rounds = list(engine.generate(tree_types.Request(prompt=mo.PROMPT, max_tokens=args.tokens, spec=spec)))
        assert [t for r in rounds for t in r.tokens] == reference[len(ids):], "output differs from plain decoding"
        return stats_of(rounds)

    runs = {
        "ours mtp": lambda: decode(ours, types, session_stats, "mtp"),
        "lone mtp": lambda: decode(lone, old_types, old_session_stats, "mtp"),
        "ours plain": lambda: decode(ours, types, session_stats, None),
        "lone plain": lambda: decode(lone, old_types, old_session_stats, None),
    }
    for run in [*runs.values(), *runs.values()]:  # warm-up: the compiled drafter step traced in both
        run()
    tok_s = {name: [] for name in runs}
    taus = {}
    for i in range(args.runs):
        for name in list(runs) if i % 2 == 0 else list(runs)[::-1]:
            stats = runs[name]()
            tok_s[name].append(stats.decode_tok_s)
            taus[name] = stats.tau

    print(f"small Gemma 4, {STEPS} drafts a round, {args.tokens} tokens, {args.runs} runs each, alternating; "
          f"lone loop: {args.commit}; OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}")
    for name, values in tok_s.items():
        print(f"  {name:10s} {statistics.median(values):7.1f} tok/s ({min(values):.1f}..{max(values):.1f})  tau {taus[name]:.2f}")
    for kind in ("mtp", "plain"):
        ratios = [a / b for a, b in zip(tok_s[f"ours {kind}"], tok_s[f"lone {kind}"])]
        logs = [math.log(r) for r in ratios]
        mean = math.exp(statistics.mean(logs))
        half = 1.96 * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("nan")
        print(f"{kind}: ours / lone loop, median of pairs {statistics.median(ratios):.3f}; geometric mean {mean:.3f} "
              f"(95%: {mean * math.exp(-half):.3f}..{mean * math.exp(half):.3f})")


if __name__ == "__main__":
    main()
