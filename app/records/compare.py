"""An A/B compare: the same input with speculation off, then on; speedup and identity. No Qt."""

from __future__ import annotations

from dataclasses import dataclass

from engines.speculative.session import Session


@dataclass
class CompareResult:
    off: Session
    on: Session
    identical: bool
    first_difference: int | None  # token position, when the outputs differ
    decode_speedup: float  # decode tok/s on / off
    wall_speedup: float  # total wall time off / on

    def summary(self) -> str:
        off_s, on_s = self.off.stats(), self.on.stats()
        same = ("outputs identical \u2713" if self.identical
                else f"outputs differ from token {self.first_difference}")
        return (f"A/B: speculation on is {self.decode_speedup:.2f}\u00d7 the decode speed "
                f"({off_s.decode_tok_s:.1f} \u2192 {on_s.decode_tok_s:.1f} tok/s; wall time "
                f"{self.wall_speedup:.2f}\u00d7) \u00b7 {same}")


def compare_sessions(off: Session, on: Session) -> CompareResult:
    a, b = off.tokens, on.tokens
    diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if diff is None and len(a) != len(b):
        diff = min(len(a), len(b))
    off_s, on_s = off.stats(), on.stats()
    decode = on_s.decode_tok_s / off_s.decode_tok_s if off_s.decode_tok_s else 0.0
    wall = off_s.wall_s / on_s.wall_s if on_s.wall_s else 0.0
    return CompareResult(off, on, diff is None, diff, decode, wall)
