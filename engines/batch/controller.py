"""The batch-aware draft controller (the mlx-lm server plan's dynamic controller, measured).

Alone, a sequence's drafts are nearly free to verify on a GPU and cost ~1.5x a plain step for
six tokens on this CPU. In a batch every row pays for the widest row (the forward is padded),
and the forward's cost grows with B x width, so drafts that pay at B=1 may not at B=8. The
controller caps every row's draft length at the k that maximises expected tokens per second
for the batch as it is now:

    k* = argmax_k  sum over rows of E[tokens | k, a_row]  /  cost(B, 1 + k)

with E[tokens | k, a] = 1 + a + ... + a^k (a = the row's acceptance so far, each drafted
position accepted with probability a given the previous ones -- the MtPC paper's throughput
model, tokens per round over round latency) and cost(B, w) = c0 + c1 * B * w fitted online to
the measured step times (least squares with forgetting, so it follows the machine). Until two
different forward sizes have been seen it does not cap (it has nothing to go on), and a
sequence alone in the batch drafts what its own settings ask (the controller answers for
what the batch costs, not for the user's choice of k). Speculation stays lossless whatever the
cap: it only changes how many drafts are offered.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.speculative.schedule import MAX_STEPS


@dataclass
class StepCosts:
    """Online least-squares fit of step seconds = c0 + c1 * tokens (B x width)."""

    forget: float = 0.98  # weight kept by older observations at each new one
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    lo: int | None = None  # smallest and largest forward sizes seen
    hi: int | None = None

    def observe(self, tokens: int, seconds: float) -> None:
        f = self.forget
        self.n, self.sx, self.sy = f * self.n + 1, f * self.sx + tokens, f * self.sy + seconds
        self.sxx, self.sxy = f * self.sxx + tokens * tokens, f * self.sxy + tokens * seconds
        self.lo = tokens if self.lo is None else min(self.lo, tokens)
        self.hi = tokens if self.hi is None else max(self.hi, tokens)

    @property
    def ready(self) -> bool:
        return self.lo is not None and self.hi > self.lo

    def fit(self) -> tuple[float, float]:
        """(c0, c1), with c1 >= 0 (a forward never gets cheaper with more tokens)."""
        var = self.n * self.sxx - self.sx * self.sx
        c1 = max(0.0, (self.n * self.sxy - self.sx * self.sy) / var) if var > 0 else 0.0
        c0 = max(1e-9, (self.sy - c1 * self.sx) / self.n)
        return c0, c1

    def cost(self, batch: int, width: int) -> float:
        c0, c1 = self.fit()
        return c0 + c1 * batch * width


def expected_tokens(k: int, acceptance: float) -> float:
    """1 + a + ... + a^k: the target's token plus the accepted prefix of k drafts."""
    return sum(acceptance ** i for i in range(k + 1))


@dataclass
class DraftBudget:
    costs: StepCosts
    cap: int = MAX_STEPS  # the cap now (what /v1/spec_decode/metrics and the rounds report)

    @classmethod
    def new(cls) -> "DraftBudget":
        return cls(StepCosts())

    def observe(self, batch: int, width: int, seconds: float) -> None:
        self.costs.observe(batch * width, seconds)

    def choose(self, acceptances: list[float | None]) -> int:
        """The cap for the next step. `acceptances`: each running row's acceptance so far, or
        None for a row that does not draft (it still pays for the padded width)."""
        drafting = [a for a in acceptances if a is not None]
        if not drafting or len(acceptances) < 2 or not self.costs.ready:
            self.cap = MAX_STEPS
            return self.cap
        batch = len(acceptances)

        def rate(k: int) -> float:
            tokens = sum(expected_tokens(k, a) for a in drafting) + (batch - len(drafting))
            return tokens / self.costs.cost(batch, 1 + k)

        self.cap = max(range(MAX_STEPS + 1), key=rate)
        return self.cap


def row_acceptance(accepted: int, rejections: int) -> float:
    """A row's per-position acceptance a: each drafted position is accepted with probability a
    until the first rejection, so a round yields its accepted drafts and at most one rejection;
    the estimate is accepted / (accepted + rejections), with a uniform prior (1/2 at first)."""
    return (accepted + 1) / (accepted + rejections + 2)
