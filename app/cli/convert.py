"""`specscope convert glm-ocr --from DIR --out DIR`: GLM-OCR to Core ML packages."""

from __future__ import annotations

import json
import sys

from app.cli.common import Parser, UsageError, advanced


def cmd_convert(argv: list[str]) -> int:
    p = Parser(prog="specscope convert", description="Convert a checkpoint to Core ML packages.")
    p.add_argument("what", choices=["glm-ocr"], help="the model to convert")
    p.add_argument("--from", dest="source", required=True, metavar="DIR", help="GLM-OCR HF checkpoint directory")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    more = advanced(p)
    more.add_argument("--seq-len", type=int, default=8, metavar="N", help="tokens per decoder call (default 8)")
    more.add_argument("--cache-length", type=int, default=2048, metavar="N", help="KV cache positions (default 2048)")
    args = p.parse_args(argv)
    if not 2 <= args.seq_len <= 64:
        raise UsageError("--seq-len must be between 2 and 64")
    if args.cache_length < args.seq_len:
        raise UsageError("--cache-length must be at least --seq-len")
    from engines.glm_ocr.convert import convert_glm_ocr

    def progress(message: str, fraction: float) -> None:
        print(f"[{100 * fraction:5.1f}%] {message}", file=sys.stderr, flush=True)

    manifest = convert_glm_ocr(args.source, args.out, seq_len=args.seq_len, cache_length=args.cache_length, progress=progress)
    print(json.dumps(manifest.get("parity", manifest), indent=1))
    return 0
