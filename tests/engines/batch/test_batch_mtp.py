"""MTP in the batch at T=0: rows drafting with an MTP drafter (one trained here on the tiny
llama and on the tiny Gemma 3 whose 8-token window every run outgrows; the tiny Gemma 4 pair's
assistant) draft together, each reading its own row of the batch's target K/V and its own
hidden state, beside n-gram and plain rows. Each request gets exactly its lone tokens, and --
since the trained drafters are accepted often but not always -- its lone run's acceptance,
round for round: a hidden state taken from the wrong position is caught by that."""

from __future__ import annotations

import pytest

from engines.types import Request, SpecConfig
from engines.batch.engine import BatchEngine
from tests.engines.batch.test_batch_equals_lone import COPY, FRESH, run_batch
from tests.engines.training.trained import prompts
from tests.engines.mlx_chat import checkpoints
from tests.engines.chat import load_chat

TRAINED_ON = prompts(checkpoints.WORDS)[:3]


def mtp_requests(drafter: str, draft_model: str | None = None) -> list[Request]:
    mtp = lambda k, **kw: SpecConfig("mtp", k, draft_model=drafter, **kw)  # noqa: E731
    other = [Request(prompt=COPY + " the sun", max_tokens=30, spec=SpecConfig("draft", 3, draft_model=draft_model))]
    return [
        Request(prompt=TRAINED_ON[0], max_tokens=40, spec=mtp(3)),
        Request(prompt=COPY, max_tokens=32, spec=SpecConfig("ngram", 4)),
        Request(prompt=TRAINED_ON[1], max_tokens=36, spec=mtp(1)),
        Request(prompt=FRESH, max_tokens=24),
        Request(prompt=TRAINED_ON[2], max_tokens=40, spec=mtp(5, adaptive=True)),
        Request(prompt=FRESH + " " + TRAINED_ON[0], max_tokens=30, spec=mtp(2)),
    ] + (other if draft_model else [])


def lone_rounds(engine, request):
    """The request alone, its steps launched one after another's verdict as the batch's here
    are: a batch of one otherwise launches the next verify before reading the last verdict, and
    its schedule (skip streak, adaptive k) then decides one round later -- the same tokens,
    other draft lengths (tests/engines/batch/test_batch_ahead.py checks that)."""
    from engines.mlx_chat.options import MtpOptions

    before, engine.mtp_options = engine.mtp_options, MtpOptions(ahead=False)
    try:
        return list(engine.generate(request))
    finally:
        engine.mtp_options = before


def summary(rounds):
    """What must match the lone run: tokens, finish, and per round (proposed, accepted)."""
    return ([t for r in rounds for t in r.tokens], rounds[-1].finish,
            [(r.proposed, r.accepted) for r in rounds])


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_mtp_rows_get_their_lone_tokens_and_acceptance(targets, model, llama_draft_dir, gemma3_draft_dir):
    """All four methods in one batch: MTP at k 1/2/3/5 (adaptive), n-gram, a draft model, off."""
    engine, _, drafter_dir = targets[model]
    reqs = mtp_requests(str(drafter_dir), llama_draft_dir if model == "llama" else gemma3_draft_dir)
    alone = [summary(lone_rounds(engine, r)) for r in reqs]
    # Gemma 3: compact on nearly every step, so rows roll back right after compactions.
    batch = BatchEngine(engine, max_batch=4, budget=None, compact_min_slots=4 if model == "gemma3" else 64,
                        verifies_ahead=False)
    got, sizes = run_batch(batch, reqs, join_late=2)
    assert max(sizes) == 4
    for i in range(len(reqs)):
        assert summary(got[i]) == alone[i], i
    mtp_rounds = [r for i in (0, 2, 4, 5) for r in got[i]]
    proposed, accepted = sum(r.proposed for r in mtp_rounds), sum(r.accepted for r in mtp_rounds)
    assert 0.15 * proposed < accepted < proposed, (accepted, proposed)  # accepted often, not always
    assert not any(r.note for r in mtp_rounds)  # drafted in the batch, nothing fell back


def test_a_hidden_state_from_the_wrong_position_is_caught(targets, monkeypatch):
    """Must fail: every MTP row chains from the hidden state at its round's first position
    instead of its last accepted one -- tokens stay lossless, acceptance changes."""
    from engines.speculative.sequence import Sequence

    engine, _, drafter_dir = targets["llama"]
    reqs = mtp_requests(str(drafter_dir))[:3]
    alone = [summary(lone_rounds(engine, r)) for r in reqs]
    real = Sequence.commit

    def first_position(self, step, verdict, hidden=None, priced=True):
        if hidden is not None:
            hidden = step.hidden[0]
        return real(self, step, verdict, hidden, priced)

    monkeypatch.setattr(Sequence, "commit", first_position)
    got, _ = run_batch(BatchEngine(engine, max_batch=3, budget=None, verifies_ahead=False), reqs, join_late=0)
    assert all(summary(got[i])[0] == alone[i][0] for i in range(3))  # lossless regardless
    assert any(summary(got[i])[2] != alone[i][2] for i in (0, 2))


