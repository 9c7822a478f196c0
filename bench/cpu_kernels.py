"""MLX's CPU exp against its power, and SmolLM2's forward with mlx-lm's attention and SwiGLU
against engines/cpu/kernels.py's, side by side in one process.

    python bench/cpu_kernels.py [--context 400] [--shapes 1x1,1x6,4x1,4x6,8x6] [--repeats 15]

It runs as the product runs (the BLAS preloaded, engines/cpu/preload.py), on a quiet machine;
ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()

import mlx.core as mx  # noqa: E402
from mlx_lm.models import activations, base, llama  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from engines.cpu import kernels as cpu_kernels  # noqa: E402
from engines.mlx_chat.loading import load_model  # noqa: E402
from engines.mlx_chat.models import default_chat_model  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def use(ours: bool) -> None:
    if ours:
        cpu_kernels.install()
    else:
        llama.scaled_dot_product_attention, llama.swiglu = base.scaled_dot_product_attention, activations.swiglu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--shapes", default="1x1,1x6,4x1,4x6,8x6", help="rows x tokens per row")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()

    x = mx.random.normal((1 << 20,))
    mx.eval(x)
    exp_ns = median_ms(lambda: mx.eval(mx.exp(x)), 20) * 1e6 / x.size
    pow_ns = median_ms(lambda: mx.eval(cpu_kernels.exp(x)), 20) * 1e6 / x.size
    print(f"elementwise, 2^20 floats: mx.exp {exp_ns:.2f} ns, 2^(x log2 e) {pow_ns:.2f} ns ({exp_ns / pow_ns:.2f}x)")

    model = load_model(str(default_chat_model())).model
    prompt = mx.random.randint(0, 1000, (1, args.context)).astype(mx.uint32)
    print(f"SmolLM2 forward over a {args.context}-token context, median of {args.repeats}, ms:")
    print("rows x tokens | mlx-lm's | cpu_kernels | ratio | max |logit diff| | same argmax")
    for shape in args.shapes.split(","):
        rows, width = (int(v) for v in shape.split("x"))
        tokens = mx.random.randint(0, 1000, (rows, width), key=mx.random.key(1)).astype(mx.uint32)
        times, logits = [], []
        for ours in (False, True):
            use(ours)
            cache = make_prompt_cache(model)
            mx.eval(model(mx.broadcast_to(prompt, (rows, args.context)), cache=cache))

            def forward():
                out = model(tokens, cache=cache)
                mx.eval(out)
                for c in cache:
                    c.trim(width)
                return out

            times.append(median_ms(forward, args.repeats))
            logits.append(forward())
        diff = mx.abs(logits[0] - logits[1]).max().item()
        same = bool((logits[0].argmax(-1) == logits[1].argmax(-1)).all().item())
        print(f"{rows} x {width} | {times[0]:.1f} | {times[1]:.1f} | {times[0] / times[1]:.2f}x | {diff:.1e} | {same}")
    use(True)


if __name__ == "__main__":
    main()
