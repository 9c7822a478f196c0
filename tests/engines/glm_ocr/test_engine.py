"""The OCR round loop on the PyTorch runtime: plain decoding equals transformers' greedy
generate; MTP speculation at every depth 1..7 emits exactly the same tokens, with drafts
accepted often but not always (asserted on counts); the MTP layer consumes the target's
final-normed hidden state."""

import numpy as np
import pytest
import torch
from PIL import Image

from engines.types import EngineError, Request, Sampling, SpecConfig
from engines.glm_ocr.engine import MtpDrafter, OcrEngine
from engines.glm_ocr.weights import load_reference, reference_mtp_forward
from engines.speculative.rounds import session_stats
from tests.engines.glm_ocr.replay import ReplayDrafter
from tests.engines.glm_ocr.checkpoints import hf_greedy, reference_input_embeds, reference_prompt

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def engine(trained_glm_ocr):
    e = OcrEngine.load(trained_glm_ocr[0], runtime="torch", cache_length=320)
    e.repetition = None  # random tiny models loop; the guard has its own test
    return e


def run(engine, image, steps=0, max_tokens=MAX_TOKENS, drafter=None, **kw):
    spec = SpecConfig(method="mtp" if steps else "off", steps=steps)
    req = Request(kind="ocr", image=str(image), max_tokens=max_tokens, spec=spec, **kw)
    rounds = list(engine.generate(req, drafter=drafter))
    return [t for r in rounds for t in r.tokens], rounds


@pytest.fixture(scope="module")
def plain(engine, trained_glm_ocr):
    return {str(p): run(engine, p)[0] for p in trained_glm_ocr[1][:2]}


def test_plain_decoding_equals_transformers_greedy_generate(trained_glm_ocr, plain):
    path, images = trained_glm_ocr
    model = load_reference(path).model
    for image in images[:2]:
        expected = hf_greedy(model, reference_prompt(path, Image.open(image)), MAX_TOKENS)
        assert plain[str(image)] == expected
        assert len(expected) >= 8  # a real sequence, not an immediate EOS


@pytest.mark.parametrize("steps", range(1, 8))
def test_mtp_is_lossless_at_every_depth(engine, trained_glm_ocr, plain, steps):
    proposed = accepted = 0
    for image in trained_glm_ocr[1][:2]:
        tokens, rounds = run(engine, image, steps)
        assert tokens == plain[str(image)]
        for r in rounds[1:]:
            assert len(r.accept_flags) == r.proposed <= steps and sum(r.accept_flags) == r.accepted
            if r.finish is None:
                assert len(r.tokens) == r.accepted + 1  # accepted drafts + the target's own token
        assert rounds[0].prefill and len(rounds) < len(tokens) + 1 or steps == 0
        proposed += sum(r.proposed for r in rounds)
        accepted += sum(r.accepted for r in rounds)
    # the trained MTP layer is accepted often; chained steps (trained only at depth 1 and on
    # these images) are not always accepted, so rejections and rollbacks happen from depth 2
    assert accepted > 0.2 * proposed, (accepted, proposed)
    if steps >= 2:
        assert accepted < proposed, (accepted, proposed)


@pytest.mark.parametrize("steps", [1, 4, 7])
def test_replay_drafter_with_errors_is_lossless_and_accepted_as_injected(engine, trained_glm_ocr, plain, steps):
    image = trained_glm_ocr[1][0]
    reference = plain[str(image)]
    drafter = ReplayDrafter(reference, 0.25, engine.config.text.vocab_size, seed=steps)
    tokens, rounds = run(engine, image, steps, drafter=drafter)
    assert tokens == reference
    stats = session_stats(rounds)
    # first-position acceptance ~ 0.75 (an injected error is always rejected)
    assert 0.5 < stats.per_position_acceptance[0] < 0.95, stats.per_position_acceptance
    assert stats.accepted < stats.proposed