def test_gemma4_assistant_rows_in_a_batch(dense_pair):
    """The Gemma 4 assistant over the batched Gemma 4 target (its full and sliding K/V, its
    KV-shared layers): MTP rows of different k beside a plain row get their lone tokens and
    their lone per-round acceptance."""

    engine = load_chat(str(dense_pair.target))
    mtp = lambda k: SpecConfig("mtp", k, draft_model=str(dense_pair.assistant))  # noqa: E731
    reqs = [Request(prompt="the cat and the dog", max_tokens=24, spec=mtp(3)),
            Request(prompt="a red bird", max_tokens=20),
            Request(prompt="we see the old moon and the sun", max_tokens=28, spec=mtp(5))]
    alone = [summary(lone_rounds(engine, r)) for r in reqs]
    got, _ = run_batch(BatchEngine(engine, max_batch=3, budget=None, verifies_ahead=False), reqs, join_late=1)
    for i in range(3):
        assert summary(got[i]) == alone[i], i
    assert sum(r.proposed for r in got[0] + got[2]) > 20 and not any(r.note for r in got[0])


def test_gemma4_assistant_drafts_in_a_batch_equal_its_lone_drafts(dense_pair, monkeypatch):
    """The assistant is random (rarely accepted), so its drafts themselves are compared: from
    the same context every row of a batch of two, compacted on nearly every step, drafts what
    it drafts alone (a batch of one that never compacts), past the sliding window (which a
    window one position short, a neighbour's K/V or a compaction's lost slot would change)."""
    from engines.batch.mtp import BatchMTP
    from tests.engines.mlx_chat.gemma4.checkpoints import SLIDING_WINDOW

    engine = load_chat(str(dense_pair.target))
    mtp = lambda k: SpecConfig("mtp", k, draft_model=str(dense_pair.assistant))  # noqa: E731
    reqs = [Request(prompt="the cat and the dog", max_tokens=40, spec=mtp(3)),
            Request(prompt="we see the old moon and the sun", max_tokens=40, spec=mtp(5))]
    drafts = {}
    real = BatchMTP.propose

    def propose(self, cache, asks, after=None):
        made = real(self, cache, asks, after)
        for (_, ctx, _, _), d in zip(asks, made):
            drafts.setdefault(tuple(ctx.tokens), []).append(d.tokens.tolist())
        return made

    monkeypatch.setattr(BatchMTP, "propose", propose)
    for r in reqs:
        lone_rounds(engine, r)
    lone_drafts, drafts = drafts, {}
    # compacting on nearly every step drops what the window no longer needs: the drafter's
    # sliding layers still see the last kept token's whole window
    run_batch(BatchEngine(engine, max_batch=2, budget=None, compact_min_slots=2, verifies_ahead=False), reqs,
              join_late=0)
    batch_drafts = drafts
    assert len(batch_drafts) > 15 and max(len(c) for c in batch_drafts) > 2 * SLIDING_WINDOW
    assert all(batch_drafts[c] == lone_drafts[c] for c in batch_drafts)


def test_the_compiled_drafter_step_is_traced_once_per_buffer(dense_pair, monkeypatch):
    """mx.compile traces the drafter's step again for every new input shape, and keeps every
    trace (each call then searches them): BatchMTP.view hands it the target's whole K/V buffers,
    their unwritten columns masked, so a request whose cache stays in one buffer (STEP slots)
    traces it once. Sliced to the written columns, it would trace nearly every round."""
    from engines.mlx_chat import gemma4_assistant

    traced = []
    compile_step = gemma4_assistant.compile_step

    def counting(step):
        def step_traced(*args):
            traced.append(1)  # called only while mx.compile traces
            return step(*args)
        return compile_step(step_traced)

    monkeypatch.setattr(gemma4_assistant, "compile_step", counting)
    engine = load_chat(str(dense_pair.target))
    spec = SpecConfig("mtp", 3, draft_model=str(dense_pair.assistant))
    rounds = list(engine.generate(Request(prompt="the cat and the dog", max_tokens=40, spec=spec)))
    assert sum(1 for r in rounds if r.proposed) > 10
    assert len(traced) == 1
