"""`serve --drafter-on every-rank` (option B): every rank runs the draft model, against rank 0
alone drafting (option A, the default).

In one process (a singleton group, as test_mirror.py): rank 0's messages replayed by a follower's
Replica with its own copy of the draft model -- its drafts are rank 0's, row for row, at T=0 and
seeded T>0, and the answers are the plain batch's; a forward whose drafts are not the follower's
is a divergence. Before any rank starts: one line where there is no draft model to replicate.
Slow: two ranks over mlx.launch, option A then option B (one server at a time), each against one
process -- T=0 and seeded tokens identical, the same acceptance counts under A and B, and under B
the follower's own drafts, each checked equal to rank 0's, as many as rank 0's; and B under a
pipeline split."""

from __future__ import annotations

import threading
import time

import pytest
from tests.engines.chat import load_chat

mx = pytest.importorskip("mlx.core")

from app.cli.main import main  # noqa: E402
from engines.batch.drafter import BatchDrafter  # noqa: E402
from engines.batch.engine import BatchEngine  # noqa: E402
from engines.distributed.bus import Bus  # noqa: E402
from engines.distributed.drafting import EVERY_RANK, DrafterReplica, DraftsDiffer  # noqa: E402
from engines.distributed.engine import RankZeroEngine  # noqa: E402
from engines.distributed.mirror import FORWARD, Replica, run_forward  # noqa: E402
from engines.mlx_chat.loading import load_model  # noqa: E402
from engines.types import Request, Sampling, SpecConfig  # noqa: E402
from tests.engines.distributed.conftest import start_rank_server, wait_gone  # noqa: E402
from tests.engines.distributed.test_mirror import PROMPTS, RecordingBus  # noqa: E402

DRAFT = SpecConfig("draft", 4)


def requests() -> list[Request]:
    """Draft-model rows at T=0 and seeded T>0, beside an n-gram row and a plain one."""
    return [Request(prompt=PROMPTS[0], max_tokens=30, spec=DRAFT),
            Request(prompt=PROMPTS[1], max_tokens=30, spec=DRAFT, sampling=Sampling(0.8, top_p=0.9, seed=7)),
            Request(prompt=PROMPTS[2], max_tokens=30, spec=SpecConfig("ngram", 3)),
            Request(prompt=PROMPTS[3], max_tokens=30, spec=DRAFT)]


def run(engine, after_step=None) -> list[list[int]]:
    seqs = [engine.submit(r) for r in requests()]
    got = {s.id: [] for s in seqs}
    while engine.busy:
        for s, rnd in engine.step():
            got[s.id] += rnd.tokens
        if after_step is not None:
            after_step()
    return [got[s.id] for s in seqs]


def rank_zero_and_follower(llama, llama_draft):
    chat = load_chat(llama, draft_model=llama_draft)
    bus = RecordingBus.join(mx.distributed.init())
    bus.sent_messages = []
    engine = RankZeroEngine(chat, max_batch=4, prefill_chunk=8, budget=None, bus=bus, drafter_on=EVERY_RANK)
    # the follower's own copy of the draft model, loaded as a follower loads it
    replica = Replica(chat.model, DrafterReplica(BatchDrafter(load_model(llama_draft).model)))

    def follow():
        for message in bus.sent_messages:
            for f in replica.apply(message):
                run_forward(chat.model, f.cache, f.tokens, f.evaluate)
        bus.sent_messages.clear()

    return engine, replica, follow


def test_a_follower_drafts_what_rank_zero_drafts(llama, llama_draft):
    engine, replica, follow = rank_zero_and_follower(llama, llama_draft)
    tokens = run(engine, after_step=follow)
    alone = run(BatchEngine(load_chat(llama, draft_model=llama_draft), max_batch=4, prefill_chunk=8, budget=None))
    assert tokens == alone
    assert engine._drafted > 50 and replica.drafter.drafted == engine._drafted  # every draft checked equal
    assert replica.drafter.draft_s > 0
    assert len(replica.drafter.drafter.rows) == 0  # every row left the follower's drafter as rank 0's
    engine.shutdown()


def test_a_forward_whose_drafts_are_not_the_follower_s_is_a_divergence(llama, llama_draft):
    engine, replica, follow = rank_zero_and_follower(llama, llama_draft)
    engine.submit(requests()[0])
    for _ in range(10):  # up to the first drafting step: the follower drafts, then the forward comes
        engine.step()
        messages = list(engine.bus.sent_messages)
        engine.bus.sent_messages.clear()
        for i, message in enumerate(messages):
            at = _forward_at(message)
            if replica.drafter.expected and at is not None:
                place, mine = next(iter(replica.drafter.expected.items()))
                width = message[at + 5]
                message[at + 6 + place * width + 1] = (mine[0] + 1) % 50  # rank 0's first draft, changed
                with pytest.raises(DraftsDiffer, match="are not rank 0's"):
                    replica.apply(message)
                return
            for f in replica.apply(message):
                run_forward(engine.model, f.cache, f.tokens, f.evaluate)
    raise AssertionError("no drafting step")


def _forward_at(message: list[int]) -> int | None:
    i = 0
    while i < len(message):
        if message[i] == FORWARD:
            return i
        i += 3 + message[i + 2]
    return None


