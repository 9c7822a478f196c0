"""The repetition-loop detector (engines/speculative/repetition.py): it flags the token at
which the tail becomes one block repeated `copies` times over at least `min_span` tokens, and
nothing before; clip_at_repetition cuts a round right after that token."""

import random

import pytest

from engines.speculative.repetition import RepetitionDetector, clip_at_repetition, detector_for


def first_flag(tokens, **kw):
    d = RepetitionDetector(**kw)
    for i, t in enumerate(tokens):
        period = d.push(t)
        if period is not None:
            return i, period
    return None


def test_flags_the_token_that_completes_the_copies():
    block = [7, 8, 9, 10]
    tokens = [1, 2, 3] + block * 10
    # 4 copies of a 4-token block = 16 tokens, but min_span asks for 20: the 20th looping token
    assert first_flag(tokens, copies=4, min_span=20, max_period=8) == (3 + 20 - 1, 4)
    assert first_flag(tokens, copies=6, min_span=8, max_period=8) == (3 + 24 - 1, 4)
    assert first_flag(tokens, copies=4, min_span=20, max_period=3) is None  # the block is longer


def test_a_single_token_run_is_a_loop_of_period_1():
    assert first_flag([5] * 70, copies=4, min_span=64) == (63, 1)


def test_text_without_loops_is_never_flagged():
    rng = random.Random(0)
    tokens = [rng.randrange(50) for _ in range(5000)]
    assert first_flag(tokens) is None
    # a table: the same separator cell many times, but each row differs
    row = lambda i: [100, 101, i, 101, i + 1, 101, 102]  # noqa: E731
    assert first_flag([t for i in range(200) for t in row(i)]) is None


def test_clip_cuts_right_after_the_flagged_token_and_keeps_state_across_rounds():
    d = RepetitionDetector(copies=3, min_span=6, max_period=4)
    kept, note = clip_at_repetition(d, [1, 2, 1, 2])
    assert kept == [1, 2, 1, 2] and note is None
    kept, note = clip_at_repetition(d, [1, 2, 1, 2])  # the 6th token of the loop completes it
    assert kept == [1, 2] and "block of 2 tokens" in note
    assert clip_at_repetition(None, [1, 1, 1]) == ([1, 1, 1], None)


def test_max_repeat_zero_is_off_and_one_is_refused():
    assert detector_for(0) is None
    assert detector_for(5).copies == 5
    with pytest.raises(ValueError):
        RepetitionDetector(copies=1)


def looked_at_every_period(tokens, copies, min_span, max_period):
    """The definition, token by token: at each token, every period's trailing run of tokens equal
    to the token that period back; the smallest period whose run makes a loop."""
    out, run = [], [0] * (max_period + 1)
    for n, token in enumerate(tokens):
        found = None
        for p in range(1, min(max_period, n) + 1):
            run[p] = run[p] + 1 if token == tokens[n - p] else 0
            if found is None and run[p] + p >= max(copies * p, min_span):
                found = p
        out.append(found)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_detector_answers_as_the_definition_at_every_token(seed):
    """Loops of many periods (longer than max_period too), broken and resumed, in varied text
    from a small vocabulary (so tokens recur often, as spaces and punctuation do)."""
    rng = random.Random(seed)
    copies, min_span, max_period = rng.choice([(2, 4, 8), (3, 12, 16), (4, 64, 128)])
    tokens = []
    while len(tokens) < 3000:
        if rng.random() < 0.5:
            tokens += [rng.randrange(12) for _ in range(rng.randint(1, 40))]
        else:
            block = [rng.randrange(12) for _ in range(rng.randint(1, max_period + 4))]
            tokens += (block * (copies + 2))[: rng.randint(1, len(block) * (copies + 2))]
    d = RepetitionDetector(copies=copies, min_span=min_span, max_period=max_period)
    got = [d.push(t) for t in tokens]
    assert got == looked_at_every_period(tokens, copies, min_span, max_period)
    assert sum(p is not None for p in got) > 10  # (loops were found)
