"""Batch independence at T=0: what a request receives from the batch loop equals what it
receives alone (ChatEngine's single-stream loop), token for token and with the same finish --
for every method and draft length, with rows of different k, requests joining and leaving
mid-batch, a queue behind a full batch, a cancel, a stop string, max_tokens and the repetition
stop; on the llama and on the Gemma 3 whose sliding window (8) every run outgrows, also with
the cache compacted on nearly every step (rollback right after a compaction). A broken
rollback (each row's verdict applied to its neighbour) is caught."""

from __future__ import annotations

import pytest

from engines.types import Request, Sampling, SpecConfig
from engines.batch.cache import BatchCache
from engines.batch.engine import BatchEngine

COPY = "the cat is big and the dog is small . the cat is big and the dog is small ."
FRESH = "a red bird and an old fish see the river"


def requests(draft_dir: str) -> list[Request]:
    """Different prompts, lengths, methods and k; one stop string, one short max_tokens, one
    prompt the tiny llama loops on (repetition stop)."""
    return [
        Request(prompt=COPY, max_tokens=48, spec=SpecConfig("ngram", 5)),
        Request(prompt=FRESH, max_tokens=30),
        Request(prompt=COPY + " the sun", max_tokens=40, spec=SpecConfig("draft", 3, draft_model=draft_dir)),
        Request(prompt="big red", max_tokens=5, spec=SpecConfig("ngram", 2)),
        Request(prompt=FRESH + " " + COPY, max_tokens=48, spec=SpecConfig("draft", 7, adaptive=True, draft_model=draft_dir)),
        Request(prompt=COPY, max_tokens=48, spec=SpecConfig("ngram", 1)),  # its stop: with_stop_string
        Request(prompt="hello world", max_tokens=300, spec=SpecConfig("ngram", 7), max_repeat=4),
        Request(prompt="the old moon", max_tokens=36, spec=SpecConfig("draft", 1, draft_model=draft_dir)),
    ]


