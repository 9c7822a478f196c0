"""A run's rounds as growable NumPy columns, for plotting: appending a round is O(1) (the
arrays double when full; the session's running sums are the very RunningStats
engines.speculative.rounds.session_stats keeps), and the moving averages, per-round speed and
acceptance by draft position come out as whole arrays. The telemetry strip draws from one; an
A/B compare's speculation-off run is another. No Qt."""

from __future__ import annotations

import numpy as np

from engines.speculative.rounds import Round, RunningStats

ROLLING = 16  # rounds in the moving averages, at least


def rolling_window(rounds: int) -> int:
    """Rounds per moving-average point: ROLLING, growing to 1% of a long run."""
    return max(ROLLING, rounds // 100)


def finite_rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of the finite values among the last `window`; NaN where the value itself is
    not finite (a round Auto did not choose: the line breaks there)."""
    finite = np.isfinite(values)
    total = np.cumsum(np.where(finite, values, 0.0))
    count = np.cumsum(finite.astype(float))
    lag = lambda a: np.concatenate([np.zeros(window), a])[: len(a)]  # noqa: E731
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = (total - lag(total)) / (count - lag(count))
    mean[~finite] = np.nan
    return mean


class RoundSeries:
    """The per-round numbers the plots need, plus the session's running sums (`totals`: the very
    RunningStats engines.speculative.rounds.session_stats adds rounds to)."""

    def __init__(self, capacity: int = 1024):
        self.n = 0
        self._cols = ("index", "proposed", "accepted", "tokens", "wall", "t", "prefill", "steps",
                      "expected_tok_s", "expected_tokens")  # the expected ones NaN where Auto did not choose
        for c in self._cols:
            setattr(self, "_" + c, np.zeros(capacity))
        self.totals = RunningStats()
        self.by_source: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # the same per Round.draft_source
        self.auto_rounds = 0  # rounds whose k Auto chose (they carry what it expected)

    def _grow(self) -> None:
        for c in self._cols:
            old = getattr(self, "_" + c)
            new = np.zeros(len(old) * 2)
            new[: self.n] = old[: self.n]
            setattr(self, "_" + c, new)

    def append(self, r: Round) -> None:
        if self.n == len(self._index):
            self._grow()
        i = self.n
        self._index[i], self._proposed[i], self._accepted[i] = r.index, r.proposed, r.accepted
        self._tokens[i], self._wall[i], self._t[i], self._prefill[i] = len(r.tokens), r.wall_s, r.t_s, r.prefill
        self._steps[i] = r.steps
        chosen = r.expected_tok_s is not None and r.expected_tokens is not None and r.steps < len(r.expected_tok_s)
        self._expected_tok_s[i] = r.expected_tok_s[r.steps] if chosen else np.nan
        self._expected_tokens[i] = r.expected_tokens[r.steps] if chosen else np.nan
        self.auto_rounds += chosen
        self.n += 1
        self.totals.add(r)
        depth = len(r.accept_flags)
        if r.draft_source and depth:
            # a chain with n-gram tokens after it ("mtp+ngram"): its first `steps` positions are
            # the model drafter's, the rest n-gram's, each counted under its own source
            chain = min(r.steps, depth) if "+" in r.draft_source else depth
            model, _, after = r.draft_source.partition("+")
            for source, positions in ((model, range(chain)), (after, range(chain, depth))):
                if not source or not len(positions):
                    continue
                offered, accepted = self.by_source.get(source, (np.zeros(0), np.zeros(0)))
                if depth > len(offered):
                    offered, accepted = np.pad(offered, (0, depth - len(offered))), np.pad(accepted, (0, depth - len(accepted)))
                offered[positions.start:positions.stop] += 1
                accepted[positions.start:positions.stop] += np.asarray(r.accept_flags[positions.start:positions.stop], dtype=float)
                self.by_source[source] = (offered, accepted)

    def column(self, name: str) -> np.ndarray:
        return getattr(self, "_" + name)[: self.n]

    def tok_s(self) -> np.ndarray:
        """Per-round decode speed; NaN for the prefill round (its time is TTFT, not decode)."""
        wall, tokens = self.column("wall"), self.column("tokens")
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where((wall > 0) & (self.column("prefill") == 0), tokens / wall, np.nan)
        return rate

    def rolling_tok_s(self, window: int = ROLLING) -> np.ndarray:
        decode = self.column("prefill") == 0
        tokens = np.cumsum(np.where(decode, self.column("tokens"), 0.0))
        wall = np.cumsum(np.where(decode, self.column("wall"), 0.0))
        lag_tokens = np.concatenate([np.zeros(window), tokens])[: self.n]
        lag_wall = np.concatenate([np.zeros(window), wall])[: self.n]
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = (tokens - lag_tokens) / (wall - lag_wall)
        rate[~decode] = np.nan
        return rate

    def rolling_mean(self, name: str, window: int = ROLLING) -> np.ndarray:
        """Mean of a column over the last `window` rounds (fewer at the start)."""
        total = np.cumsum(self.column(name))
        lagged = np.concatenate([np.zeros(window), total])[: self.n]
        count = np.minimum(np.arange(1, self.n + 1), window)
        return (total - lagged) / count

    def rolling_finite_mean(self, name: str, window: int = ROLLING) -> np.ndarray:
        return finite_rolling_mean(self.column(name), window)

    def per_position(self, source: str | None = None) -> np.ndarray:
        """Acceptance by draft position: of all rounds, or of those `source` drafted."""
        if source is None:
            offered, accepted = np.asarray(self.totals.offered_at, float), np.asarray(self.totals.accepted_at, float)
        else:
            offered, accepted = self.by_source[source]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(offered > 0, accepted / offered, 0.0)

    @property
    def tau(self) -> float:
        return self.totals.tau

    @property
    def acceptance_rate(self) -> float:
        return self.totals.acceptance_rate

    @property
    def decode_tok_s(self) -> float:
        return self.totals.decode_tok_s

    def nearest_round(self, x: float, by_time: bool = False) -> int | None:
        """The row of the round nearest to x (a round index, or seconds when by_time)."""
        if self.n == 0:
            return None
        if by_time:
            t = self.column("t")
            i = int(np.searchsorted(t, x))
            i = min(max(i, 0), self.n - 1)
            if i > 0 and abs(t[i - 1] - x) < abs(t[i] - x):
                i -= 1
            return i
        i = int(np.searchsorted(self.column("index"), x))
        i = min(max(i, 0), self.n - 1)
        if i > 0 and abs(self._index[i - 1] - x) < abs(self._index[i] - x):
            i -= 1
        return i
