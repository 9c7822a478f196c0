"""`specscope drafter train [--model ID] [--data FILE...] [--minutes M] [--steps S] --out DIR`:
train an MTP drafter for a chat model on this machine (engines/training), then pair it with
the model in the user's catalog so `--spec mtp` finds it.

A progress line (loss, held-out acceptance by depth 1..5, ETA) on stderr; Ctrl-C stops at the
next step with a checkpoint (run the same command again to resume); a second Ctrl-C stops at
once (the last checkpoint is kept). Bad input is one line and exit 2 (app.cli.main).
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.cli.common import DEFAULT_CHAT_ID, EXIT_BAD_INPUT, Parser, UsageError, advanced
from app.cli.io import EXIT_INTERRUPTED, Interrupt

DEFAULT_MODEL = DEFAULT_CHAT_ID  # the embedded default (engines/mlx_chat/models.py)
DEFAULT_MINUTES = 15.0


def parser() -> Parser:
    p = Parser(prog="specscope drafter train", description="Train an MTP drafter for a chat model, on this machine.")
    p.add_argument("--out", required=True, metavar="DIR", help="the drafter's directory (resumes from its last checkpoint)")
    p.add_argument("--model", default=None, metavar="ID|PATH", help=f"the target: catalog id, hub repo id or path (default {DEFAULT_MODEL})")
    p.add_argument("--minutes", type=float, default=None, metavar="M",
                   help=f"the whole run's time: preparing the data (at most half of it: as much data as fits), "
                        f"training, the final measure (default {DEFAULT_MINUTES:g} unless --steps)")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="training steps (alone: all the data is prepared first, however long that takes)")
    p.add_argument("--data", nargs="+", default=[], metavar="FILE", help="your own text files to learn from (UTF-8)")
    p.add_argument("--sessions", action="store_true",
                   help="learn from your saved chat sessions too (their prompts and answers; they stay on this machine)")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="prompts the target answers to make training data (JSON list or {\"prompts\": [...]}; "
                        "default: the shipped set; 'none' = only --data)")
    p.add_argument("--no-register", action="store_true", help="do not pair the drafter with the model in the catalog")
    more = advanced(p)
    more.add_argument("--answers-per-prompt", type=int, default=4, metavar="N",
                      help="answers the target writes per prompt: the first greedy, the others sampled (default 4)")
    more.add_argument("--answer-tokens", type=int, default=200, metavar="N", help="tokens per answer (default 200)")
    more.add_argument("--answer-temperature", type=float, default=0.8, metavar="T",
                      help="temperature of the sampled answers (default 0.8)")
    more.add_argument("--depth", type=int, default=1, metavar="D", help="chained depths trained (default 1)")
    more.add_argument("--draft-vocab", type=int, default=4096, metavar="N",
                      help="tokens the drafter can propose (default 4096)")
    more.add_argument("--batch", type=int, default=4, metavar="N", help="sequences per step (default 4)")
    more.add_argument("--seq-len", type=int, default=256, metavar="N", help="tokens per sequence (default 256)")
    more.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default 1e-3)")
    more.add_argument("--seed", type=int, default=0, metavar="N", help="initial weights, batches and sampled answers (default 0)")
    more.add_argument("--save-every", type=int, default=50, metavar="N", help="checkpoint every N steps (default 50)")
    more.add_argument("--eval-every", type=int, default=200, metavar="N",
                      help="held-out acceptance every N steps (default 200)")
    return p


def cmd_drafter(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: specscope drafter train --out DIR [options]   (specscope drafter train --help)")
        return 0 if argv else EXIT_BAD_INPUT
    if argv[0] != "train":
        raise UsageError(f"unknown drafter command {argv[0]!r} (expected: train)")
    return train(parser().parse_args(argv[1:]))


def train(args) -> int:
    from engines.training.data import read_text_files
    from engines.training.config import TrainConfig
    from engines.training.progress import span

    for name in ("minutes", "steps", "batch", "seq_len", "depth", "save_every", "eval_every", "draft_vocab", "answer_tokens",
                 "answers_per_prompt", "answer_temperature"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    read_text_files(args.data)  # an empty or unreadable file is said now, before the model loads
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} is a file, not a directory")
    if args.sessions:
        args.data = args.data + [saved_chats_file(out)]
    if args.prompts and args.prompts != "none" and not Path(args.prompts).is_file():
        raise UsageError(f"cannot read prompts file {args.prompts}")
    minutes = args.minutes if args.minutes is not None or args.steps is not None else DEFAULT_MINUTES
    config = TrainConfig(out=out, data_files=args.data, prompts_file="" if args.prompts == "none" else args.prompts,
                         answer_tokens=args.answer_tokens, answers_per_prompt=args.answers_per_prompt,
                         answer_temperature=args.answer_temperature, steps=args.steps, minutes=minutes, seed=args.seed,
                         depth=args.depth, seq_len=args.seq_len, batch=args.batch, learning_rate=args.lr,
                         draft_vocab=args.draft_vocab, save_every=args.save_every, eval_every=args.eval_every)
    model_id = args.model or DEFAULT_MODEL
    target = target_path(model_id)
    from engines.mlx_chat.loading import load_model
    from engines.training.train import train as run_training

    print(f"specscope: loading {model_id}", file=sys.stderr, flush=True)
    loaded = load_model(target)
    meter = Meter()
    with Interrupt().installed() as interrupt:
        try:
            result = run_training(loaded.model, loaded.tokenizer, target, config, meter, interrupt)
        except KeyboardInterrupt:
            meter.finish()
            print(f"\nspecscope: stopped; the last checkpoint in {out} is kept (run the same command to resume)",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
    meter.finish()
    acc = " ".join(f"d{i + 1} {a:.0%}" for i, a in enumerate(result.acceptance)) or "-"
    print(f"specscope: drafter in {out}: {result.step} steps in {span(result.run_s)} ({span(result.prepare_s)} "
          f"preparing the data, the rest training and measuring), held-out acceptance {acc}", file=sys.stderr)
    if not result.finished and not result.step and not interrupt():
        print(f"specscope: --minutes {config.minutes:g} ran out before the first training step; the data prepared "
              f"is kept in {out}: run again with more --minutes to train on it", file=sys.stderr)
        return 1
    if not result.finished:
        print(f"specscope: stopped at step {result.step}; run the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not args.no_register:
        from app.models.lookup import register_drafter

        entry = register_drafter(model_id, out)
        if entry is not None:
            print(f"specscope: paired with {entry.pairs_with}: `specscope chat --model {model_id} --spec mtp` uses it",
                  file=sys.stderr)
    print(out)
    return 0


def saved_chats_file(out: Path) -> str:
    """The saved chat sessions as one text file in the drafter's directory: a resumed run reads
    the same data (the features cache is keyed by it), and the card names it."""
    from app.records.sessions import chat_texts, sessions_dir

    texts = chat_texts()
    if not texts:
        raise UsageError(f"--sessions: no saved chat session with an answer in {sessions_dir()}")
    path = out / "data" / "saved-chats.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():  # written once: a resumed run trains on what the first run read
        path.write_text("\n\n".join(text for _, text in texts) + "\n", encoding="utf-8")
    return str(path)


def target_path(model_id: str) -> str:
    from app.models.lookup import model_path

    return model_path(model_id, "chat")


class Meter:
    """The progress: what the run will do on lines of their own; how far it is rewritten in place
    on a terminal, otherwise a line per preparation update and per evaluation."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last_acc = None
        self.open = False  # a line being rewritten in place

    def __call__(self, p) -> None:
        if p.phase == "done":
            return
        if p.phase in ("prompts", "answers", "features"):
            self.write(f"specscope: {p.note}", lasting=p.headline)
            return
        acc = " ".join(f"d{i + 1} {a:.0%}" for i, a in enumerate(p.acceptance)) if p.acceptance else "-"
        total = f"/{p.steps}" if p.steps else ""
        eta = f"ETA {int(p.eta_s // 60)}m{int(p.eta_s % 60):02d}s" if p.eta_s is not None else ""
        line = (f"specscope: step {p.step}{total}  {p.elapsed_s / 60:.1f} min  loss {p.loss:.3f}  "
                f"held-out acceptance {acc}  {eta}")
        if self.tty or p.acceptance != self.last_acc:
            self.write(line)
        self.last_acc = p.acceptance

    def write(self, line: str, lasting: bool = False) -> None:
        if self.tty and not lasting:
            self.stream.write("\r\033[K" + line)
            self.open = True
        else:
            self.finish()
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False


__all__ = ["cmd_drafter", "EXIT_BAD_INPUT"]
