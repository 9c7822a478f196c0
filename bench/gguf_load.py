"""Load time, memory and plain decode speed of GGUF models through engines.mlx_chat.gguf.

    python bench/gguf_load.py                 # SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M
    python bench/gguf_load.py path/to/x.gguf  # any file

Each model runs in its own subprocess (fresh memory figures). Load time is measured twice:
cold tokenizer cache (conversion included) and warm. Decode: mlx_lm.stream_generate, greedy,
plain (no speculation), its own tok/s figures. RSS = resident set of the process after load
(includes Python, MLX, transformers imports), MLX = MLX's allocator's active memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a short story about a robot who learns to paint."


def rss_mb() -> float:
    with open("/proc/self/statm") as f:  # Linux; macOS falls back to the peak below
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(path: str, max_tokens: int) -> dict:
    import mlx.core as mx
    from mlx_lm import stream_generate

    from engines.mlx_chat.gguf import DTYPE, load_gguf

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    imports_rss = rss_mb()
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        model, tokenizer = load_gguf(path, tokenizer_cache=cache)
        cold = time.perf_counter() - start
        loaded_rss = rss_mb()
        del model, tokenizer
        start = time.perf_counter()
        model, tokenizer = load_gguf(path, tokenizer_cache=cache)
        warm = time.perf_counter() - start
    prompt = PROMPT
    if tokenizer.chat_template:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    for response in stream_generate(model, tokenizer, prompt, max_tokens=8):  # warm-up
        pass
    for response in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        pass
    return {
        "file": Path(path).name,
        "file_mb": round(Path(path).stat().st_size / 2**20, 1),
        "dtype": str(DTYPE),
        "load_cold_s": round(cold, 2),
        "load_warm_s": round(warm, 2),
        "rss_after_imports_mb": round(imports_rss),
        "rss_after_load_mb": round(loaded_rss),
        "mlx_active_mb": round(mx.get_active_memory() / 2**20),
        "prompt_tokens": response.prompt_tokens,
        "prefill_tok_s": round(response.prompt_tps, 1),
        "generated_tokens": response.generation_tokens,
        "decode_tok_s": round(response.generation_tps, 1),
    }


def default_models() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from engines.types import EngineError
    from engines.mlx_chat.models import default_chat_model, gemma3_270m

    paths = []
    for getter in (default_chat_model, gemma3_270m):
        try:
            paths.append(str(getter()))
        except EngineError as e:
            print(f"skipped: {e}")
    return paths


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--child":
        sys.path.insert(0, str(ROOT))
        print(json.dumps(measure(args[1], int(args[2]))))
        return
    max_tokens = 64
    for path in args or default_models():
        out = subprocess.run([sys.executable, __file__, "--child", path, str(max_tokens)], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{path}: failed\n{out.stderr[-2000:]}")
            continue
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
