"""Composed drafting (engines/speculative/composed.py): n-gram lookup beside a drafter trained on
the tiny llama. On a mixed set -- prompts it copies and prompts it answers freshly -- rounds
draft in all three forms (n-gram alone, the chain, the chain with n-gram tokens after it:
at T>0 their rows of q are one-hot beside the drafter's sampled ones), the output is plain decoding's token for token at T=0, and at T>0 the
target's exact law holds (a broken verifier fails the same test)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import mlx.core as mx
import pytest

from engines.speculative.composed import ComposedProposer
from engines.types import Request, SpecConfig
from tests.engines.broken_verifiers import BROKEN
from tests.engines.mlx_chat.test_lossless_sampled import PROMPT, SAMPLING, WORDS, exact_distribution
from tests.engines.training.trained import prompts, trained_drafter
from tests.engines.mlx_chat import checkpoints
from tests.stats import chi_square_pvalue
from tests.engines.chat import load_chat

REAL_OBSERVE = ComposedProposer.observe
VERIFY_S = 1e-3
COPY = "the cat is big and the dog is small . the cat is big and the dog is small ."
MIXED = [COPY, prompts(checkpoints.WORDS)[0], COPY + " " + prompts(checkpoints.WORDS)[1], prompts(checkpoints.WORDS)[2]]


@pytest.fixture(autouse=True)
def flat_prices(monkeypatch):
    """Every form must be drafted, whatever this machine's timings would price out."""
    from engines.speculative import composed

    monkeypatch.setattr(composed, "MEASURED", False)


def tokens(rounds):
    return [t for r in rounds for t in r.tokens]


def test_composed_drafts_from_both_and_equals_plain(targets):
    engine, _, drafter = targets["llama"]
    sources = Counter()
    for prompt in MIXED:
        plain = tokens(engine.generate(Request(prompt=prompt, max_tokens=48)))
        spec = SpecConfig("mtp", 4, draft_model=str(drafter), compose_ngram=True)
        rounds = list(engine.generate(Request(prompt=prompt, max_tokens=48, spec=spec)))
        assert tokens(rounds) == plain
        assert not any(r.note for r in rounds)
        sources.update(r.draft_source for r in rounds if r.proposed)
    assert sources["ngram"] > 0 and sources["mtp"] > 0 and sources["mtp+ngram"] > 0, sources


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):

    d = tmp_path_factory.mktemp("tiny_vocab_composed")
    target = checkpoints.make_tiny_llama(d / "target", words=WORDS, scale=0.6)
    engine = load_chat(str(target))
    return engine, str(trained_drafter(engine, target, WORDS, steps=100))


def law(engine, drafter, n=500):
    spec = SpecConfig("mtp", 3, draft_model=drafter, compose_ngram=True)
    mx.random.seed(4)
    counts, sources = Counter(), Counter()
    for _ in range(n):
        rounds = list(engine.generate(Request(prompt=PROMPT, max_tokens=5, spec=spec, sampling=SAMPLING,
                                              ignore_chat_template=True)))
        counts[tuple(tokens(rounds))[:3]] += 1
        sources.update(r.draft_source for r in rounds if r.proposed)
    return counts, sources


def test_composed_keeps_the_target_law(tiny_pair):
    engine, drafter = tiny_pair
    counts, sources = law(engine, drafter)
    assert sources["ngram"] > 0 and sources["mtp"] > 0 and sources["mtp+ngram"] > 0, sources
    assert chi_square_pvalue(counts, exact_distribution(engine), 500) > 1e-3


def test_a_broken_verifier_fails_the_composed_law(tiny_pair, monkeypatch):
    engine, drafter = tiny_pair
    BROKEN["resample_from_p"](monkeypatch)
    counts, _ = law(engine, drafter)
    assert chi_square_pvalue(counts, exact_distribution(engine), 500) < 1e-3


