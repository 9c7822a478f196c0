"""N-gram lookup's rounds replayed at every fixed k (Replay): the lookup's continuation is a
function of the text, and the text is the same whatever k drafted it, so the lookup at every
position of the output shows exactly what each fixed k would have done -- its rounds, their
widths, the tokens they made. `--steps auto` prices each k by those rounds (tuning.AutoSteps),
and `specscope tune` stores the calibration set's as a profile's prior (`Profile.replayed`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engines.speculative.expected import expected_tokens


@dataclass
class Rounds:
    """Per fixed k = 0..max_steps, what a run at k did: the tokens its rounds made and its rounds
    by width (1 + the drafts the lookup found, up to k). A request's replay counts into one; the
    chat engine keeps one across requests, and a profile stores the calibration set's."""

    max_steps: int
    tokens: list[int] = field(default_factory=list)
    widths: list[dict[int, int]] = field(default_factory=list)

    def __post_init__(self):
        self.tokens = self.tokens or [0] * (self.max_steps + 1)
        self.widths = self.widths or [{} for _ in range(self.max_steps + 1)]

    def add(self, k: int, width: int, made: int) -> None:
        self.tokens[k] += made
        self.widths[k][width] = self.widths[k].get(width, 0) + 1

    def merge(self, other: "Rounds") -> None:
        for k, (made, widths) in enumerate(zip(other.tokens, other.widths)):
            self.tokens[k] += made
            for width, n in widths.items():
                self.widths[k][width] = self.widths[k].get(width, 0) + n

    def per_round(self, k: int, latency: Callable[[int], float]) -> tuple[float, float] | None:
        """(tokens, seconds) of an average round at k, priced at `latency`; None before any."""
        if k >= len(self.widths) or not self.widths[k]:
            return None
        rounds = sum(self.widths[k].values())
        return self.tokens[k] / rounds, sum(n * latency(w) for w, n in self.widths[k].items()) / rounds

    def record(self) -> dict:
        return {"tokens": list(self.tokens), "widths": [{str(w): n for w, n in by.items()} for by in self.widths]}

    @classmethod
    def of(cls, record: dict) -> "Rounds":
        """From `record()`'s JSON; ValueError when it is not that."""
        try:
            widths = [{int(w): int(n) for w, n in by.items()} for by in record["widths"]]
            tokens = [int(t) for t in record["tokens"]]
        except (AttributeError, TypeError, KeyError, ValueError) as e:
            raise ValueError(f"replayed rounds: {e!r}") from None
        if len(tokens) != len(widths) or not tokens:
            raise ValueError("replayed rounds: not one count of tokens per k")
        return cls(len(widths) - 1, tokens, widths)


@dataclass
class Replay:
    """What every fixed k would have done on this run's output so far, for n-gram lookup.

    The lookup is a function of the text alone, and the text is the same whatever k drafted it
    (lossless), so a run at k is replayed exactly from the continuation found at each position
    and how far the output shows it held: a round at position p drafts min(k, found) tokens,
    keeps the `hits` of them that held, and the next round starts after those and the target's
    own token. Per k, a cursor walks the output as a run at k would have rounded it, counting its
    rounds (`rounds`, and `kept`: the engine's, across requests); `rates` prices them at this
    machine's costs now. Why not expected tokens from the acceptance by position (the module's
    `rates`): that is measured at the round starts of the k this run drafted, and a run at another
    k starts its rounds elsewhere -- a run at 7 crosses a long copy in one round and then starts
    its rounds where nothing copies. At T > 0 the output is one sample of the target's: it shows a
    draft as held with the chance that draft is accepted."""

    max_steps: int
    kept: Rounds | None = None  # earlier requests' (the chat engine keeps it): counted into as well
    rounds: Rounds = field(init=False)
    found: dict[int, list[int]] = field(default_factory=dict)  # position -> continuation looked up there
    hits: dict[int, int] = field(default_factory=dict)  # position -> how many of it held (once shown)
    cursors: list[int] = field(default_factory=list)  # per k: where a run at k starts its next round

    def __post_init__(self):
        self.rounds = Rounds(self.max_steps)

    def lookup(self, at: int, found: list[int]) -> None:
        """The continuation the lookup finds when the output is `at` tokens long (every position,
        not only round starts: a run at another k starts its rounds there)."""
        if not self.cursors:
            self.cursors = [at] * (self.max_steps + 1)
        if at not in self.found and at >= min(self.cursors):
            self.found[at] = list(found[: self.max_steps])
            if not found:
                self.hits[at] = 0

    def score(self, tokens: list[int]) -> None:
        """Resolve the continuations the output `tokens` now shows (a miss, or all of them
        held), then move every k's cursor over the rounds that are now known."""
        for at, found in self.found.items():
            if at in self.hits:
                continue
            shown = tokens[at : at + len(found)]
            held = next((i for i, (f, t) in enumerate(zip(found, shown)) if f != t), len(shown))
            if held < len(shown) or len(shown) == len(found):
                self.hits[at] = held
        for k, at in enumerate(self.cursors):
            while at in self.hits:
                drafted = min(k, len(self.found[at]))
                kept = min(self.hits[at], drafted)
                for tally in (self.rounds, self.kept):
                    if tally is not None:
                        tally.add(k, 1 + drafted, kept + 1)
                at += kept + 1
            self.cursors[k] = at
        behind = min(self.cursors, default=0)  # positions no cursor will visit again
        for at in [a for a in self.found if a < behind]:
            del self.found[at]
            self.hits.pop(at, None)

    def rates(self, latency: Callable[[int], float], prior: Rounds | None, acceptance: list[float],
              weight: float) -> tuple[list[float], list[float]]:
        """(tokens per second, tokens per round) for k = 0..max_steps: each k's replayed rounds
        priced at `latency` (a whole round by its width), beside `weight` average rounds of the
        prior -- replayed rounds (the profile's calibration set, earlier requests), else what the
        `acceptance` by position expects of k -- which decide alone before the output shows anything."""
        out_rates, out_tokens = [], []
        for k in range(self.max_steps + 1):
            made, seconds = (prior.per_round(k, latency) if prior is not None else None) or \
                (expected_tokens(acceptance, k), latency(1 + k))
            here = self.rounds.per_round(k, latency)
            n = sum(self.rounds.widths[k].values())
            if here is not None:
                made, seconds = (n * here[0] + weight * made) / (n + weight), (n * here[1] + weight * seconds) / (n + weight)
            out_rates.append(made / seconds)
            out_tokens.append(made)
        return out_rates, out_tokens


def replay_text(tokens: list[int], start: int, max_steps: int, n_min: int = 1, n_max: int = 4) -> Rounds:
    """Every fixed k's rounds of n-gram lookup over a finished text (`tokens`, generated from
    `start` on): what `specscope tune` stores, so a run's prior is what each k made on the
    calibration set rather than what the acceptance by position expects of it."""
    from engines.speculative.ngram import NGramIndex

    index = NGramIndex(n_min, n_max)
    index.reset(tokens[:start])
    replay = Replay(max_steps)
    for at in range(start, len(tokens)):
        replay.lookup(at, index.propose(max_steps))
        index.extend([tokens[at]])
    replay.score(tokens)
    return replay.rounds

