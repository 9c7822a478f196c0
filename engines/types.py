"""The engines' shared types: Request (with its SpecConfig and Sampling), the Engine protocol,
EngineError, PrefillProgress, and Round (defined in engines.speculative.rounds, re-exported here).

Imports no engine, so every engine, the CLI, the GUI and the server import it without pulling
in MLX or torch; the factory that picks an engine is engines.factory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Literal, Protocol

from engines.speculative.repetition import DEFAULT_MAX_REPEAT
from engines.speculative.rounds import Round  # re-exported: the one thing generate() yields

SpecMethod = Literal["off", "ngram", "draft", "mtp"]


class EngineError(Exception):
    """A user-facing problem (bad model path, bad input...). Its message is one clear line."""


def one_line(e: BaseException) -> str:
    """The first line of an error's message (at most 300 characters), for an EngineError's."""
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


@dataclass
class SpecConfig:
    """How to speculate. steps = drafts proposed per round (B - 1); 0 means plain decoding."""

    method: SpecMethod = "off"
    steps: int = 3
    adaptive: bool = False
    min_steps: int = 1  # adaptive lower bound
    max_steps: int = 7  # adaptive upper bound
    skip_streak: int = 0  # after this many zero-accept rounds skip drafting once; 0 = off
    draft_model: str | None = None  # path, for method "draft" (and the assistant for "mtp")
    ngram_min: int = 1
    ngram_max: int = 4
    compose_ngram: bool = False  # with a model drafter: n-gram lookup beside it, per round the better (speculative/composed.py)
    auto: bool = False  # --steps auto: k per round from this machine's costs (engines/speculative/tuning.py)
    profile: str | None = None  # auto's tuning profile, or the folder of profiles (`specscope tune`); None: measured in the run

    @property
    def enabled(self) -> bool:
        return self.method != "off" and self.steps > 0


@dataclass
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Request:
    """One run. `kind` picks the engine; chat uses prompt/system/history, OCR uses image/task."""

    kind: Literal["chat", "ocr"] = "chat"
    prompt: str = ""
    system: str | None = None
    history: list[dict] = field(default_factory=list)  # earlier {"role", "content"} turns
    image: str | None = None
    task: Literal["text", "table", "formula"] = "text"
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # stop strings (chat); the text ends before them
    ignore_chat_template: bool = False
    max_repeat: int = DEFAULT_MAX_REPEAT  # stop when one block repeats this many times; 0 = off
    spec: SpecConfig = field(default_factory=SpecConfig)
    sampling: Sampling = field(default_factory=Sampling)

    def to_dict(self) -> dict:
        return asdict(self)


ShouldStop = Callable[[], bool]


@dataclass(frozen=True)
class PrefillProgress:
    """How far the prompt has been read (prefill), reported after each chunk of a long prompt."""

    done: int  # prompt tokens read so far
    total: int
    elapsed_s: float

    @property
    def tok_s(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (an underestimate: later chunks attend to more)."""
        return (self.total - self.done) / self.tok_s if self.tok_s > 0 else None

    def describe(self) -> str:
        eta = f", about {self.eta_s:.0f} s left" if self.eta_s is not None else ""
        return f"reading the prompt: {self.done}/{self.total} tokens, {self.tok_s:.0f} tok/s{eta}"


OnPrefill = Callable[[PrefillProgress], None]


class Engine(Protocol):
    """What the worker thread and the CLI drive. `generate` is a generator of Rounds; the
    caller may stop iterating between rounds (cancel), and `should_stop` is polled between
    rounds (and between prefill chunks) so the last Round says finish="cancelled".
    `on_prefill` hears how a long prompt's prefill is going (engines may never call it)."""

    model_path: str

    def generate(self, request: Request, should_stop: ShouldStop | None = None, *,
                 on_prefill: OnPrefill | None = None) -> Iterator[Round]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def model_info(self) -> dict: ...


__all__ = ["Engine", "EngineError", "OnPrefill", "PrefillProgress", "Request", "Round", "Sampling", "ShouldStop",
           "SpecConfig", "SpecMethod"]
