"""`--steps auto`: each round, the draft length that maximises expected tokens per second on
this machine (the MtPC paper's throughput model, as the batch controller uses it):

    k* = argmax_k  E[accepted + 1 | k] / round(k)
    E[accepted + 1 | k] = 1 + a1 + a1 a2 + ... + a1 ... ak

with round(k) what a whole round of k drafts costs -- the target's forward of 1 + k tokens and
the drafting of k, as the user waits for them -- and a_i the acceptance at draft position i
given the positions before it were accepted. Where the numbers come from: a profile `specscope
tune` measured on this machine for this model and drafter (its latency curve by width, drafting
cost and acceptance by position), refined by the run's own rounds (`latency`, `acceptance`);
without a profile, the run's own rounds alone once they have shown two widths -- and until then
the EMA depth controller (schedule.AdaptiveDepth) moves k, which is what shows them. A batch of
one starts each request from what earlier ones with the same drafter showed (`attach`).

Why whole rounds, timed settle to settle, and not a forward and a drafting cost apart: when
MTP steps launch ahead the next chain is queued in the graph right behind the verify, so the
host's timer around propose sees almost nothing, while on a CPU the chain runs on the same
cores between the two settles and lengthens the round by what it costs -- on a GPU it hides
behind the host's work and costs nothing, and the round's time says so either way. Two
consequences keep auto from over-drafting (tests/engines/speculative/test_tuning.py): a round
sharing its time with neighbours of another k prices nothing (`record`, Sequence.priced), and a
width narrower than every one measured is priced by a slope (`_measured`).

N-gram lookup is priced another way (replay.py): what each fixed k would have done on the
output so far, each k priced by those rounds at the costs now; the prior is the profile's
replayed calibration set (`Profile.replayed`), without a profile earlier requests'.

The profile files (reading, writing, which machine and model one is for) are engines/profiles.py's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from engines.speculative.costs import LoadScaledCosts, StepCosts
from engines.speculative.expected import expected_tokens
from engines.speculative.replay import Replay, Rounds

if TYPE_CHECKING:  # (a profile is read from disk by engines/profiles.py, outside this package)
    from engines.profiles import Profile

# The prior's acceptance (the profile's, else earlier requests') counts as this many rounds beside
# the run's own, at each position. Not more: a position deep in the chain is reached only by the
# rounds whose drafts held until there, so a heavy prior keeps it at the prior's figure long after
# the run shows otherwise (test_tuning.py: at 20, a copy-heavy profile meeting a prompt whose
# drafts fail keeps k = 7).
PRIOR_ROUNDS = 5
# Every PROBE_AFTER + 1 rounds, one round drafts one token more than the chooser picked. Why:
# a position of the chain is measured only by rounds that draft that deep, so a choice is
# otherwise final -- k = 0 measures nothing, k = 1 never tells what a second draft would
# fetch -- and one bad start (a rejected first draft, a profile from other prompts) would hold
# the run below what pays. One wider verify in nine costs little (a CPU's verify of k + 2 rows
# is about the price of k + 1) and finds depth that pays when the text starts to repeat.
# Each probe whose deepest draft fails while the choice stays doubles the wait before the next,
# up to PROBE_MAX; a choice that moves, or a probe whose draft held, brings it back to
# PROBE_AFTER. Why: where a verify of k + 2 rows costs more than one of k + 1 (test_tuning.py's
# SMOLLM2_STEEP), a probe every nine rounds costs a drafter whose second draft never pays a share
# of its speed, to learn that again and again.
PROBE_AFTER = 8
PROBE_MAX = 64
# Every SHALLOW_AFTER + 1 rounds, SHALLOW_ROUNDS rounds draft one token less than chosen (to
# k - 1 >= 1): a narrower width is otherwise measured only when chosen, so one measured dear
# under a passing load would keep its k from being chosen again (test_tuning.py's
# test_a_narrower_width_priced_dear_by_a_passing_load_is_measured_again). Three rounds because only
# the middle one is surely a price: with rounds launched before the verdict the first and last
# share their time with their neighbours of k (Sequence.priced). Without a profile, one draft a round,
# never measured, is tried at once: priced from the wider widths the fallback showed it can look
# as dear as they are, and one draft, often the k that pays, would wait SHALLOW_AFTER rounds.
# Not to k = 0: plain rounds cost a drafter worth drafting most, and a plain round's price only
# decides between plain and one draft.
SHALLOW_AFTER = 26
SHALLOW_ROUNDS = 3


def round_costs() -> LoadScaledCosts:
    """What `--steps auto` keeps of its rounds' costs by width (a batch of one keeps one per
    drafter across requests). Why each half (tests/engines/speculative/test_tuning.py drives both on a
    model of this CPU whose load changes mid-run):
    - scaled by the load (LoadScaledCosts says why): kept as measured, widths chosen now look
      dear beside widths measured earlier, and auto drafts more than pays;
    - monotone from below (StepCosts.from_below), each width at most the cheapest wider one:
      from above, a narrow width priced dear lifts every wider one to its price, so the
      deepest k looks as cheap as one draft; auto chooses it, measuring it cheap changes
      nothing (still lifted), and the narrow width, no longer chosen, is never measured
      again. From below, a wide width priced too cheap is chosen, and so measured again.
    Neither alone holds both cases."""
    return LoadScaledCosts(from_below=True)



def rates(latency: Callable[[int], float], draft_s: float, acceptance: list[float], max_k: int) -> list[float]:
    """Expected tokens per second for k = 0..max_k drafts per round."""
    return [expected_tokens(acceptance, k) / (latency(1 + k) + k * draft_s) for k in range(max_k + 1)]


def break_even(latency: Callable[[int], float], draft_s: float, k: int) -> float | None:
    """The per-position acceptance a (the same at every position) at which k drafts per round
    give exactly plain decoding's tokens per second on this machine: below it speculation
    loses. None when even a = 1 cannot pay for the wider verify."""
    need = (latency(1 + k) + k * draft_s) / latency(1)  # tokens a round must yield to break even
    if need > k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens([mid], k) < need else (lo, mid)
    return (lo + hi) / 2


def best_k(latency: Callable[[int], float], draft_s: float, acceptance: list[float], max_k: int) -> int:
    r = rates(latency, draft_s, acceptance, max_k)
    return max(range(len(r)), key=r.__getitem__)


@dataclass
class PositionAcceptance:
    """A drafter's acceptance by draft position as a run shows it: per position, the rounds
    that reached it (every position before it accepted) and, of those, the ones that accepted
    it; a prior (the profile's, or one half) weighs as `weight` rounds."""

    positions: int
    prior: list[float] | None = None
    weight: float = 2.0
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.reached = [0] * self.positions
        self.accepted = [0] * self.positions

    def record(self, proposed: int, accepted: int) -> None:
        """One round: positions 1..accepted accepted, position accepted + 1 rejected (if drafted)."""
        for i in range(min(proposed, self.positions)):
            self.reached[i] += 1
            if i < accepted:
                self.accepted[i] += 1
            else:
                break

    def estimate(self) -> list[float]:
        w = self.weight
        priors = [self.prior[min(i, len(self.prior) - 1)] for i in range(self.positions)] if self.prior else \
            [0.5] * self.positions
        return [(a + prior * w) / (r + w) for a, r, prior in zip(self.accepted, self.reached, priors)]


@dataclass
class Probes:
    """When the next probe one draft deeper comes (PROBE_AFTER, PROBE_MAX). A batch of one keeps
    it across requests with the costs and the acceptance it helps measure: a short request that
    started over at the first pace would probe at that pace every time."""

    since: int = 0  # rounds chosen since the last probe
    after: int = PROBE_AFTER  # the wait before the next: doubles while probes find nothing
    probe: int | None = None  # the k of the last probe, until a round of that k is recorded
    chosen: int | None = None  # the chooser's pick at the last choice (probes and shallow rounds aside)

    def next(self, k: int, deepest: int) -> int:
        """The k to draft, given the chooser's pick k: k, or k + 1 when a probe is due."""
        if k != self.chosen:
            self.after, self.probe = PROBE_AFTER, None  # the choice moved: look again soon
        self.chosen = k
        self.since += 1
        if self.since > self.after and k < deepest:
            self.since, self.probe = 0, k + 1
            return k + 1
        return k

    def recorded(self, asked: int, proposed: int, accepted: int) -> None:
        """A round's verdict: `asked` the drafts chosen for it, `proposed` those the drafter made
        (n-gram lookup may find fewer). The probe's round is told by the k asked, not as the
        round after the choice: when rounds launch before the last verdict, the next round is
        chosen before the probe's verdict is known (read then, a probe's outcome would be its
        predecessor's, and the pace would keep going back to PROBE_AFTER)."""
        if self.probe is None or asked != self.probe:
            return
        self.probe = None
        if accepted >= proposed:  # its deepest draft held: look again soon
            self.after = PROBE_AFTER
        else:  # it failed and the choice stays: wait longer for the next
            self.after = min(2 * self.after, PROBE_MAX)


@dataclass
class AutoSteps:
    """The draft length of each round under `--steps auto` (see the module docstring)."""

    max_steps: int
    profile: Profile | None = None
    costs: StepCosts = field(default_factory=round_costs)  # whole rounds (drafting included): width -> seconds;
    # a batch of one keeps one per drafter across requests (a round's cost is the machine's, not the prompt's)
    probes: Probes = field(default_factory=Probes)  # when the next probe comes (PROBE_AFTER)
    since_shallow: int = 0  # rounds chosen since the last shallower probe (SHALLOW_AFTER)
    shallow: list[int] = field(default_factory=list)  # the rounds left of a shallower probe (their k)
    draft_warm: bool = False  # the drafter's first round was seen (its cost is not counted)
    last_rates: list[float] = field(default_factory=list)  # expected tok/s per k, at the last choice
    last_tokens: list[float] = field(default_factory=list)  # expected tokens per round (E[accepted + 1]) per k, ditto
    seen: PositionAcceptance | None = None
    # earlier requests with this drafter (`attach`): every round is counted there too. Why it is the
    # prior without a profile: one half at every position prices a rarely accepted second draft at
    # 50% until the run has reached it a dozen times, at every request
    history: PositionAcceptance | None = None
    priced: tuple[tuple, StepCosts] | None = field(default=None, repr=False)  # latency() for the costs as
    # they were (composed drafting reads it width by width until it measures its own)
    # n-gram lookup: acceptance by position from each round's whole continuation, scored against
    # the output as it arrives (`continuation`, `score`), not from the drafts alone
    pending: list[tuple[int, list[int]]] = field(default_factory=list)  # (output length then, continuation)
    continuations: bool = False
    # n-gram lookup: what each fixed k would have made of the output so far (`passed`, Replay),
    # which prices k instead of the acceptance by position once the lookup is seen at every position;
    # its prior: the profile's replayed calibration set, else earlier requests' (`attach`: kept,
    # counted into, and as it was when this request started)
    replay: Replay | None = None
    kept: Rounds | None = None
    kept_before: Rounds | None = None
    profile_rounds: Rounds | None = None  # the profile's, parsed once

    def __post_init__(self):
        self.seen = PositionAcceptance(self.max_steps)

    def attach(self, costs: StepCosts, history: "PositionAcceptance", probes: Probes | None = None,
               kept: Rounds | None = None) -> None:
        """Start from what earlier requests with this drafter showed (a batch of one keeps
        them): the rounds' costs, their acceptance by position as the prior, the pace of
        the probes, and (n-gram) every fixed k's rounds replayed on their outputs."""
        self.costs, self.history = costs, history
        if kept is not None:
            self.kept, self.kept_before = kept, Rounds.of(kept.record())
        self.probes = probes if probes is not None else self.probes
        self.draft_warm = bool(costs.seconds)  # the drafter warmed up in an earlier request
        if any(history.reached):
            self.seen.prior, self.seen.weight = history.estimate(), PRIOR_ROUNDS

    def acceptance(self) -> list[float]:
        """The run's acceptance by position, the profile's as the prior, else earlier requests'
        (`attach`; one half without either)."""
        if self.profile is not None:
            self.seen.prior, self.seen.weight = self.profile.acceptance, PRIOR_ROUNDS
        return self.seen.estimate()

    def _count(self, proposed: int, accepted: int) -> None:
        self.seen.record(proposed, accepted)
        if self.history is not None:
            self.history.record(proposed, accepted)

    def latency(self) -> StepCosts:
        """What a whole round costs by its width 1 + k, drafting included (see the module
        docstring), at every width 1..max_steps + 1. Without a profile: the run's rounds, and
        below the narrowest width they showed, the slope of the narrowest two (see `_measured`).
        With one: the profile's forward latency, scaled to what the run's rounds cost, plus
        the drafting per token (`_fit`): the machine's load moves the level, not the shape."""
        key = tuple(self.costs.seconds.items())
        if self.priced is not None and self.priced[0] == key:
            return self.priced[1]
        out = StepCosts()
        widths = range(1, self.max_steps + 2)
        if self.profile is None:
            for width in widths:
                out.observe(width, self._measured(width))
        else:
            curve = self.profile.latency()
            scale, per_token = self._fit(curve)
            for width in widths:
                out.observe(width, scale * curve.at(width) + per_token * (width - 1))
        self.priced = key, out
        return out

    def _measured(self, width: int) -> float:
        """A whole round of `width` as the run measured it; narrower than every width measured,
        the narrowest price less the slope of the narrowest two per width (at least half the
        narrowest price). Why not the narrowest price itself: then a narrower k costs as much
        as a wider one and brings fewer tokens, so it is never chosen, hence never measured --
        the fallback starts at the spec's steps and probes go deeper, and auto over-drafts a
        drafter whose second draft is rarely accepted. Priced this way it is chosen when it
        would pay at that price, and then measured."""
        sizes = sorted(self.costs.seconds)
        if width >= sizes[0] or len(sizes) < 2:
            return self.costs.at(width)
        low, next_ = self.costs.at(sizes[0]), self.costs.at(sizes[1])
        slope = (next_ - low) / (sizes[1] - sizes[0])
        return max(low - slope * (sizes[0] - width), 0.5 * low)

    def _fit(self, curve: StepCosts) -> tuple[float, float]:
        """(scale, drafting seconds per token) with which the profile's curve prices the run's
        rounds: least squares over the widths measured, round(w) = scale x latency(w) +
        per_token x (w - 1); with fewer than two widths (or a fit that says drafting is
        negative) the drafting is the profile's and only the scale is fitted."""
        measured = [(w, s) for w, s in self.costs.seconds.items()]
        if not measured:
            return 1.0, self.profile.draft_s
        v = [curve.at(w) for w, _ in measured]
        d = [w - 1 for w, _ in measured]
        y = [s for _, s in measured]
        if len({*d}) >= 2:
            svv, sdd, svd = sum(a * a for a in v), sum(b * b for b in d), sum(a * b for a, b in zip(v, d))
            svy, sdy = sum(a * c for a, c in zip(v, y)), sum(b * c for b, c in zip(d, y))
            det = svv * sdd - svd * svd
            if det > 0:
                scale, per_token = (svy * sdd - sdy * svd) / det, (sdy * svv - svy * svd) / det
                if scale > 0 and per_token >= 0:
                    return scale, per_token
                if scale > 0 > per_token:  # the widths priced no drafting at all: scale alone
                    return svy / svv, 0.0
        per_token = self.profile.draft_s
        return statistics.median((s - per_token * b) / a for a, b, s in zip(v, d, y)), per_token

    def ready(self) -> bool:
        return self.profile is not None or self.costs.ready

    def choose(self) -> int | None:
        """k for the next round, or None when nothing is known yet (the caller's fallback
        decides)."""
        if not self.ready():
            return None
        latency = self.latency()
        acceptance = self.acceptance()
        if self.replay is not None:  # n-gram: each fixed k replayed on this run's output (Replay)
            if self.profile is not None and self.profile_rounds is None and self.profile.replayed:
                self.profile_rounds = self.profile.replayed_rounds()
            prior = self.profile_rounds if self.profile is not None and self.profile_rounds else self.kept_before
            self.last_rates, self.last_tokens = self.replay.rates(latency.at, prior, acceptance, PRIOR_ROUNDS)
        else:
            self.last_rates = rates(latency.at, 0.0, acceptance, self.max_steps)  # drafting is in the rounds' prices
            self.last_tokens = [expected_tokens(acceptance, k) for k in range(self.max_steps + 1)]
        k = max(range(len(self.last_rates)), key=self.last_rates.__getitem__)
        if self.shallow:
            return self.shallow.pop()
        self.since_shallow += 1
        probe = self.probes.next(k, self.max_steps)
        if probe != k:
            return probe  # a probe (see PROBE_AFTER)
        if k >= 2 and self.profile is None and 2 not in self.costs.seconds:  # one draft never measured: tried at once
            self.shallow = [1] * (SHALLOW_ROUNDS - 1)
            return 1
        if k >= 2 and self.since_shallow > SHALLOW_AFTER:
            self.since_shallow = 0
            self.shallow = [k - 1] * (SHALLOW_ROUNDS - 1)
            return k - 1  # a shallower probe (see SHALLOW_AFTER)
        return k

    def continuation(self, found: list[int], at: int) -> None:
        """n-gram lookup found `found` (up to max_steps tokens) when the output was `at` tokens
        long; `score` counts it once the output shows how far it held. Why: a draft of k
        measures positions 1..k only, so with the drafts alone a position past the k chosen
        is measured only by probes; the lookup's whole continuation costs nothing and measures
        every position every round. Unbiased at any temperature: the emitted token equals the
        continuation's (given the ones before it did) with the target's probability of it --
        the chance it is accepted as a draft."""
        self.continuations = True
        if found:
            self.pending.append((at, list(found)))

    def passed(self, found: list[int], at: int) -> None:
        """n-gram lookup found `found` at a position the output reached, whether a round started
        there or not: what a run at another k would have drafted there (`Replay`)."""
        if self.replay is None:
            self.replay = Replay(self.max_steps, kept=self.kept)
        self.replay.lookup(at, found)

    def score(self, tokens: list[int]) -> None:
        """Count the continuations whose fate the output `tokens` now shows: their first miss,
        or all of them held."""
        if self.replay is not None:
            self.replay.score(tokens)
        waiting = []
        for at, found in self.pending:
            shown = tokens[at : at + len(found)]
            hits = next((i for i, (f, t) in enumerate(zip(found, shown)) if f != t), len(shown))
            if hits < len(shown) or len(shown) == len(found):
                self._count(len(found), hits)
            else:
                waiting.append((at, found))
        self.pending = waiting

    def record(self, proposed: int, accepted: int, verify_s: float | None = None, draft_s: float | None = None,
               priced: bool = True, asked: int | None = None) -> None:
        """One round: its acceptance by position (from its drafts, unless continuations are
        counted instead), and its cost -- the whole round, verify_s + draft_s, by its width --
        unless it is the drafter's first (it warms up: graphs built, caches allocated, maybe a
        second) or the loop says its time is not what a round of its k costs (`priced` False:
        its rounds overlap and a neighbour drafted another k; Sequence.priced)."""
        if not self.continuations:
            self._count(proposed, accepted)
        self.probes.recorded(proposed if asked is None else asked, proposed, accepted)
        if verify_s is None or verify_s <= 0:
            return
        if proposed and not self.draft_warm:
            self.draft_warm = True
            return
        if priced:
            self.costs.observe(1 + proposed, verify_s + (draft_s or 0.0))