@pytest.mark.parametrize("argv, says", [
    (["--ranks", "2", "--spec", "ngram"], "give --draft-model PATH"),
    (["--ranks", "2", "--spec", "mtp", "--draft-model", "LLAMA"], "only rank 0 holds in a pipeline"),
    (["--spec", "draft", "--draft-model", "LLAMA"], "needs ranks to draft on"),
])
def test_no_draft_model_to_replicate_is_one_line_at_start(llama, capsys, argv, says):
    argv = [llama if a == "LLAMA" else a for a in argv]
    assert main(["serve", "--model", llama, "--drafter-on", "every-rank", *argv]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines


# -- two ranks ----------------------------------------------------------------------------------
BODY = {"temperature": 0, "speculative": {"method": "draft", "steps": 4}}
SEEDED = {"temperature": 0.8, "top_p": 0.9, "seed": 1234, "speculative": {"method": "draft", "steps": 4}}
MIXED = ["draft", "ngram", "draft", "off"]


def answers_of(server) -> dict:
    """What one server answers: two lone T=0 requests, a seeded one, and a batch of four at once
    (draft-model rows beside n-gram and plain ones); then every rank's totals."""
    out = {"lone": [server.chat(p, **BODY) for p in PROMPTS[:2]], "seeded": server.chat(PROMPTS[0], **SEEDED)}
    batch: dict[int, tuple] = {}

    def one(i):
        batch[i] = server.chat(PROMPTS[i], temperature=0, max_tokens=60,
                               speculative={"method": MIXED[i], "steps": 0 if MIXED[i] == "off" else 4})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    out["batch"] = [batch[i] for i in range(4)]
    time.sleep(1.5)  # an idle heartbeat gathers the ranks' totals
    out["report"] = server.get("/v1/spec_decode/metrics")[1]
    return out


def served_answers(llama, llama_draft, tmp, *args) -> dict:
    """One server at a time (the machine runs two ranks at most)."""
    server = start_rank_server(llama, tmp, "--draft-model", llama_draft, "--spec", "draft", "--max-batch", "4",
                               "--check-ranks", *args)
    try:
        out = answers_of(server)
        out["stderr"] = server.stderr()
    finally:
        server.stop()
    wait_gone(server, 30)
    return out


def tokens(answer: dict) -> list[int]:
    return [t for r in answer["rounds"] for t in r["tokens"]]


def accepted(answer: dict) -> tuple[int, int]:
    return answer["timings"]["draft_n"], answer["timings"]["draft_n_accepted"]


@pytest.fixture(scope="module")
def alone(llama, llama_draft) -> dict:
    """The same questions to one process: the same checkpoints through the same server code."""
    from app.serve.protocol import ServedModel
    from app.serve.server import ServeConfig, Served, build_app, start_in_thread
    from tests.engines.distributed.conftest import MODEL, RankServer

    engine = load_chat(llama, draft_model=llama_draft)
    single = start_in_thread(build_app(ServeConfig(max_batch=4), [Served(ServedModel(MODEL, "chat", DRAFT), engine)]))
    try:
        return answers_of(RankServer(None, single.port, None))
    finally:
        single.stop()


@pytest.mark.slow
def test_drafting_on_every_rank_answers_as_one_process_and_rank_zero_alone(llama, llama_draft, tmp_path, alone):
    b = served_answers(llama, llama_draft, tmp_path, "--drafter-on", "every-rank")
    a = served_answers(llama, llama_draft, tmp_path)  # the default: rank 0 drafts alone
    assert "(tensor parallel, the draft model on every rank)" in b["stderr"] and "the draft model on every rank" not in a["stderr"]
    for name in ("lone", "batch"):
        for got_b, got_a, one in zip(b[name], a[name], alone[name]):
            assert got_b[0] == got_a[0] == 200, (got_b, got_a)
            assert tokens(got_b[1]) == tokens(got_a[1]) == tokens(one[1]), name
            # In a batch the controller caps k from this machine's step times, and which steps
            # the requests share is timing too: a batch's draft counts are not repeatable. Alone,
            # a request drafts what it asks: the same proposals and verdicts under A, B and one process.
            if name == "lone":
                assert accepted(got_b[1]) == accepted(got_a[1]) == accepted(one[1]), name
    assert tokens(b["seeded"][1]) == tokens(a["seeded"][1]) == tokens(alone["seeded"][1])
    assert accepted(b["seeded"][1]) == accepted(a["seeded"][1]) == accepted(alone["seeded"][1])
    proposed = sum(accepted(x[1])[0] for x in b["lone"] + b["batch"][:3:2])
    taken = sum(accepted(x[1])[1] for x in b["lone"] + b["batch"][:3:2])
    assert 0 < taken < proposed  # the drafter is accepted often but not always
    rank0, rank1 = b["report"]["rank_times"]
    assert rank0["drafted"] > 50 and rank1["drafted"] == rank0["drafted"]  # each checked equal on rank 1
    assert rank1["draft_s"] > 0
    assert b["report"]["rank_checked_forwards"] > 30
    rank0, rank1 = a["report"]["rank_times"]
    assert rank0["drafted"] > 50 and rank1["drafted"] == 0 and rank1["draft_s"] == 0


@pytest.mark.slow
def test_a_pipeline_drafts_on_every_rank_too(llama, llama_draft, tmp_path, alone):
    """The draft model is whole on every rank whatever splits the target: the same under a
    pipeline (the tiny llama's 2 layers, one per rank)."""
    b = served_answers(llama, llama_draft, tmp_path, "--drafter-on", "every-rank", "--split", "pipeline")
    assert "(pipeline, rank 0 layers 1-1 of 2, the draft model on every rank)" in b["stderr"], b["stderr"]
    for got, one in zip(b["lone"] + b["batch"] + [b["seeded"]], alone["lone"] + alone["batch"] + [alone["seeded"]]):
        assert got[0] == 200 and tokens(got[1]) == tokens(one[1])
    for got, one in zip(b["lone"] + [b["seeded"]], alone["lone"] + [alone["seeded"]]):
        assert accepted(got[1]) == accepted(one[1])
    rank0, rank1 = b["report"]["rank_times"]
    assert rank0["drafted"] > 50 and rank1["drafted"] == rank0["drafted"]
