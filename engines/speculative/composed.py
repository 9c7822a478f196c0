"""Composed drafting: n-gram lookup beside a model drafter (an MTP chain, a draft model) in
one run, priced per round by the throughput model of tuning.py (the MtPC paper's accepted
tokens per unit of latency). Backend-agnostic: chat (any model drafter of engines/mlx_chat) and
GLM-OCR (its MTP layer) draft through the same ComposedProposer below.

A round drafts one of three ways, or not at all when none of them pays for itself:

    ngram        the n-gram continuation of the longest recurring suffix (m tokens; known
                 before choosing, since the lookup costs microseconds)
    model        the model drafter's chain of k
    model+ngram  the chain, then the n-gram continuation of context + chain: the tail only
                 counts if the whole chain is accepted, so its worth is discounted by the
                 chain's chance of getting there

priced as

    rate = E[accepted + 1] / (latency(1 + width) + chain * model_s)
    E[chain k, tail m] = E_model(k) + P(all k accepted) * (E_ngram(m) - 1)

with E_x(k) = expected_tokens(x's acceptance by position, k), latency(w) the verify forward
of w tokens and model_s what drafting one chain token costs (n-gram drafting is taken as
free). Acceptance by position is counted per source from the rounds it drafted: a chain's
positions for the model, the n-gram continuation's positions for n-gram, whether it drafted
alone or after a chain (a tail is counted only in rounds whose chain was wholly accepted:
only those reached it); n-gram's also from the rounds it did not draft, its continuation
scored against what they emitted (`shadow`: free, and unbiased). Why the tail is priced like
a lone n-gram draft: once the chain is accepted, context + chain is the real context, and the
tail is what a lone lookup there would have proposed.

Units: until the caller knows real costs, latency is flat (1.0 per forward: verifying is
nearly free, a GPU's case) and drafting costs nothing; `measured` costs (seconds) replace
both at once, so the two are never mixed. The choice depends only on the context, past rounds
and measured times, never on this round's draws: lossless like either source alone.

Measuring (DraftingCosts): the rounds' own times (`observe`) give the verify's cost by width,
from rounds without a chain, and a chain token's, from a chain round's time beyond the verify of
its width (`chain_token_s`). Three rules keep both measured:
- A run whose rounds all chain measures no verify alone, so the first round that would chain
  runs plain, and so does one in every PROBE_AFTER chain rounds in a row: without it a drafter
  that costs more than it brings -- the tiny Gemma 4 pair's assistant on a CPU -- would be chosen
  forever by the flat prices it starts with.
- A drafter priced out drafts one token after CHAIN_PROBE_AFTER rounds without a chain, so a
  slow start (a first chain's compile, a busy machine) does not price it out for good; each
  probe after which it is still priced out doubles that wait, up to CHAIN_PROBE_MAX rounds (a
  chain chosen on its merits resets it): a probe costs about one chain token, so probing costs
  at most 1/64 of a chain token per round, falling to 1/1024 of one as it keeps finding the
  drafter a loss (the tiny Gemma 4 pair's assistant costs about a round per token: under 0.1%
  of the time).
- A width no longer chosen is not measured again, so the verify curve is monotone from below
  (StepCosts.from_below says why; from above, a diagnostic pass of the tiny Gemma 4 pair cut
  most 7-token n-gram continuations to one to three drafts), and after REMEASURE_AFTER rounds in
  a row that drafted less than the n-gram continuation found, one drafts all of it: the widest
  verify re-measured, nearly free where wide verifies cost what narrow ones do, and its tokens
  still worth their acceptance.

The target's hidden state (what an MTP chain starts from) is asked of a forward only when the
round after it may chain -- this round chains, the chooser would chain with no n-gram match, or
a probe is due (`needs_hidden`, read by the loop as it launches each forward): returning it
costs a plain round of the tiny Gemma 4 pair ~1% (an extra output kept, a slice per round), and
where the drafter is priced out nearly every round is such a plain or n-gram round. A chain
is never started from an older round's state: without this round's, the round runs plain
(and asks for it).
At T>0 a tail's tokens are point masses beside the chain's sampled drafts: their rows of q
are one-hot, which rejection sampling reads as "accept with p(x), resample from p without x".
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from engines.speculative.costs import LoadScaledCosts, StepCosts
from engines.speculative.ngram import NGramProposer
from engines.speculative.proposer import EMPTY, Context, Draft
from engines.speculative.expected import expected_by_count
from engines.speculative.schedule import MAX_STEPS
from engines.speculative.tuning import PositionAcceptance

NGRAM = "ngram"


@dataclass
class Prices:
    """What pricing a round's options needs, by count: expected tokens of the model's first k
    drafts and of n-gram's first k (k = 0..max_drafts), and the verify of 1 + w tokens."""

    model: list[float]
    ngram: list[float]
    latency: list[float]
    plans: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)  # plan()'s
    # answers by (found, k) under these prices: a composed round asks one or two, the same ones round
    # after round while nothing changes (the loop over widths was ~4 us a round in place)