def with_stop_string(engine, reqs: list[Request], i: int = 5) -> None:
    """Give request i a stop string its output reaches: two words from the middle of its text."""
    words = lone(engine, reqs[i])[2].split()
    reqs[i].stop = [" " + " ".join(words[len(words) // 2: len(words) // 2 + 2])]


def lone(engine, request):
    rounds = list(engine.generate(request))
    return [t for r in rounds for t in r.tokens], rounds[-1].finish, "".join(r.text for r in rounds)


def run_batch(batch: BatchEngine, reqs: list[Request], join_late: int = 3, cancel: int | None = None,
              cancel_after: int = 4):
    """Submit all but the last `join_late` requests now, the rest a few steps later; request
    `cancel` (an index) asks to stop after `cancel_after` of its rounds."""
    seen: dict[int, list] = {}
    stop_flags = {i: False for i in range(len(reqs))}
    seqs = {}

    def submit(i):
        seqs[batch.submit(reqs[i], should_stop=lambda i=i: stop_flags[i]).id] = i

    for i in range(len(reqs) - join_late):
        submit(i)
    steps = 0
    sizes = []
    while batch.busy or len(seqs) < len(reqs):
        if steps == 6:
            for i in range(len(reqs) - join_late, len(reqs)):
                submit(i)
        for seq, rnd in batch.step():
            i = seqs[seq.id]
            seen.setdefault(i, []).append(rnd)
            if i == cancel and len(seen[i]) >= cancel_after:
                stop_flags[i] = True
        sizes.append(batch.size)
        steps += 1
    return seen, sizes


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_every_request_gets_exactly_its_lone_tokens(engines, model, llama_draft_dir, gemma3_draft_dir):
    engine = engines[model]
    reqs = requests(llama_draft_dir if model == "llama" else gemma3_draft_dir)
    with_stop_string(engine, reqs)
    alone = [lone(engine, r) for r in reqs]
    batch = BatchEngine(engine, max_batch=4, budget=None)  # every row drafts its own k (ragged rows)
    got, sizes = run_batch(batch, reqs, cancel=2)
    assert max(sizes) == 4 and 1 <= min(s for s in sizes if s) < 4  # a full batch, joins and leaves
    proposed = accepted = 0
    for i, r in enumerate(reqs):
        tokens = [t for rnd in got[i] for t in rnd.tokens]
        text = "".join(rnd.text for rnd in got[i])
        if i == 2:  # cancelled: a prefix of its lone run, said so
            assert got[i][-1].finish == "cancelled" and tokens == alone[i][0][: len(tokens)]
            assert len(tokens) < len(alone[i][0])
            continue
        assert (tokens, got[i][-1].finish, text) == alone[i], i
        assert [rnd.index for rnd in got[i]] == list(range(len(got[i])))
        proposed += sum(rnd.proposed for rnd in got[i])
        accepted += sum(rnd.accepted for rnd in got[i])
    finishes = {alone[i][1] for i in range(len(reqs))}
    assert {"length", "stop"} <= finishes  # max_tokens and the stop string were reached
    if model == "llama":
        assert "repetition" in finishes  # the looping prompt was stopped by the detector
    assert 0 < accepted < proposed  # drafts both accepted and rejected: rollbacks happened


def test_rollback_right_after_compactions_in_a_batch(engines, gemma3_draft_dir):
    """Compacting on nearly every step (4 dead columns suffice) drops what the sliding window
    no longer sees and the rejected slots; the rows then roll back past it, and still equal
    their lone runs."""
    engine = engines["gemma3"]
    reqs = requests(gemma3_draft_dir)[:5]
    alone = [lone(engine, r) for r in reqs]
    batch = BatchEngine(engine, max_batch=5, compact_min_slots=4, budget=None)
    compactions = []
    real = BatchCache.compact_if_sparse

    def counting(cache, **kw):
        before = sum(t.compactions for t in cache.tables)
        real(cache, **kw)
        compactions.append(sum(t.compactions for t in cache.tables) - before)

    BatchCache.compact_if_sparse = counting
    try:
        got, _ = run_batch(batch, reqs, join_late=0)
    finally:
        BatchCache.compact_if_sparse = real
    assert sum(compactions) > 20
    for i in range(len(reqs)):
        assert [t for rnd in got[i] for t in rnd.tokens] == alone[i][0], i
    rejected = sum(rnd.proposed - rnd.accepted for i in range(len(reqs)) for rnd in got[i])
    assert rejected > 20


def test_a_rollback_applied_to_the_neighbouring_row_is_caught(engines, llama_draft_dir, monkeypatch):
    """Must fail: each row keeps what its neighbour accepted."""
    engine = engines["llama"]
    reqs = requests(llama_draft_dir)[:5]
    alone = [lone(engine, r)[0] for r in reqs]
    real = BatchCache.settle
    monkeypatch.setattr(BatchCache, "settle", lambda cache, kept: real(cache, kept[1:] + kept[:1]))
    got, _ = run_batch(BatchEngine(engine, max_batch=5, budget=None), reqs, join_late=0)
    assert any([t for rnd in got[i] for t in rnd.tokens] != alone[i] for i in range(len(reqs)))


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_the_batch_controller_changes_drafts_not_tokens(engines, model, llama_draft_dir, gemma3_draft_dir):
    """With the batch-aware controller on (serve's default), rows draft what this machine's
    measured step costs say pays; the tokens are still each request's lone tokens."""
    engine = engines[model]
    reqs = requests(llama_draft_dir if model == "llama" else gemma3_draft_dir)[:6]
    alone = [lone(engine, r)[0] for r in reqs]
    batch = BatchEngine(engine, max_batch=6)
    got, _ = run_batch(batch, reqs, join_late=2)
    for i in range(len(reqs)):
        assert [t for rnd in got[i] for t in rnd.tokens] == alone[i], i
    assert batch.budget.costs.ready  # it measured forwards of more than one size


def test_choices_of_one_request_share_its_prefill(engines, monkeypatch):
    """n choices: the first reads the prompt, the others copy its cache (one prefill); at T=0
    each choice equals the lone run; at T>0 with one seed per choice they differ."""
    from engines.types import Sampling

    engine = engines["llama"]
    request = Request(prompt=COPY, max_tokens=24, spec=SpecConfig("ngram", 3))
    batch = BatchEngine(engine, max_batch=4, prefill_chunk=8)
    prefilled = []  # tokens fed to caches other than the batch's: the prompts' reading
    real = BatchEngine._forward

    def counting(self, cache, rows, seqs):
        if cache is not self.cache:
            prefilled.append(len(rows[0]))
        return real(self, cache, rows, seqs)

    monkeypatch.setattr(BatchEngine, "_forward", counting)
    first = batch.submit(request)
    twins = [batch.submit(request, twin_of=first) for _ in range(2)]
    got = {s.id: [] for s in [first, *twins]}
    while batch.busy:
        for seq, rnd in batch.step():
            got[seq.id] += rnd.tokens
    monkeypatch.undo()
    alone = lone(engine, request)[0]
    assert all(tokens == alone for tokens in got.values())
    prompt = len(engine.prompt_ids(request))
    assert sum(prefilled) == prompt - 1 + 3  # the body read once, then each choice's last token

    sampled = [Request(prompt=COPY, max_tokens=24, sampling=Sampling(temperature=1.0, seed=s)) for s in (1, 2)]
    batch = BatchEngine(engine, max_batch=4)
    a = batch.submit(sampled[0])
    b = batch.submit(sampled[1], twin_of=a)
    assert batch.joining[1].twin_of is a
    out = {a.id: [], b.id: []}
    while batch.busy:
        for seq, rnd in batch.step():
            out[seq.id] += rnd.tokens
    assert out[a.id] != out[b.id]


def test_a_drafter_fault_falls_back_for_that_sequence_only(engines, llama_draft_dir, monkeypatch):
    """An n-gram drafter that breaks on its third proposal (tests/faults.py): the one sequence
    whose drafter broke decodes plainly from then on and its round says so; the others keep
    drafting; every request still gets its lone tokens."""
    from tests.faults import break_ngram_drafter_on_third_call

    engine = engines["llama"]
    reqs = requests(llama_draft_dir)[:3]  # n-gram, plain, draft model: one n-gram drafter in all
    alone = [lone(engine, r)[0] for r in reqs]
    break_ngram_drafter_on_third_call(monkeypatch)
    got, _ = run_batch(BatchEngine(engine, max_batch=3, budget=None), reqs, join_late=0)
    for i in range(3):
        assert [t for rnd in got[i] for t in rnd.tokens] == alone[i], i
    notes = [rnd.note for rnd in got[0] if rnd.note]
    assert any("speculation stopped" in n and "drafter broke" in n for n in notes)
    broke_at = next(j for j, rnd in enumerate(got[0]) if rnd.note and "drafter broke" in rnd.note)
    assert all(rnd.proposed == 0 for rnd in got[0][broke_at + 1:])  # plain from then on
    assert not any(rnd.note for rnd in got[2]) and sum(rnd.accepted for rnd in got[2]) > 0  # the other drafts on


def test_short_prompts_join_together_and_a_long_one_a_chunk_per_step(engines):
    """The prefill budget per step is one chunk's worth of prompt tokens: three short prompts
    join in the same step; a prompt of three chunks takes three steps, with the running rows
    decoding between its chunks; every request still gets its lone tokens."""
    engine = engines["llama"]
    short = [Request(prompt=p, max_tokens=12) for p in ("big red", "the old moon", "a red bird")]
    long = Request(prompt=" ".join([COPY] * 3), max_tokens=12)
    chunk = 24
    assert chunk < len(engine.prompt_ids(long)) - 1 <= 3 * chunk
    batch = BatchEngine(engine, max_batch=4, prefill_chunk=chunk, budget=None)
    seqs = [batch.submit(r) for r in short]
    first = batch.step()
    assert {s.id for s, rnd in first if rnd.prefill} == {s.id for s in seqs}  # all three joined at once
    later = batch.submit(long)
    steps_to_join, got = 0, {s.id: [] for s in [*seqs, later]}
    for s, rnd in first:
        got[s.id] += rnd.tokens
    while batch.busy:
        out = batch.step()
        if not any(s is later and rnd.prefill for s, rnd in out) and any(j.seq is later for j in batch.joining):
            steps_to_join += 1
            assert any(s in seqs for s, _ in out)  # the running rows decode between its chunks
        for s, rnd in out:
            got[s.id] += rnd.tokens
    assert steps_to_join == 2  # chunks 1 and 2 in their own steps, chunk 3 and its first token in the third
    for s, r in zip([*seqs, later], [*short, long]):
        assert got[s.id] == lone(engine, r)[0]


def test_a_shared_drafter_fault_stops_its_rows_and_says_why(engines, llama_draft_dir, monkeypatch):
    """The batch's draft model (shared by two rows) breaks on its third call: both its rows
    decode plainly from that step on -- no row asks it again on its own in the same step -- and
    each row's note names the real error; every request still gets its lone tokens."""
    from engines.batch.drafter import BatchDrafter

    engine = engines["llama"]
    reqs = [r for r in requests(llama_draft_dir) if r.spec.method == "draft"][:2]
    alone = [lone(engine, r)[0] for r in reqs]
    real, calls = BatchDrafter.propose, [0]

    def propose(self, asks):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("shared drafter broke")
        return real(self, asks)

    monkeypatch.setattr(BatchDrafter, "propose", propose)
    got, _ = run_batch(BatchEngine(engine, max_batch=2, budget=None), reqs, join_late=0)
    assert calls[0] == 3  # nothing asked it again
    for i in range(2):
        assert [t for rnd in got[i] for t in rnd.tokens] == alone[i], i
        notes = [rnd.note for rnd in got[i] if rnd.note]
        assert notes and all("shared drafter broke" in n for n in notes), notes
        broke_at = next(j for j, rnd in enumerate(got[i]) if rnd.note)
        assert all(rnd.proposed == 0 for rnd in got[i][broke_at:]), i


def test_steps_auto_in_a_batch_row_learns_its_rounds_costs(engines):
    """A row's --steps auto prices widths from its own rounds -- the step's verify, its drafting
    -- as a lone run's does; without them it never learned a cost in a batch. And its Rounds say
    what auto expected of each k as it chose (the window plots it), as a lone run's do."""
    engine = engines["llama"]
    # (no batch-aware cap: priced by this machine's step times, under load it may hold the rows
    # to one width, and auto then has nothing to price widths by)
    batch = BatchEngine(engine, max_batch=2, budget=None)
    reqs = [Request(prompt=p, max_tokens=40, spec=SpecConfig("ngram", 3, auto=True))
            for p in ("the cat and the dog see the cat and the dog see the", "a red bird and a red bird and a")]
    seqs = [batch.submit(r) for r in reqs]
    rounds = []
    while batch.busy:
        rounds += [rnd for _, rnd in batch.step()]
    for seq in seqs:
        auto = seq.schedule.auto
        assert auto is not None
        measured = auto.costs.seconds
        assert measured and all(s > 0 for s in measured.values()), measured
    assert any(r.expected_tok_s for r in rounds) and any(r.expected_tokens for r in rounds)


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_plain_rows_launch_the_next_step_ahead_and_keep_their_lone_tokens(engines, model):
    """Plain rows launch each step's forward on the last step's tokens still in the graph. With
    rows leaving at different steps (max_tokens, a stop string, a cancel), two joining while a
    step is in flight, and (Gemma 3) the cache compacted on nearly every step, each request
    still gets its lone tokens -- and seeded T>0 rows the draws they get in a batch of one. Shown
    to fail with the step launched ahead fed the wrong row's token."""
    engine = engines[model]
    greedy = [Request(prompt=p, max_tokens=n) for p, n in
              ((FRESH, 30), ("big red", 7), (COPY, 24), ("the old moon", 40), (COPY + " the sun", 18))]
    with_stop_string(engine, greedy, 3)
    sampled = [Request(prompt=p, max_tokens=n, sampling=Sampling(temperature=0.9, seed=s))
               for p, n, s in ((FRESH, 25, 1), ("big red", 9, 2), (COPY, 20, 3))]
    for reqs, alone in ((greedy, [lone(engine, r) for r in greedy]),
                        (sampled, [lone(BatchEngine(engine, max_batch=1), r) for r in sampled])):
        batch = BatchEngine(engine, max_batch=4, compact_min_slots=4, budget=None)
        ahead = []
        real = batch._verify_forward

        def counting(rows, steps, after=None):
            ahead.append(after is not None)
            return real(rows, steps, after)

        batch._verify_forward = counting
        got, _ = run_batch(batch, reqs, join_late=2, cancel=1 if reqs is greedy else None, cancel_after=3)
        for i in range(len(reqs)):
            tokens = [t for rnd in got[i] for t in rnd.tokens]
            if reqs is greedy and i == 1:
                assert got[i][-1].finish == "cancelled" and tokens == alone[i][0][: len(tokens)]
                continue
            assert (tokens, got[i][-1].finish) == alone[i][:2], (i, tokens, alone[i][0])
        assert sum(ahead) > len(ahead) / 2, ahead  # most steps were launched ahead


def test_a_first_token_is_not_held_back_for_a_forward(engines):
    """Into an idle batch, the step that reads the prompts returns their first tokens alone (a
    lone request's time to first token); their first forward is the next step's. Into a running
    batch, a joining row's first token comes with the running rows' step, which it joins (they
    never wait for it)."""
    batch = BatchEngine(engines["llama"], max_batch=4, budget=None)
    a = batch.submit(Request(prompt=COPY, max_tokens=8, spec=SpecConfig("ngram", 3)))
    b = batch.submit(Request(prompt=FRESH, max_tokens=8))
    assert [(seq, rnd.prefill) for seq, rnd in batch.step()] == [(a, True), (b, True)]
    assert [(seq, rnd.prefill) for seq, rnd in batch.step()] == [(a, False), (b, False)]
    c = batch.submit(Request(prompt="big red", max_tokens=8))
    assert [(seq, rnd.prefill) for seq, rnd in batch.step()] == [(c, True), (a, False), (b, False), (c, False)]
