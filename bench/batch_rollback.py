"""The mlx-lm server plan's P1.5 gate, measured on a real model (the embedded SmolLM2): how should
each row of a batch roll back its rejected drafts?

  A. per-sequence offsets -- what engines/batch does: every slot carries its position, the mask
     is built from them, a rejected tail is marked dead (nothing moves; dead slots are compacted
     away now and then);
  B. uniform acceptance on mlx-lm's BatchKVCache -- every row keeps only the batch's shortest
     accepted prefix (plus its target token), so one `trim(n)` serves all rows (the plan's
     "Phase 1 simplification"; lossless, but a row's extra accepted drafts are thrown away);
  C. uniform trim + re-forward -- trim to the shortest prefix and feed the longer rows' extra
     accepted tokens again; that second forward is ragged too, so on BatchKVCache it needs the
     per-row masking of A anyway: it is priced here as A's step plus one forward of the width of
     the longest re-feed, whenever the rows' acceptances differ.

Two measurements: (1) one forward of B rows x W tokens over a ~400-token context, through A's
slot cache and through BatchKVCache (the cost of building the mask from positions, and of
attending over dead slots); (2) the copy-heavy prompts 4 at a time, n-gram with 5 drafts, T=0,
through the batch loop with each row's own acceptance (A) and with the batch minimum (B):
aggregate tok/s, tokens per row-step, and the steps where acceptances differed (C's re-forwards).

    python bench/batch_rollback.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import BatchKVCache  # noqa: E402

from engines.batch.cache import BatchCache  # noqa: E402
from engines.batch.engine import BatchEngine, settle_row  # noqa: E402
from engines.concurrent_runs import run_batched, summarize  # noqa: E402
from engines.speculative.verify import Verdict  # noqa: E402
from engines.types import Request, SpecConfig  # noqa: E402


def forward_ms(model, cache_kind: str, batch: int, width: int, context: int = 400, reps: int = 7) -> float:
    """Median time of one forward of batch x width tokens after a `context`-token prompt."""
    prompt = mx.array([[1 + (i * 7) % 500 for i in range(context)]] * batch, dtype=mx.uint32)
    if cache_kind == "slots":
        cache = BatchCache(model, batch)
        cache.begin(context)
        model(prompt, cache=cache.layers)
        cache.settle([context] * batch)
        layers = cache.layers
    else:
        layers = [BatchKVCache([0] * batch) for _ in model.layers]
        model(prompt, cache=layers)
    mx.eval([c.keys for c in layers])
    x = mx.array([[5] * width] * batch, dtype=mx.uint32)
    times = []
    for _ in range(reps):
        if cache_kind == "slots":
            cache.begin(width)
        t0 = time.perf_counter()
        mx.eval(model(x, cache=layers))
        times.append(1000 * (time.perf_counter() - t0))
        if cache_kind == "slots":
            cache.settle([0] * batch)  # the tokens die: the context stays the same for every rep
        else:
            for c in layers:
                c.trim(width)
    return statistics.median(times)


class UniformAcceptance(BatchEngine):
    """B: every row keeps the batch's shortest accepted prefix (lossless: a shorter accepted
    prefix followed by the target's own token at that position is still the target's output)."""

    differing_steps = 0
    steps_with_drafts = 0

    def _verdicts(self, plans):
        verdicts = [settle_row(p) for p in plans]
        drafted = [v.accepted for p, v in zip(plans, verdicts) if p.k]
        if not drafted:
            return verdicts
        self.steps_with_drafts += 1
        self.differing_steps += len(set(drafted)) > 1
        a = min(drafted)
        out = []
        for p, v in zip(plans, verdicts):
            if v.accepted <= a:
                out.append(v)
            else:  # the target's token after a accepted drafts is its argmax there (T=0)
                out.append(Verdict(a, v.tokens[:a] + [int(p.argmax[a].item())]))
        return out


def main() -> None:
    from engines.mlx_chat.engine import ChatEngine
    from engines.mlx_chat.models import default_chat_model
    import resources

    chat = ChatEngine.load(str(default_chat_model()))
    report = {"forward_ms": [], "loop": []}
    print("one forward, ms (median of 7), context 400:", file=sys.stderr)
    for batch in (1, 4, 8):
        for width in (1, 3, 6):
            slots, kv = forward_ms(chat.model, "slots", batch, width), forward_ms(chat.model, "batchkv", batch, width)
            report["forward_ms"].append({"batch": batch, "width": width, "slots": slots, "batchkv": kv})
            print(f"  B={batch} W={width}: slots {slots:7.1f}  BatchKVCache {kv:7.1f}  ratio {slots / kv:.3f}",
                  file=sys.stderr, flush=True)
    prompts = json.loads(resources.path("prompts", "copy_heavy.json").read_text())["prompts"]
    requests = [(p["name"], Request(prompt=p["prompt"], max_tokens=128, spec=SpecConfig("ngram", 5)))
                for p in (prompts * 2)[:8]]
    run_batched(BatchEngine(chat, max_batch=4, budget=None), requests[:2], 2)  # warm-up
    for name, engine in (("A per-row", BatchEngine(chat, max_batch=4, budget=None)),
                         ("B uniform", UniformAcceptance(chat, max_batch=4, budget=None))):
        records, wall = run_batched(engine, requests, 4)
        s = summarize(records, wall)
        row = {"scheme": name, **{k: s[k] for k in ("aggregate_tok_s", "tokens", "proposed", "accepted", "acceptance")}}
        if isinstance(engine, UniformAcceptance):
            row["steps_where_rows_differ"] = f"{engine.differing_steps}/{engine.steps_with_drafts}"
        report["loop"].append(row | {"texts": [r.text for r in records]})
        print(f"  {name}: {s['aggregate_tok_s']:.1f} tok/s aggregate, acceptance {s['acceptance']:.2f} "
              f"({s['accepted']}/{s['proposed']}) {row.get('steps_where_rows_differ', '')}", file=sys.stderr, flush=True)
    same = report["loop"][0]["texts"] == report["loop"][1]["texts"]
    print(f"  outputs identical: {same}", file=sys.stderr)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"batch-rollback-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