def test_mtp_consumes_the_final_normed_hidden_state(engine, trained_glm_ocr):
    """Record the MTP layer's first call (prompt prefill + first chain step) and compare with
    transformers' modules fed the final-normed hidden (last_hidden_state, what the LM head
    sees): equal; fed the pre-norm hidden: different."""
    path, images = trained_glm_ocr
    req = Request(kind="ocr", image=str(images[0]), max_tokens=3, spec=SpecConfig(method="mtp", steps=1))
    prompt = engine._prompt(req)
    ids, positions = prompt.ids, prompt.positions
    calls = []

    class Recording(MtpDrafter):
        def _run(self, start, previous_hidden, embeds):
            out = super()._run(start, previous_hidden, embeds)
            calls.append(out)
            return out

    tokens, _ = run(engine, images[0], 1, max_tokens=3,
                    drafter=Recording(engine.runtime, positions, engine.config.eos_token_ids))
    _, head = calls[0]
    ref = load_reference(path)
    inputs = reference_prompt(path, Image.open(images[0]))
    with torch.no_grad():
        normed = ref.model.model(**inputs).last_hidden_state
        # the pre-norm hidden, up to a per-row scale (which the MTP's hnorm removes anyway)
        pre_norm = normed / ref.model.model.language_model.norm.weight
        # the next row's input embedding: image features for image tokens (vLLM's convention)
        prompt_embeds = reference_input_embeds(ref.model, inputs)
        first = ref.model.model.language_model.embed_tokens(torch.tensor([[tokens[0]]]))
        nxt = torch.cat([prompt_embeds[:, 1:], first], dim=1)
        pos = torch.from_numpy(positions.rows(0, len(ids)))[:, None]
        _, expected = reference_mtp_forward(ref, normed, nxt, pos)
        _, wrong = reference_mtp_forward(ref, pre_norm, nxt, pos)
    assert head.shape == expected[0].shape
    assert np.allclose(head, expected[0].numpy(), atol=2e-4)
    assert not np.allclose(head, wrong[0].numpy(), atol=1e-2)


def test_sampling_with_mtp_runs_and_respects_max_tokens(engine, trained_glm_ocr):
    image = trained_glm_ocr[1][0]
    sampling = Sampling(temperature=0.8, seed=1)
    tokens, rounds = run(engine, image, 3, max_tokens=20, sampling=sampling)
    again, _ = run(engine, image, 3, max_tokens=20, sampling=sampling)
    assert tokens == again  # seeded
    assert len(tokens) <= 20 and rounds[-1].finish in ("stop", "length")


def test_max_tokens_flag_and_errors(engine, trained_glm_ocr, tiny_glm_ocr_no_mtp):
    tokens, rounds = run(engine, trained_glm_ocr[1][1], 3, max_tokens=5)
    assert len(tokens) <= 5
    assert rounds[-1].finish == "length" or (rounds[-1].finish == "stop" and len(tokens) < 5)
    with pytest.raises(EngineError):
        run(engine, trained_glm_ocr[1][0], 9)  # steps above the contract's 7
    no_mtp = OcrEngine.load(tiny_glm_ocr_no_mtp, cache_length=320)
    no_mtp.repetition = None
    tokens, rounds = run(no_mtp, trained_glm_ocr[1][0], 3, max_tokens=6)
    assert "MTP unavailable" in rounds[0].note and all(r.proposed == 0 for r in rounds)


def test_repetition_guard_stops_at_the_same_token_with_and_without_mtp(trained_glm_ocr):
    from engines.speculative.repetition import RepetitionDetector

    g = RepetitionDetector(copies=3, max_period=8, min_span=12)
    seq = [5, 6, 7, 8] + [1, 2, 3] * 5
    flags = [g.push(t) for t in seq]
    first = next(i for i, f in enumerate(flags) if f)
    assert flags[first] == 3 and first == 4 + 12 - 1  # 12 tokens of period 3
    e = OcrEngine.load(trained_glm_ocr[0], cache_length=320)
    e.repetition = RepetitionDetector(max_period=16, min_span=8)
    results = []
    for steps in (0, 3):
        tokens, rounds = run(e, trained_glm_ocr[1][0], steps, max_tokens=120, max_repeat=3)
        results.append((tokens, rounds[-1].finish))
    assert results[0] == results[1]


def test_round_accepted_is_the_verdict_before_clipping(engine, trained_glm_ocr, plain, monkeypatch):
    """A run that ends inside an accepted burst (the output's stop token is a draft the target
    accepted): Round.accepted counts every accepted draft, as engines/speculative/rounds.py
    defines it, while the emitted tokens stop at the stop token."""
    image = trained_glm_ocr[1][0]
    reference = plain[str(image)]
    # a stop token that first occurs at a draft's place (7 drafts per round: the target's own
    # token of round r is token 8r)
    stop_at = next(j for j in range(1, len(reference)) if j % 8 not in (0, 7) and reference[j] not in reference[:j])
    monkeypatch.setattr(engine.config, "eos_token_ids", [*engine.config.eos_token_ids, reference[stop_at]])
    drafter = ReplayDrafter(reference, 0.0, engine.config.text.vocab_size)
    tokens, rounds = run(engine, image, 7, drafter=drafter)
    assert tokens == reference[: stop_at + 1] and rounds[-1].finish == "stop"
    last = rounds[-1]
    assert last.accepted == last.proposed == 7 and sum(last.accept_flags) == 7
    assert sum(last.from_draft) == len(last.tokens) < last.accepted
    assert session_stats(rounds).acceptance_rate == 1.0