def flat(width: int) -> float:
    return 1.0


@dataclass
class Chooser:
    """Which source drafts this round (see the module docstring). `model` names the model
    drafter ("mtp", "draft"): its rounds' draft_source is that name, "ngram" for n-gram rounds,
    f"{model}+ngram" for a chain with the n-gram tail."""

    model: str
    max_drafts: int = MAX_STEPS  # a round's drafts, chain and tail together
    latency: Callable[[int], float] = flat  # the verify of w tokens (see Units above)
    model_s: float = 0.0  # drafting one chain token, in latency's unit
    seen: dict[str, PositionAcceptance] = field(default_factory=dict)  # changed by record and shadow only
    expected: dict[str, list[float]] = field(default_factory=dict)  # each source's expected tokens by count,
    # until its counts change (a model priced out is not re-estimated every round)
    keep: bool = False  # keep prices() between rounds: set by measured() (a latency function set by the
    # caller may change under them; a measured table changes only through measured())
    kept: Prices | None = field(default=None, repr=False)  # until a count or a measured cost changes

    def __post_init__(self):
        self.seen = {NGRAM: PositionAcceptance(self.max_drafts), self.model: PositionAcceptance(self.max_drafts)}

    @property
    def composed(self) -> str:
        return f"{self.model}+{NGRAM}"

    def measured(self, costs: StepCosts, model_s: float) -> None:
        """Price rounds in seconds from now on: the verify by width, a chain token's drafting."""
        widths = {w: costs.at(w) for w in range(1, self.max_drafts + 2)}  # read once, not per option priced
        self.latency, self.model_s = widths.__getitem__, model_s
        self.keep, self.kept = True, None

    def rate(self, chain: int, tail: int, prices: "Prices | None" = None) -> float:
        """Expected tokens per unit of latency of a round with `chain` model drafts and then
        `tail` n-gram drafts (chain 0: n-gram alone; both 0: a plain round)."""
        p = prices or self.prices()
        if chain:
            reach = p.model[chain] - p.model[chain - 1]  # P(all of the chain accepted)
            tokens = p.model[chain] + reach * (p.ngram[tail] - 1)
        else:
            tokens = p.ngram[tail]
        return tokens / (p.latency[chain + tail] + chain * self.model_s)

    def prices(self) -> "Prices":
        """This round's figures, computed once for all its options (a round prices up to nine:
        on a tiny model each microsecond of the host's is a share of the round), and kept across
        rounds once the costs are measured, until something they read changes."""
        if self.kept is not None:
            return self.kept
        prices = Prices(self._expected(self.model), self._expected(NGRAM),
                        [self.latency(1 + w) for w in range(self.max_drafts + 1)])
        if self.keep:
            self.kept = prices
        return prices

    def _expected(self, source: str) -> list[float]:
        if source not in self.expected:
            self.expected[source] = expected_by_count(self.seen[source].estimate(), self.max_drafts)
        return self.expected[source]

    def plan(self, found: int, k: int) -> tuple[int, int]:
        """Before drafting: (n-gram tokens, chain length) of the round that pays best of the
        `found` n-gram tokens alone (m, 0), the model's chain (0, k), or no drafts (0, 0) --
        where drafting costs more than it brings, as a tiny model's MTP layer can on a CPU.
        The n-gram continuation may be longer than k: it costs nothing to draft, so only the
        wider verify prices it. Ties go to the cheaper form."""
        if not k:
            return 0, 0
        p = self.prices()
        planned = p.plans.get((found, k))
        if planned is None:
            best, best_rate = (0, 0), self.rate(0, 0, p)
            for m in range(1, min(found, self.max_drafts) + 1):  # in order of cost: a tie keeps the cheaper
                if (r := self.rate(0, m, p)) > best_rate:
                    best, best_rate = (m, 0), r
            chain = min(k, self.max_drafts)
            planned = p.plans[found, k] = (0, chain) if self.rate(chain, 0, p) > best_rate else best
        return planned

    def tail(self, chain: int, found: int) -> int:
        """After a chain of `chain` drafts: how many of the `found` n-gram tokens that continue
        it to append (0: the chain alone pays best)."""
        room = min(found, self.max_drafts - chain)
        if not chain or room <= 0:
            return 0
        prices = self.prices()
        return max(range(room + 1), key=lambda m: (self.rate(chain, m, prices), -m))  # ties: the narrower verify

    def record(self, chain: int, proposed: int, accepted: int) -> None:
        """A round's verdict: `chain` of its `proposed` drafts came from the model (the rest
        from n-gram), `accepted` of them were accepted."""
        if chain:
            self.seen[self.model].record(chain, min(accepted, chain))
            self._changed(self.model)
        if proposed > chain and accepted >= chain:
            self.seen[NGRAM].record(proposed - chain, accepted - chain)
            self._changed(NGRAM)

    def shadow(self, found: list[int], emitted: list[int]) -> None:
        """A round that did not draft the n-gram continuation `found`: score it against the
        tokens the round emitted. Whatever drafted, the emitted tokens follow the target's law,
        so found[i] equals emitted[i] (given the positions before it did) with probability
        p(found[i]) -- exactly the chance it would have been accepted as a draft: the counts
        stay unbiased, at any temperature. Why: counted only from the rounds it drafted, a
        source priced out by a few misses is never tried again, even once the output starts
        copying (a page's first lines, then its repeated rows)."""
        compared = min(len(found), len(emitted))
        hits = next((i for i in range(compared) if found[i] != emitted[i]), compared)
        self.seen[NGRAM].record(compared, hits)
        self._changed(NGRAM)

    def _changed(self, source: str) -> None:
        """`source`'s counts changed: its expected tokens, and the kept prices, are stale."""
        self.expected.pop(source, None)
        self.kept = None

    def source(self, chain: int, proposed: int) -> str | None:
        """Round.draft_source of a round that drafted `chain` model tokens of `proposed`."""
        if not proposed:
            return None
        return NGRAM if not chain else self.model if chain == proposed else self.composed