def chains_late(engine, drafter, monkeypatch, drafting_costs: float | None) -> tuple[float, bool]:
    """Run the mixed set composed with every round's time given by a cost model instead of this
    machine's clock (a tiny model's rounds jitter by more than the differences priced here): a
    verify costs 1 ms + 5% a token, and a chain round `drafting_costs` verifies more per chain
    token -- a drafter that dear (None: flat prices, drafting not priced). Returns the share of
    the later rounds (past the first 12 of each prompt) that chained, and whether every output
    was plain decoding's."""
    from engines.speculative import composed

    monkeypatch.setattr(composed, "MEASURED", drafting_costs is not None)
    real = REAL_OBSERVE  # not the class's: a wrapper a previous call left in place

    def observe(self, step):
        if self.last is not None and drafting_costs is not None:
            chain, width = self.last[0], 1 + self.last[1].size
            step = replace(step, wall_s=VERIFY_S * (1 + 0.05 * width) + drafting_costs * chain * VERIFY_S)
        real(self, step)

    monkeypatch.setattr(composed.ComposedProposer, "observe", observe)
    engine.loop.composed.clear()  # each case measures its own drafter
    late, chained, same = 0, 0, True
    for prompt in MIXED:
        plain = tokens(engine.generate(Request(prompt=prompt, max_tokens=64)))
        spec = SpecConfig("mtp", 3, draft_model=str(drafter), compose_ngram=True)
        rounds = list(engine.generate(Request(prompt=prompt, max_tokens=64, spec=spec)))
        same &= tokens(rounds) == plain
        for r in rounds[12:]:
            late += 1
            chained += (r.draft_source or "").startswith("mtp")
    return chained / late, same


def test_a_dear_drafter_is_priced_out_and_a_cheap_one_kept(targets, monkeypatch):
    """The chooser prices drafting from the rounds' own times: a drafter costing 3 verifies a
    token stops being chained (rounds draft n-gram or nothing), one costing nothing is chained
    about as often as with drafting unpriced (flat prices); lossless either way."""
    engine, _, drafter = targets["llama"]
    unpriced, same_unpriced = chains_late(engine, drafter, monkeypatch, drafting_costs=None)
    dear, same_dear = chains_late(engine, drafter, monkeypatch, drafting_costs=3.0)
    cheap, same_cheap = chains_late(engine, drafter, monkeypatch, drafting_costs=0.0)
    assert same_unpriced and same_dear and same_cheap
    assert unpriced > 0.2 and dear < 0.25 * unpriced and cheap > 0.7 * unpriced, (unpriced, dear, cheap)


def test_drafting_costs_carry_to_the_next_request(targets, monkeypatch):
    """What a verify and a chain token cost is the machine's, not the prompt's: the engine keeps
    it per drafter, so after requests that found the drafter dear the next starts priced -- no
    plain round to measure the verify, no chains tried at flat prices (a fresh request tries a
    chain by its second decode round)."""
    engine, _, drafter = targets["llama"]
    spec = SpecConfig("mtp", 3, draft_model=str(drafter), compose_ngram=True)
    open_prompt = prompts(checkpoints.WORDS)[0]

    def first_rounds() -> list:
        rounds = list(engine.generate(Request(prompt=open_prompt, max_tokens=24, spec=spec)))
        return [r.draft_source for r in rounds if not r.prefill][:6]

    chains_late(engine, drafter, monkeypatch, drafting_costs=3.0)  # measures the drafter dear
    carried = first_rounds()
    engine.loop.composed.clear()
    fresh = first_rounds()
    assert not any((s or "").startswith("mtp") for s in carried), carried
    assert fresh[0] is None and any((s or "").startswith("mtp") for s in fresh[1:3]), fresh


def test_a_dear_drafter_is_probed_ever_more_rarely(targets, monkeypatch):
    """Priced out, the drafter is still re-tried with a one-draft round after 64 rounds without
    a chain, in case drafting got cheaper (a slow first chain, a busy machine): but each probe
    that finds it still dear doubles that wait, so over many requests the probes' cost fades
    (every 64 rounds they cost a few percent of a tiny model's time)."""
    engine, _, drafter = targets["llama"]
    chains_late(engine, drafter, monkeypatch, drafting_costs=3.0)  # measures it dear, as the first requests do
    spec = SpecConfig("mtp", 3, draft_model=str(drafter), compose_ngram=True)
    rounds = chained = 0
    for _ in range(3):
        for prompt in MIXED:
            for r in engine.generate(Request(prompt=prompt, max_tokens=64, spec=spec)):
                rounds += not r.prefill
                chained += (r.draft_source or "").startswith("mtp")
    assert rounds > 400 and chained <= 3, (rounds, chained)