def test_streamed_text_and_draft_spans(engine, trained_glm_ocr):
    """The rounds' texts, streamed token by token, add up to the one-shot decode of the output;
    draft_spans lie in their round's text and, where every token is one ASCII character, cover
    exactly the text of the accepted drafts."""
    tokens, rounds = run(engine, trained_glm_ocr[1][1], 4)
    assert "".join(r.text for r in rounds) == engine.decode(tokens)
    checked = 0
    for r in rounds:
        assert all(0 <= a < b <= len(r.text) for a, b in r.draft_spans)
        if r.draft_spans and all(t < 128 for t in r.tokens):
            drafted = [t for t, d in zip(r.tokens, r.from_draft) if d]
            assert "".join(r.text[a:b] for a, b in r.draft_spans) == engine.decode(drafted)
            checked += 1
    assert checked > 0


def auto_run(engine, image, max_tokens=48):
    spec = SpecConfig(method="mtp", steps=2, auto=True)
    rounds = list(engine.generate(Request(kind="ocr", image=str(image), max_tokens=max_tokens, spec=spec)))
    return rounds, [r.steps for r in rounds if not r.prefill and r.expected_tok_s]


@pytest.mark.alone  # auto learns from the rounds' wall time
def test_steps_auto_picks_k_from_this_runs_costs(engine, trained_glm_ocr, monkeypatch):
    """--steps auto on OCR prices each k by what this run's verify forwards cost and what its
    drafts were accepted at. The runtime is given a cost shaped like float32 on this CPU (MKL
    reads the weights once per 3 rows: 1-3 rows cost one unit, 4-6 two, 7-8 three): auto then
    drafts 2 (verify of 3), 3 only in its probes; with a flat cost the same drafts pay longer
    chains. Tokens stay plain decoding's either way. 96 tokens: in 48 a flat run's first
    rejections can leave its second half six rounds, too few to show the choice its prices make."""
    import math
    import time

    _, images = trained_glm_ocr
    tokens = 96
    plain = [t for r in engine.generate(Request(kind="ocr", image=str(images[0]), max_tokens=tokens, spec=SpecConfig()))
             for t in r.tokens]
    decode_rows = engine.runtime.decode_rows  # the round's verify forward (a batch of one)

    def costed(blocks):
        def decode_at_a_cost(kv, embeds, cos, sin):
            time.sleep(0.03 * blocks(embeds.shape[1]))
            return decode_rows(kv, embeds, cos, sin)
        return decode_at_a_cost

    chosen, best = {}, {}
    for shape, blocks in (("steps", lambda rows: math.ceil(rows / 3)), ("flat", lambda rows: 1)):
        monkeypatch.setattr(engine.runtime, "decode_rows", costed(blocks))
        engine.auto_seen.clear()  # each shape measured from scratch (pages read in a row share them)
        rounds, ks = auto_run(engine, images[0], max_tokens=tokens)
        assert [t for r in rounds for t in r.tokens] == plain
        assert not [r.note for r in rounds if r.note]  # no "not tuned" line: it measured itself
        assert len(ks) >= 5 and all(len(r.expected_tok_s) == 8 for r in rounds if r.expected_tok_s)
        chosen[shape] = ks[len(ks) // 2:]  # once it has seen the costs
        priced = [r.expected_tok_s for r in rounds if r.expected_tok_s][-1]  # tok/s by k, as auto last priced them
        best[shape] = priced.index(max(priced))
    from engines.speculative.tuning import PROBE_AFTER

    probes = len(chosen["steps"]) // (PROBE_AFTER + 1) + 1  # one round in nine drafts one more (tuning.PROBE_AFTER)
    assert sum(k > 2 for k in chosen["steps"]) <= probes and max(chosen["steps"]) <= 3, chosen
    assert sum(k >= 3 for k in chosen["flat"]) > len(chosen["flat"]) / 2, chosen
    assert best["steps"] == 2 and best["flat"] >= 3, best


def test_steps_auto_starts_a_page_from_the_pages_before(engine, trained_glm_ocr):
    """Pages read one after another (a document, a batch of one each) share --steps auto's
    measurements, as a chat's requests do: the second page's auto prices its first round."""
    _, images = trained_glm_ocr
    engine.auto_seen.clear()
    first, _ = auto_run(engine, images[0])
    second, _ = auto_run(engine, images[1])
    first_round = [next(r for r in rounds if not r.prefill) for rounds in (first, second)]
    assert first_round[0].expected_tok_s is None and first_round[1].expected_tok_s is not None
    assert len(engine.auto_seen) == 1