PROBE_AFTER = 8  # chain rounds in a row before one plain round measures the verify alone
CHAIN_PROBE_AFTER = 64  # rounds without a chain before one of a single draft re-measures drafting
CHAIN_PROBE_MAX = 1024  # that wait, doubled by each probe that still finds drafting a loss, at most
MEASURED = True  # False: flat prices and no probes, the forms chosen by acceptance alone
# (tests that must see every form, whatever this machine's timings)
CHAIN_ROUNDS_KEPT = 7  # a chain token's cost: the median of the last few chain rounds
REMEASURE_AFTER = 32  # n-gram continuations cut short in a row before one is drafted whole
REPRICE_UNCHAINED_EVERY = 32  # rounds without a chain between re-readings of the measured costs (chain
# rounds re-read them at once): each reading prices every width, ~100 us in place on the tiny Gemma 4 pair


@dataclass
class DraftingCosts:
    """What composed runs measured of this machine with one drafter: kept by the engine across
    requests (what a verify and a chain token cost does not depend on the prompt), so only the
    first request pays to find out, and the probes' counts run on across requests too."""

    verify: StepCosts = field(default_factory=lambda: LoadScaledCosts(from_below=True))  # rounds without a chain:
    # seconds by width, as of the last verify_costs(); a width not measured lately at the load now
    # (LoadScaledCosts says why). Kept as measured, on the tiny Gemma 4 pair every n-gram width stayed at
    # ~5 ms after a passing load, beside a plain round back at ~1.6, and n-gram was priced out for a pass
    # (2 of its ~50 rounds drafted) until a continuation drafted whole re-measured one
    unpriced: list[tuple[int, float]] = field(default_factory=list)  # (width, seconds) of the rounds without a
    # chain observed since: the curve is read only when the chooser is re-priced, so each round only
    # appends (a median per round was ~5 us in place, a share of a tiny model's 2 ms round)
    chain_rounds: deque = field(default_factory=lambda: deque(maxlen=CHAIN_ROUNDS_KEPT))  # per chain round, its
    # time beyond its width's verify per chain token, in plain verifies of its time (see chain_token_s)
    chained_in_a_row: int = 0
    unchained_in_a_row: int = 0
    probe_after: int = CHAIN_PROBE_AFTER  # rounds without a chain before the next one-draft probe
    probed: bool = False  # the last round was a one-draft probe
    cut_short_in_a_row: int = 0  # rounds that drafted less than the n-gram continuation found

    def form(self, chain: int, k: int) -> int | None:
        """This round's chain length when the probes override the chooser's `chain` (0: a plain
        round, 1: a one-draft probe), else None; counts the rounds either way."""
        if self.probed:  # the round after a probe, priced with what it measured
            self.probed = False
            self.probe_after = CHAIN_PROBE_AFTER if chain else min(2 * self.probe_after, CHAIN_PROBE_MAX)
        elif chain:
            self.probe_after = CHAIN_PROBE_AFTER  # chosen on its merits: probe soon if that stops
        forced = None
        if chain and (not self.verify_measured or self.chained_in_a_row >= PROBE_AFTER):
            forced = 0  # a plain round: the verify's cost alone (see the module docstring)
        elif k and not chain and self.unchained_in_a_row >= self.probe_after:
            forced = self.probed = 1  # one draft: what drafting costs now
        chain = chain if forced is None else forced
        self.chained_in_a_row = self.chained_in_a_row + 1 if chain else 0
        self.unchained_in_a_row = 0 if chain else self.unchained_in_a_row + 1
        return forced

    def probe_due(self) -> bool:
        """Whether the next round (if the chooser does not chain) is a one-draft probe."""
        return self.unchained_in_a_row >= self.probe_after

    def whole_continuation_due(self, drafted: int, found: int) -> bool:
        """Whether this round, which would draft `drafted` of the `found` n-gram tokens, should
        draft them all: one in every REMEASURE_AFTER that cut it short (see the module docstring)."""
        if drafted >= found:
            self.cut_short_in_a_row = 0
            return False
        self.cut_short_in_a_row += 1
        if self.cut_short_in_a_row < REMEASURE_AFTER:
            return False
        self.cut_short_in_a_row = 0
        return True

    def observe(self, seconds: float, width: int, chain: int) -> None:
        if not chain:
            self.unpriced.append((width, seconds))
            return
        verify = self.verify_costs()  # (a chain round re-prices the chooser at once anyway)
        if verify.seconds:  # always, in a run: its first round that would chain runs plain (form)
            self.chain_rounds.append((seconds - verify.at(width)) / (chain * verify.at(1)))

    @property
    def verify_measured(self) -> bool:
        """Whether any round without a chain has been observed."""
        return bool(self.unpriced or self.verify.seconds)

    def verify_costs(self) -> StepCosts:
        """The verify's seconds by width, the rounds observed since the last call taken in."""
        if self.unpriced:
            self.verify.observe_many(self.unpriced)
            self.unpriced.clear()
        return self.verify

    @property
    def chain_token_s(self) -> float | None:
        """A chain token's drafting: a chain round's time beyond its width's verify, per token, as
        a share of a plain verify then (`observe`), times a plain verify now. Why not seconds beyond
        the verify now: a chain round is rare where the drafter is priced out (its probes only),
        and taken against a verify measured later, under another load, its drafting came out at
        nothing once a load raised the verify past the chain round's whole time -- on the tiny
        Gemma 4 pair chains of 2 were chosen then, each ~11 ms where a plain round took ~5."""
        verify = self.verify_costs()
        if not verify.seconds or not self.chain_rounds:
            return None
        return max(0.0, statistics.median(self.chain_rounds)) * verify.at(1)


