"""The one check of a Request's parameters, shared by the CLI, the GUI and the server.

`validate(request, context_length)` raises InvalidParameter -- an EngineError whose message is
one line naming the parameter by its Request / OpenAI name ("temperature", "top_p", ...).
Callers that spell parameters differently (the CLI's --temp) re-label it with `.name`.
What needs the tokenized prompt (prompt + max_tokens against the context) is the engine's
check, made before prefill; here max_tokens alone is held against the context.
"""

from __future__ import annotations

import math

from engines.types import EngineError, Request
from engines.speculative.schedule import MAX_STEPS

SEED_LIMIT = 2**64  # mx.random.seed takes an unsigned 64-bit int; numpy's default_rng any >= 0
METHODS = ("off", "ngram", "draft", "mtp")


class InvalidParameter(EngineError):
    """One request parameter out of range. `name` is the Request field, `problem` the rest."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name} {problem}")
        self.name = name
        self.problem = problem


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(request: Request, context_length: int | None = None) -> None:
    """Raise InvalidParameter for the first parameter out of range; return None if all are fine."""
    s = request.sampling
    if not _number(s.temperature) or not math.isfinite(s.temperature) or s.temperature < 0:
        raise InvalidParameter("temperature", f"must be a finite number >= 0, got {s.temperature!r}")
    if not _number(s.top_p) or not math.isfinite(s.top_p) or not 0 < s.top_p <= 1:
        raise InvalidParameter("top_p", f"must be in (0, 1], got {s.top_p!r}")
    if not _integer(s.top_k) or s.top_k < 0:
        raise InvalidParameter("top_k", f"must be a whole number >= 0 (0 = off), got {s.top_k!r}")
    if not _number(s.min_p) or not math.isfinite(s.min_p) or not 0 <= s.min_p <= 1:
        raise InvalidParameter("min_p", f"must be in [0, 1] (0 = off), got {s.min_p!r}")
    if s.seed is not None and (not _integer(s.seed) or not 0 <= s.seed < SEED_LIMIT):
        raise InvalidParameter("seed", f"must be a whole number from 0 to 2**64 - 1, got {s.seed!r}")
    if not _integer(request.max_tokens) or request.max_tokens < 1:
        raise InvalidParameter("max_tokens", f"must be a whole number >= 1, got {request.max_tokens!r}")
    if context_length is not None and request.max_tokens >= context_length:
        raise InvalidParameter(
            "max_tokens", f"of {request.max_tokens} does not fit the model's context of {context_length} tokens")
    if not _integer(request.max_repeat) or request.max_repeat < 0 or request.max_repeat == 1:
        raise InvalidParameter("max_repeat", f"must be 0 (off) or a number of copies >= 2, got {request.max_repeat!r}")
    for stop in request.stop:
        # "" would match at once and cut the output to nothing; a non-string is a caller's bug
        if not isinstance(stop, str) or stop == "":
            raise InvalidParameter("stop", f"strings must be non-empty text, got {stop!r}")
    _validate_spec(request)


def _validate_spec(request: Request) -> None:
    spec = request.spec
    if spec.method not in METHODS:
        raise InvalidParameter("spec", f"method must be one of {', '.join(METHODS)}, got {spec.method!r}")
    if not _integer(spec.steps) or not 0 <= spec.steps <= MAX_STEPS:
        raise InvalidParameter("steps", f"must be between 0 and {MAX_STEPS}, got {spec.steps!r}")
    if not _integer(spec.skip_streak) or spec.skip_streak < 0:
        raise InvalidParameter("skip_streak", f"must be >= 0, got {spec.skip_streak!r}")
    if not _integer(spec.ngram_max) or spec.ngram_max < 1:
        raise InvalidParameter("ngram_max", f"must be >= 1, got {spec.ngram_max!r}")
    if not _integer(spec.ngram_min) or not 1 <= spec.ngram_min <= spec.ngram_max:
        raise InvalidParameter("ngram_min", f"must be between 1 and ngram_max ({spec.ngram_max}), got {spec.ngram_min!r}")
    if not _integer(spec.max_steps) or not 1 <= spec.max_steps <= MAX_STEPS:
        raise InvalidParameter("max_steps", f"must be between 1 and {MAX_STEPS}, got {spec.max_steps!r}")
    if not _integer(spec.min_steps) or not 1 <= spec.min_steps <= spec.max_steps:
        raise InvalidParameter("min_steps", f"must be between 1 and max_steps ({spec.max_steps}), got {spec.min_steps!r}")
