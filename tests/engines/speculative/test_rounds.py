import csv
import io
import json

import pytest

from engines.speculative.rounds import Round, session_stats
from engines.speculative.session import Session
from engines.speculative.trace import TraceError, TraceWriter


def rnd(i, proposed, accepted, n_tokens, wall, prefill=False, flags=None):
    flags = flags if flags is not None else [True] * accepted + [False] * (proposed - accepted)
    return Round(
        index=i, proposed=proposed, accepted=accepted, tokens=list(range(n_tokens)),
        from_draft=[True] * accepted + [False] * (n_tokens - accepted), text="x" * n_tokens,
        accept_flags=flags, draft_s=0.001, verify_s=wall - 0.001, wall_s=wall, prefill=prefill,
    )


def test_session_stats_from_the_contract():
    rounds = [
        rnd(0, 0, 0, 1, 0.5, prefill=True),  # prefill: time to first token
        rnd(1, 3, 3, 4, 0.1),  # all accepted + bonus
        rnd(2, 3, 1, 2, 0.1, flags=[True, False, False]),
        rnd(3, 3, 0, 1, 0.2, flags=[False, False, False]),
    ]
    s = session_stats(rounds)
    assert s.rounds == 4 and s.decode_rounds == 3
    assert s.proposed == 9 and s.accepted == 4
    assert s.acceptance_rate == pytest.approx(4 / 9)
    assert s.tau == pytest.approx((4 + 2 + 1) / 3)  # counts the target's own token
    assert s.decode_tok_s == pytest.approx(7 / 0.4)  # prefill excluded
    assert s.ttft_s == pytest.approx(0.5)
    assert s.mean_round_s == pytest.approx(0.4 / 3)
    assert s.mtpc_throughput == pytest.approx(s.tau / s.mean_round_s)
    assert s.per_position_acceptance == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert s.tokens == 8


def test_stats_of_an_empty_or_plain_session():
    assert session_stats([]).tau == 0.0
    s = session_stats([rnd(0, 0, 0, 1, 0.2, prefill=True), rnd(1, 0, 0, 1, 0.1)])
    assert s.acceptance_rate == 0.0 and s.tau == 1.0 and s.per_position_acceptance == []


def test_trace_is_one_json_line_per_round(tmp_path):
    """(A torn last line, the process dying mid-write, is tests/app/gui/test_sessions.py's.)"""
    path = tmp_path / "t.ndjson"
    rounds = [rnd(0, 0, 0, 1, 0.5, prefill=True), rnd(1, 2, 1, 2, 0.1)]
    with TraceWriter(path, header={"model": "m"}) as tw:
        for r in rounds:
            tw.write(r)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [obj["event"] for obj in lines] == ["run", "round", "round"]
    assert [Round.from_dict(obj) for obj in lines[1:]] == rounds


def test_unwritable_trace_path_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="cannot write trace file"):
        TraceWriter(tmp_path / "no" / "such" / "dir" / "t.ndjson")


def test_session_round_trips_and_exports_csv(tmp_path):
    s = Session(request={"prompt": "hi"}, model={"path": "m"})
    for r in [rnd(0, 0, 0, 1, 0.5, prefill=True), rnd(1, 2, 1, 2, 0.1)]:
        s.add(r)
    back = Session.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.rounds == s.rounds and back.text == "xxx"
    rows = list(csv.DictReader(io.StringIO(s.to_csv())))
    assert len(rows) == 2 and rows[1]["accept_flags"] == "10" and rows[1]["from_draft"] == "10"
