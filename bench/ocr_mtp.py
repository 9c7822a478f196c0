"""GLM-OCR speculation on the PyTorch runtime, measured against plain decoding in the same
process (a tiny checkpoint built here in the real format: no model download).

    python bench/ocr_mtp.py [--hidden 256 --layers 4] [--error-rate 0.2] [--tokens 96]
    python bench/ocr_mtp.py --only-depth [--chain-from normed] [--model DIR --images PNG...]

1. Tokens per target forward at steps 1..7 with a benchmark-only replay drafter (the target's
   own greedy output, each draft replaced by a wrong token with probability error_rate), the
   ideal tokens per forward for that acceptance, and the realized / ideal speedup (wall time).
2. The tests' MTP layer trained for chains on the target's own outputs (cached per machine,
   tests/engines/glm_ocr/checkpoints.py), or a real checkpoint given with --model/--images:
   acceptance and tokens per target forward at steps 1..7; --chain-from normed measures
   SGLang's way of continuing a chain against the engine's (vLLM's).
3. The cost of MTP KV prefill per prompt token, batched (torch) and row by row (as the seq_len-1
   Core ML package runs), next to the target's own prefill cost per token.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engines.types import Request, SpecConfig  # noqa: E402
from engines.glm_ocr.engine import MtpDrafter, OcrEngine  # noqa: E402
from engines.glm_ocr.positions import text_rope  # noqa: E402
from engines.speculative.rounds import session_stats  # noqa: E402
from tests.engines.glm_ocr.checkpoints import make_tiny_glm_ocr, test_images, trained_glm_ocr  # noqa: E402
from tests.engines.glm_ocr.replay import ReplayDrafter  # noqa: E402


class NormedChainDrafter(MtpDrafter):
    """Benchmark-only: continues a chain from the MTP output after shared_head.norm, as SGLang
    does (the engine follows vLLM: before the norm; docs/glm-ocr-mtp-convention.md)."""

    def chain_hidden(self, raw, head):
        return head


def by_depth(chain_from: str, max_tokens: int, model_dir=None, images=None, train_steps: int = 150,
             train_tokens: int = 96) -> None:
    """Acceptance and tokens per target forward at steps 1..7 on the tests' tiny checkpoint
    with its MTP layer trained for chains on its own greedy outputs (`train_steps` Adam steps on
    `train_tokens`-token continuations of 4 images, cached per machine by
    checkpoints.trained_glm_ocr; 30 and 64 give the test suite's layer), or on `model_dir`."""
    if model_dir is None:
        model_dir, images = trained_glm_ocr(steps=train_steps, max_new_tokens=train_tokens)
    engine = OcrEngine.load(model_dir, cache_length=512)
    engine.repetition = None
    print(f"\n2. MTP layer of {model_dir} ({len(images)} images, {max_tokens} tokens), chain from the "
          f"{chain_from} MTP output: acceptance and tokens per target forward by depth")
    print(f"{'steps':>5} {'accepted/proposed':>18} {'rate':>5} {'tok/fwd':>8}")
    for steps in range(1, 8):
        rounds_all = []
        for p in images:
            drafter = None
            if chain_from == "normed":
                prompt = engine._prompt(Request(kind="ocr", image=str(p), max_tokens=max_tokens))
                drafter = NormedChainDrafter(engine.runtime, prompt.positions, engine.config.eos_token_ids)
            rounds_all += run(engine, p, steps, max_tokens, drafter)[1]
        s = session_stats(rounds_all)
        print(f"{steps:>5} {s.accepted:>8}/{s.proposed:<9} {s.acceptance_rate:>5.2f} {s.tau:>8.2f}")


def run(engine, image, steps, max_tokens, drafter=None):
    req = Request(kind="ocr", image=str(image), max_tokens=max_tokens,
                  spec=SpecConfig(method="mtp" if steps else "off", steps=steps))
    rounds = list(engine.generate(req, drafter=drafter))
    return [t for r in rounds for t in r.tokens], rounds


def decode_time(rounds):
    return sum(r.wall_s for r in rounds if not r.prefill)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--error-rate", type=float, default=0.2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chain-from", choices=("raw", "normed"), default="raw",
                    help="section 2: continue chains from the MTP output before (raw, vLLM) or after "
                         "(normed, SGLang) shared_head.norm")
    ap.add_argument("--only-depth", action="store_true", help="run section 2 only")
    ap.add_argument("--model", help="section 2 on this GLM-OCR checkpoint directory (with --images)")
    ap.add_argument("--images", nargs="*", help="section 2's images when --model is given")
    ap.add_argument("--train-steps", type=int, default=150, help="section 2: training steps of the tiny MTP layer")
    ap.add_argument("--train-tokens", type=int, default=96, help="section 2: length of the continuations it trains on")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.only_depth or args.model:
        by_depth(args.chain_from, args.tokens, args.model, args.images, args.train_steps, args.train_tokens)
        return

    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_glm_ocr(Path(tmp) / "ckpt", hidden_size=args.hidden, num_hidden_layers=args.layers,
                                 intermediate_size=args.hidden * 3 // 2)
        images = test_images(4)
        image_paths = []
        for i, im in enumerate(images):
            image_paths.append(Path(tmp) / f"img{i}.png")
            im.save(image_paths[-1])
        engine = OcrEngine.load(path, cache_length=512)
        engine.repetition = None
        cfg = engine.config.text
        print(f"tiny GLM-OCR: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, vocab {cfg.vocab_size}; "
              f"seq_len {engine.runtime.seq_len}; torch {torch.__version__} (1 thread)")

        # 1. replay drafter
        image = image_paths[0]
        reference, _ = run(engine, image, 0, args.tokens)
        plain_t = min(decode_time(run(engine, image, 0, args.tokens)[1]) for _ in range(args.repeats))
        plain_per_tok = plain_t / (len(reference) - 1)
        alpha = 1 - args.error_rate
        print(f"\n1. replay drafter, error rate {args.error_rate} ({len(reference)} tokens; plain decode "
              f"{plain_per_tok * 1e3:.2f} ms/token)")
        print(f"{'steps':>5} {'tok/fwd':>8} {'ideal':>6} {'accept':>7} {'speedup':>8} {'ideal':>6} {'real/ideal':>10}")
        for steps in range(1, 8):
            best = None
            for rep in range(args.repeats):
                drafter = ReplayDrafter(reference, args.error_rate, cfg.vocab_size, seed=rep)
                tokens, rounds = run(engine, image, steps, args.tokens, drafter)
                assert tokens == reference, "speculation changed the output"
                t = decode_time(rounds)
                best = (t, rounds) if best is None or t < best[0] else best
            t, rounds = best
            # plain decoding timed again next to each row: the machine's load drifts
            plain_t = min(decode_time(run(engine, image, 0, args.tokens)[1]) for _ in range(args.repeats))
            plain_per_tok = plain_t / (len(reference) - 1)
            stats = session_stats(rounds)
            ideal_tau = (1 - alpha ** (steps + 1)) / (1 - alpha)
            speedup = plain_per_tok / (t / (len(reference) - 1))
            print(f"{steps:>5} {stats.tau:>8.2f} {ideal_tau:>6.2f} {stats.acceptance_rate:>7.2f} "
                  f"{speedup:>7.2f}x {ideal_tau:>5.2f}x {speedup / ideal_tau:>10.2f}")

        # 2. the trained MTP layer by depth
        by_depth(args.chain_from, args.tokens, train_steps=args.train_steps, train_tokens=args.train_tokens)

        # 3. MTP KV prefill cost
        req = Request(kind="ocr", image=str(image), max_tokens=1)
        prompt = engine._prompt(req)
        positions, rt, n = prompt.positions, engine.runtime, len(prompt.ids)
        t0 = time.perf_counter()
        rt.reset()
        hiddens = engine.prefill(prompt)
        target_prefill = time.perf_counter() - t0
        cos, sin = text_rope(positions.rows(0, n - 1), cfg)
        nxt = prompt.embeds[1:]
        t0 = time.perf_counter()
        rt.mtp(hiddens[:-1], nxt, 0, cos, sin)
        batched = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(n - 1):
            rt.mtp(hiddens[i : i + 1], nxt[i : i + 1], i, cos[i : i + 1], sin[i : i + 1])
        row_by_row = time.perf_counter() - t0
        print(f"\n3. prompt of {n} tokens: target prefill {target_prefill / n * 1e3:.3f} ms/token; MTP KV prefill "
              f"{batched / (n - 1) * 1e3:.3f} ms/token batched, {row_by_row / (n - 1) * 1e3:.3f} ms/token row by row "
              f"({row_by_row / target_prefill:.2f}x the target prefill)")


if __name__ == "__main__":
    main()
