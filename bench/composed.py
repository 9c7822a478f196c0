"""Composed drafting (n-gram lookup beside an MTP drafter, engines/speculative/composed.py)
against MTP alone and n-gram alone, on a mixed set of inputs that copy and inputs that do not.
The tuning issue's goal: composed >= the better of either alone on the mixed set, for

  gemma4   the tiny Gemma 4 pair of the tests (dense target, tests/engines/mlx_chat/gemma4/checkpoints.py)
           with its assistant trained on the target (tests/engines/mlx_chat/gemma4/trained.py; cached,
           the first run trains for minutes), MLX on the CPU. Its random target copies nothing
           (no input is copy-heavy: its "mixed" set is its open set), so also
  gemma4_copying  the same pair with its target trained to copy where its context repeats and
           to walk a fixed cycle of words where it does not (tests/engines/mlx_chat/gemma4/copying.py;
           cached, the first run trains it for ~6 minutes), the assistant trained on it as above;
  glm_ocr  the tiny GLM-OCR of the tests with its MTP layer trained for chains
           (tests/engines/glm_ocr/checkpoints.trained_glm_ocr; cached), the PyTorch runtime.

    python bench/composed.py [--only gemma4|gemma4_copying|glm_ocr] [--tokens N] [--repeats 3]

Per model, per set (copy-heavy, open, and the two together: mixed) and per method (plain,
mtp, ngram, mtp+ngram = --with-ngram), at T = 0, each method's default draft length (MTP 2,
n-gram 5; composed chains 2 and drafts n-gram continuations up to 7): tokens per target
forward (decode rounds only) and decode tok/s (the rounds' wall time, prefill excluded), and
composed / the better of mtp and ngram. Every output is checked against plain decoding's.

Which inputs copy is measured, not assumed: an input is copy-heavy when n-gram lookup alone
accepts at least half of what it drafts on it (the tiny models' outputs are what they are: a
prompt that repeats itself need not make them repeat it). The repetition guard is off: these
tiny models loop, and looping is the copying the lookup reads ahead.

One thread each (torch.set_num_threads(1), OPENBLAS_NUM_THREADS=1): two threads on a 2-core
shared machine can make a tiny model's ops hundreds of times slower. The machine is shared and
noisy: every repeat runs every method on every input, in an order rotating between repeats;
tok/s is the median over repeats of each method's total tokens / total decode seconds, and the
best of them (interference only ever slows a run down).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines.cpu.preload import preload_cpu_libraries  # noqa: E402

preload_cpu_libraries()  # the process environment `specscope` runs in (engines/cpu: MLX on OpenBLAS)

import torch  # noqa: E402

torch.set_num_threads(1)

from engines.types import Request, SpecConfig  # noqa: E402

METHODS = ("plain", "mtp", "ngram", "mtp+ngram")
COPY_THRESHOLD = 0.5  # n-gram acceptance at or above which an input counts as copy-heavy


@dataclass
class Totals:
    tokens: int = 0
    rounds: int = 0
    seconds: float = 0.0
    proposed: int = 0
    accepted: int = 0

    def add(self, rounds) -> None:
        decode = [r for r in rounds if not r.prefill]
        self.tokens += sum(len(r.tokens) for r in decode)
        self.rounds += sum(1 for r in decode if r.tokens)
        self.seconds += sum(r.wall_s for r in decode)
        self.proposed += sum(r.proposed for r in decode)
        self.accepted += sum(r.accepted for r in decode)


@dataclass
class Case:
    name: str
    request: Callable  # method -> Request
    copy: bool = False
    plain: list[int] = field(default_factory=list)


def run_cases(engine, cases: list, repeats: int) -> dict:
    """{method: {set: (tokens/forward, median and best tok/s, acceptance)}}; asserts lossless.
    Tokens per forward and acceptance are the first repeat's (with measured costs the choices
    move a little from repeat to repeat)."""
    for case in cases:  # the reference output, and which set the input belongs to
        case.plain = [t for r in engine.generate(case.request("plain")) for t in r.tokens]
        ngram = Totals()
        ngram.add(list(engine.generate(case.request("ngram"))))
        case.copy = ngram.proposed > 0 and ngram.accepted / ngram.proposed >= COPY_THRESHOLD
    sets = {"copy-heavy": [c for c in cases if c.copy], "open": [c for c in cases if not c.copy], "mixed": cases}
    per_repeat = {m: {s: [] for s in sets} for m in METHODS}
    for rep in range(repeats):
        order = METHODS[rep % len(METHODS):] + METHODS[: rep % len(METHODS)]
        for method in order:
            by_case = {}
            for case in cases:
                rounds = list(engine.generate(case.request(method)))
                out = [t for r in rounds for t in r.tokens]
                if out != case.plain:
                    raise SystemExit(f"{method} on {case.name}: not plain decoding's output")
                by_case[case.name] = rounds
            for name, members in sets.items():
                totals = Totals()
                for case in members:
                    totals.add(by_case[case.name])
                per_repeat[method][name].append(totals)
    out = {}
    for method in METHODS:
        out[method] = {}
        for name in sets:
            runs = per_repeat[method][name]
            if not runs or not runs[0].rounds:
                continue
            first = runs[0]
            speeds = [t.tokens / t.seconds for t in runs]
            out[method][name] = (first.tokens / first.rounds, statistics.median(speeds), max(speeds),
                                 first.accepted / first.proposed if first.proposed else None)
    return {"sets": {name: [c.name for c in members] for name, members in sets.items()}, "results": out}


def report(title: str, measured: dict) -> None:
    print(f"\n{title}")
    for name, members in measured["sets"].items():
        print(f"  {name}: {', '.join(members) or '(none)'}")
    results = measured["results"]
    print(f"  {'set':<11} {'method':<10} {'tok/fwd':>8} {'tok/s':>9} {'best':>9} {'accept':>7}")
    for name in measured["sets"]:
        for method in METHODS:
            if name not in results[method]:
                continue
            tpf, tps, best, acc = results[method][name]
            print(f"  {name:<11} {method:<10} {tpf:8.2f} {tps:9.1f} {best:9.1f} {'' if acc is None else f'{acc:7.2f}'}")
        if name in results["mtp+ngram"]:
            def ratio(i):
                return results["mtp+ngram"][name][i] / max(results["mtp"][name][i], results["ngram"][name][i])

            print(f"  {name:<11} composed / best of either: tok/fwd {ratio(0):.2f}, tok/s {ratio(1):.2f} "
                  f"(best of repeats {ratio(2):.2f})")


# ------------------------------------------------------------------------------ gemma4


# The tiny random Gemma 4 target does not copy its prompt: on 40 random prompts of 3-6 words the
# n-gram lookup predicted at most 12% of its 96-token outputs. So its set is the prompts its
# assistant was trained on, the two of those 40 whose outputs loop the most, a prompt that
# repeats itself, and three more; which of them count as copy-heavy is measured as for OCR.
GEMMA_PROMPTS = {"loops0": "w40 w78 w81 w26", "loops1": "w73 w81 w68",
                 "repeats": "w10 w20 w30 w40 w50 w10 w20 w30 w40 w50 w10 w20 w30 w40 w50 w10 w20",
                 "open0": "w33 w61 w2", "open1": "w90 w11 w57 w3", "open2": "w5 w66 w21"}


# The target of tests/engines/mlx_chat/gemma4/copying.py, trained on a law: copy where the context
# repeats, else walk one fixed cycle of the words. Its prompts that repeat a phrase make answers
# that copy it; its prompts of distinct words walk the cycle (which n-gram lookup cannot predict)
# until the walk meets a prompt word or the law, learned in part, slips into a loop. The
# assistant is trained on it as on the random target (trained.py: TRAIN_PROMPTS' answers).
# Which inputs count as copy-heavy is measured, as for the others.
COPYING_PROMPTS = {"phrase0": "w10 w20 w30 w40 w10 w20 w30 w40 w10 w20",
                   "phrase1": "w77 w301 w12 w77 w301 w12 w77",
                   "phrase2": "w5 w66 w21 w400 w9 w5 w66 w21 w400 w9 w5",
                   "fresh0": "w33 w61 w2", "fresh1": "w90 w11 w57 w3", "fresh2": "w250 w140 w480 w19 w7"}


def gemma4(tokens: int, repeats: int, copying: bool = False) -> None:
    from engines.factory import load_engine
    from tests.engines.mlx_chat.gemma4.checkpoints import DENSE_TARGET, AssistantSpec, build_assistant, build_target
    from tests.engines.mlx_chat.gemma4.copying import copying_target
    from tests.engines.mlx_chat.gemma4.trained import TRAIN_PROMPTS, trained_assistant

    root = Path(tempfile.mkdtemp(prefix="bench-composed-gemma4-"))
    # the tests' dense pair, byte for byte, or its target trained on the copying law
    target = copying_target() if copying else build_target(root / "target", DENSE_TARGET)
    assistant = build_assistant(root / "assistant", target, AssistantSpec())
    engine = load_engine("chat", str(target))
    engine.__dict__.setdefault("mtp_drafters", {})[str(assistant)] = trained_assistant(engine, target, assistant)
    specs = {"plain": SpecConfig(), "mtp": SpecConfig("mtp", 2, draft_model=str(assistant)),
             "ngram": SpecConfig("ngram", 5),
             "mtp+ngram": SpecConfig("mtp", 2, draft_model=str(assistant), compose_ngram=True)}

    def case(name, prompt):
        return Case(name, lambda m: Request(prompt=prompt, max_tokens=tokens, spec=specs[m], max_repeat=0))

    prompts = {f"trained{i}": p for i, p in enumerate(TRAIN_PROMPTS[:3])} | (COPYING_PROMPTS if copying else GEMMA_PROMPTS)
    measured = run_cases(engine, [case(n, p) for n, p in prompts.items()], repeats)
    what = "its target trained to copy (tests/engines/mlx_chat/gemma4/copying.py)" if copying else "dense, random target"
    report(f"tiny Gemma 4 pair ({what}), trained assistant, MLX CPU, {tokens} tokens per prompt", measured)


# ------------------------------------------------------------------------------ glm_ocr


def table_page(rows: int = 12):
    """A page of repeated table rows (what a real OCR model copies row after row)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (224, 16 * rows + 16), "white")
    draw = ImageDraw.Draw(image)
    for r in range(rows):
        draw.text((6, 6 + 16 * r), "| 12 | apples | 3.50 |", fill="black")
    return image