def extend_list(draft: Draft, tail: list[int]) -> Draft:
    """A chain of ids in a list, the n-gram tail after it (point masses: a drafter that samples
    its chain as arrays extends its own -- engines/mlx_chat/proposers.py)."""
    assert draft.q is None, "a sampled chain's q needs the tail's one-hot rows beside it"
    return Draft(draft.ids() + tail, overlapped=draft.overlapped)


class ComposedProposer:
    def __init__(self, model, ngram: NGramProposer, costs: DraftingCosts | None = None,
                 max_drafts: int = MAX_STEPS, extend: Callable[[Draft, list[int]], Draft] = extend_list,
                 group: "ComposedGroup | None" = None):
        self.model = model  # the model drafter: chat's MTP or draft model, GLM-OCR's MTP layer
        self.group = group  # in a batch whose model drafter drafts for many rows at once: the rows' ComposedGroup
        self.ngram = ngram
        self.name = f"{model.name}+ngram"
        self.extend = extend  # the chain with a tail after it, in the model drafter's arrays
        self.hidden_wanted = True  # the next forward returns the target's hidden state (see needs_hidden)
        self.chooser = Chooser(model.name, max_drafts)
        self.last: tuple[int, Draft, int, list[int], list[int] | None] | None = None  # the round in flight:
        # chain length, draft, context length, the n-gram continuation it did not draft, and its
        # drafts as a list when they are n-gram's (a chain's are read back at commit)
        self.target_forward = getattr(model, "target_forward", None)
        self.costs = costs or DraftingCosts()
        self.observed = 0

    @property
    def needs_hidden(self) -> bool:
        """Read by the loop as it launches each forward (right after propose): whether that forward
        returns the target's hidden state -- only if the round after it may chain (see the module
        docstring)."""
        return self.model.needs_hidden and self.hidden_wanted

    def start(self, ctx: Context) -> None:
        self.model.start(ctx)
        self.ngram.start(ctx)
        self.last = None
        self._price()  # what earlier requests measured, from the first round

    def propose(self, ctx: Context, k: int) -> Draft:
        plan = self.plan(ctx, k)
        return self.chained(ctx, self.model.propose(ctx, plan)) if isinstance(plan, int) else plan

    def plan(self, ctx: Context, k: int) -> Draft | int:
        """This round's form: its Draft when no chain is drafted (the n-gram continuation, or
        none), else how long a chain the model drafter is to draft -- `chained` finishes the
        round with it (in a batch, the ComposedGroup asks the model's rows together between)."""
        found = self.ngram.index.propose(self.chooser.max_drafts)
        m, chain = self.chooser.plan(len(found), k)
        if MEASURED and found and not chain and self.costs.whole_continuation_due(m, len(found)):
            m = len(found)  # re-measures the widest verify (see the module docstring)
        planned = chain
        forced = self.costs.form(chain, k) if MEASURED else None
        if forced is not None:
            m, chain = 0, forced
        stale = bool(chain) and self.model.needs_hidden and ctx.hidden is None
        if stale:  # the last forward did not return the state a chain starts from: this one will
            m, chain = 0, 0
        # may the next round chain? (again after a chain; the chooser's choice with no n-gram match; a probe)
        self.hidden_wanted = bool(stale or chain or (planned if not found else self.chooser.plan(0, k)[1])
                                  or (MEASURED and self.costs.probe_due()))
        if chain:
            self.last = (chain, EMPTY, len(ctx.tokens), [] if m else found, None)  # (chained completes it)
            return chain
        if m:  # the n-gram continuation
            drafted = found[:m]
            draft = Draft(drafted, source=self.chooser.source(0, m))
        else:  # no drafts: a plain round (no array made: on a tiny model that is a share of it)
            drafted, draft = [], EMPTY
        self.last = (0, draft, len(ctx.tokens), [] if m else found, drafted)
        return draft

    def chained(self, ctx: Context, draft: Draft) -> Draft:
        """The round's Draft from the model's chain: the n-gram tail after it if it pays."""
        chain = draft.size
        draft = self._with_tail(draft)
        draft.source = self.chooser.source(chain, draft.size)
        _, _, before, undrafted, _ = self.last
        self.last = (chain, draft, before, undrafted, None)  # drafts read from the draft at commit, once evaluated
        return draft

    def _with_tail(self, draft: Draft) -> Draft:
        """The chain, and after it the n-gram tokens that continue it if they pay (the chain's
        tokens are read on the host for the lookup)."""
        room = self.chooser.max_drafts - draft.size
        found = self.ngram.index.propose(room, after=draft.ids()) if room > 0 else []
        m = self.chooser.tail(draft.size, len(found))
        return self.extend(draft, found[:m]) if m else draft

    def observe(self, step) -> None:
        """The round in flight took step.wall_s, settle to settle (the loop's own measure): price
        the verify by width and a chain token's drafting from it (see the module docstring)."""
        if self.last is None or not MEASURED:
            return
        seconds = step.wall_s
        chain, draft, drafted = self.last[0], self.last[1], self.last[4]
        self.costs.observe(seconds, 1 + (draft.size if drafted is None else len(drafted)), chain)  # (an array's
        # shape read from MLX costs more than a list's length)
        self.observed += 1
        if chain or self.observed % REPRICE_UNCHAINED_EVERY == 0:  # pricing is a share of a tiny model's round
            self._price()

    def _price(self) -> None:
        chain_token_s = self.costs.chain_token_s
        if MEASURED and chain_token_s is not None:
            self.chooser.measured(self.costs.verify_costs(), chain_token_s)

    def leave(self) -> None:
        leave = getattr(self.model, "leave", None)
        if leave is not None:
            leave()

    def commit(self, ctx: Context) -> None:
        if self.last is not None:
            chain, draft, before, undrafted, drafted = self.last
            if undrafted:
                self.chooser.shadow(undrafted, ctx.tokens[before:])
            if drafted is None or drafted:  # accepted: the drafts the emitted tokens begin with (at T>0 a
                # resampled token may equal the next draft: one more counted, statistics only)
                drafted, emitted = drafted or draft.ids(), ctx.tokens[before:]
                accepted = next((i for i, (d, e) in enumerate(zip(drafted, emitted)) if d != e),
                                min(len(drafted), len(emitted)))
                self.chooser.record(chain, len(drafted), accepted)
            self.last = None
        self.model.commit(ctx)
        self.ngram.commit(ctx)


@dataclass
class ModelAsk:
    """A composed row as its model drafter's group sees it: the model's own row (the group's
    proposer) and the sequence's context."""

    proposer: Any
    ctx: Context


class ComposedGroup:
    """The composed rows of a batch whose model drafter drafts for many rows at once (a
    DraftGroup, engines/speculative/proposer.py): each row plans its round alone (n-gram, a
    chain, or nothing), the rows that chain ask the model's group together, and each finishes
    its draft (the n-gram tail after its chain)."""

    def __init__(self, model_group):
        self.model_group = model_group

    def propose_rows(self, target_cache, asks: list) -> list[Draft]:
        plans = [seq.proposer.plan(seq.ctx, k) for _, seq, k, _ in asks]
        chains = [i for i, plan in enumerate(plans) if isinstance(plan, int)]
        if chains:
            chain_asks = [(asks[i][0], ModelAsk(asks[i][1].proposer.model, asks[i][1].ctx), plans[i], asks[i][3])
                          for i in chains]
            for i, draft in zip(chains, self.model_group.propose_rows(target_cache, chain_asks)):
                seq = asks[i][1]
                plans[i] = seq.proposer.chained(seq.ctx, draft)
        return plans
