from engines.speculative.verify import accept_flags, clip_emitted, verify_greedy, verify_sampled


def test_greedy_all_accepted_plus_bonus():
    v = verify_greedy([5, 6, 7], [5, 6, 7, 9])
    assert v.accepted == 3 and v.tokens == [5, 6, 7, 9]


def test_greedy_first_rejected_emits_target_token():
    v = verify_greedy([5, 6, 7], [4, 6, 7, 9])
    assert v.accepted == 0 and v.tokens == [4]


def test_greedy_middle_rejection_stops_at_first_mismatch():
    # position 2 would match again, but everything after a rejection is conditioned on a wrong token
    v = verify_greedy([5, 6, 7], [5, 1, 7, 9])
    assert v.accepted == 1 and v.tokens == [5, 1]


def test_greedy_no_drafts_is_a_plain_step():
    assert verify_greedy([], [3]).tokens == [3]


def test_sampled_uses_residual_at_first_rejection_and_bonus_otherwise():
    assert verify_sampled([5, 6], [True, False], [0, 8], 9).tokens == [5, 8]
    assert verify_sampled([5, 6], [True, True], [0, 8], 9).tokens == [5, 6, 9]
    assert verify_sampled([5, 6], [False, True], [3, 8], 9).tokens == [3]


def test_clip_eos_inside_a_burst():
    assert clip_emitted([5, 2, 7, 9], eos_ids=[2], remaining=10) == ([5, 2], "stop")


def test_clip_max_tokens_inside_a_burst():
    assert clip_emitted([5, 6, 7, 9], eos_ids=[2], remaining=3) == ([5, 6, 7], "length")
    assert clip_emitted([5, 6, 7], eos_ids=[2], remaining=3) == ([5, 6, 7], "length")
    assert clip_emitted([5, 6], eos_ids=[2], remaining=3) == ([5, 6], None)


def test_clip_eos_wins_when_it_is_the_last_allowed_token():
    assert clip_emitted([5, 2, 7], eos_ids=[2], remaining=2) == ([5, 2], "stop")


def test_accept_flags_are_an_accepted_prefix():
    assert accept_flags(4, 2) == [True, True, False, False]
    assert accept_flags(0, 0) == []