def glm_ocr(tokens: int, repeats: int) -> None:
    from engines.glm_ocr.engine import OcrEngine
    from tests.engines.glm_ocr.checkpoints import test_images, trained_glm_ocr

    model_dir, trained = trained_glm_ocr()
    root = Path(tempfile.mkdtemp(prefix="bench-composed-ocr-"))
    pages = {f"trained{i}": Path(p) for i, p in enumerate(trained)}
    for i, image in enumerate(test_images(8, seed=7)[4:]):  # pages the MTP layer never saw
        pages[f"unseen{i}"] = root / f"unseen{i}.png"
        image.save(pages[f"unseen{i}"])
    pages["table"] = root / "table.png"
    table_page().save(pages["table"])
    engine = OcrEngine.load(model_dir, runtime="torch", cache_length=1024)
    engine.repetition = None
    specs = {"plain": SpecConfig(), "mtp": SpecConfig("mtp", 2), "ngram": SpecConfig("ngram", 5),
             "mtp+ngram": SpecConfig("mtp", 2, compose_ngram=True)}

    def case(name, path):
        return Case(name, lambda m: Request(kind="ocr", image=str(path), max_tokens=tokens, spec=specs[m]))

    measured = run_cases(engine, [case(n, p) for n, p in pages.items()], repeats)
    report(f"tiny GLM-OCR, MTP layer trained for chains, PyTorch runtime ({engine.runtime.dtype_name}, "
           f"1 thread), {tokens} tokens per page", measured)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["gemma4", "gemma4_copying", "glm_ocr"], default=None)
    ap.add_argument("--tokens", type=int, default=None,
                    help="tokens per input (default: 160 per OCR page, 40 per Gemma 4 prompt: the span its "
                         "assistant was trained on)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.only in (None, "glm_ocr"):
        glm_ocr(args.tokens or 160, args.repeats)
    if args.only in (None, "gemma4"):
        gemma4(args.tokens or 40, args.repeats)
    if args.only in (None, "gemma4_copying"):
        gemma4(args.tokens or 40, args.repeats, copying=True)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
