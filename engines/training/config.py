"""One drafter training run's settings (TrainConfig)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

# "(measured)": docs/drafter.md's table "How it is trained" shows that default against its
# alternative on SmolLM2.


@dataclass
class TrainConfig:
    """`specscope drafter train`'s options and the few the command line leaves out."""

    out: Path  # the drafter's folder: checkpoints, the kept data, the published drafter
    data_files: list[str] = field(default_factory=list)  # the user's text files, trained on beside the answers
    prompts_file: str | None = None  # the prompts the target answers; None: SHIPPED_PROMPTS, "": none
    answer_tokens: int = 200  # tokens per answer the target writes
    answers_per_prompt: int = 4  # the first greedy, the others sampled at answer_temperature (measured)
    answer_temperature: float = 0.8  # the sampled answers' temperature
    own_prompts: int = 0  # prompts the target writes itself (data.own_prompts); measured no better
    steps: int | None = None  # training steps; None: as many as `minutes` leaves
    minutes: float | None = None  # the whole run, resumes included (Clock): preparing, training, measuring
    prepare_share: float = 0.5  # the most of `minutes` preparing the data may take (a choice, not measured)
    seed: int = 0  # fixes the initial weights, the held-out rows and every batch
    depth: int = 1  # chained depths trained (measured: one draft a round is what pays on a CPU)
    seq_len: int = 256  # tokens per training sequence
    batch: int = 4  # sequences per step
    learning_rate: float = 1e-3  # the rate after the warm-up
    adam_beta2: float = 0.95  # Adam's beta2, bias-corrected as EAGLE's AdamW (measured)
    decay: bool = True  # the rate falls linearly to 0 at the run's end (measured)
    warmup: int = 20  # steps of linear warm-up
    soft_labels: bool = True  # learn the target's distribution, not its greedy token alone (measured)
    teacher_k: int = 128  # soft labels as the target's k likeliest draft tokens, kept once; 0: all (measured)
    confidence_weighting: bool = True  # a position's loss times the target's confidence there (measured)
    draft_vocab: int = 4096  # the drafter's vocabulary: the most frequent labels (measured)
    feature_layers: list[int] | None = None  # target layers read beside its final state; [] none (measured)
    held_out: float = 0.1  # the share of sequences kept out of training to measure acceptance on
    save_every: int = 50  # steps between checkpoints
    eval_every: int = 200  # steps between the progress's held-out measures, counted in `minutes`

    def record(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        return d

    @classmethod
    def from_record(cls, record: dict) -> "TrainConfig":
        """The settings a card recorded (`record`), less any this trainer no longer has."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})
