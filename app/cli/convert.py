"""`specscope convert glm-ocr --from DIR --out DIR`: GLM-OCR to Core ML packages;
`specscope convert pp-doclayout-v3 [--from DIR] [--out DIR]`: the layout model to one package,
by default the installed one into the models folder, where macOS runs use it."""

from __future__ import annotations

import json
import sys

from app.cli.common import Parser, UsageError, advanced


def cmd_convert(argv: list[str]) -> int:
    p = Parser(prog="specscope convert", description="Convert a checkpoint to Core ML packages.")
    p.add_argument("what", choices=["glm-ocr", "pp-doclayout-v3"], help="the model to convert")
    p.add_argument("--from", dest="source", metavar="DIR",
                   help="HF checkpoint directory (required for glm-ocr; pp-doclayout-v3: the installed one)")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (required for glm-ocr; pp-doclayout-v3: the models folder, where "
                        "macOS runs use it)")
    more = advanced(p)
    more.add_argument("--seq-len", type=int, default=8, metavar="N", help="glm-ocr: tokens per decoder call (default 8)")
    more.add_argument("--cache-length", type=int, default=2048, metavar="N",
                      help="glm-ocr: KV cache positions (default 2048)")
    args = p.parse_args(argv)

    def progress(message: str, fraction: float) -> None:
        print(f"[{100 * fraction:5.1f}%] {message}", file=sys.stderr, flush=True)

    if args.what == "pp-doclayout-v3":
        from engines.glm_ocr.layout_convert import convert_layout

        source, out = layout_paths(args.source, args.out)
        manifest = convert_layout(source, out, progress=progress)
        print(json.dumps({name: r["max_abs_error"] for name, r in manifest["parity"].items()}, indent=1))
        print(f"specscope: converted into {out}", file=sys.stderr)
        return 0
    if args.source is None or args.out is None:
        raise UsageError("convert glm-ocr needs --from DIR and --out DIR")
    if not 2 <= args.seq_len <= 64:
        raise UsageError("--seq-len must be between 2 and 64")
    if args.cache_length < args.seq_len:
        raise UsageError("--cache-length must be at least --seq-len")
    from engines.glm_ocr.convert import convert_glm_ocr

    manifest = convert_glm_ocr(args.source, args.out, seq_len=args.seq_len, cache_length=args.cache_length, progress=progress)
    print(json.dumps(manifest.get("parity", manifest), indent=1))
    return 0


def layout_paths(source: str | None, out: str | None) -> tuple[str, str]:
    """--from and --out for the layout model: by default the downloaded pp-doclayout-v3 and its
    Core ML folder in the models folder (what `store.resolve` gives macOS runs once it exists)."""
    if source is not None and out is not None:
        return source, out
    from app.models import catalog, store
    from engines.types import EngineError

    entry = catalog.find("pp-doclayout-v3")
    if source is None:
        st = store.status(entry)
        if not st.installed or st.path is None:
            raise EngineError("pp-doclayout-v3 is not downloaded: `specscope models get pp-doclayout-v3` "
                              "(or give --from DIR)")
        source = str(st.path)
    return source, out if out is not None else str(store.coreml_dir(entry))
