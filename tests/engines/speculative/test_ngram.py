import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.speculative.ngram import NGramIndex


def brute_force(tokens, k, n_min, n_max):
    """The definition: longest suffix n_max..n_min, most recent earlier occurrence first; what
    followed it, repeating with the period of the match where it runs into the end."""
    end = len(tokens)
    for n in range(n_max, n_min - 1, -1):
        if end < n:
            continue
        suffix = tokens[end - n :]
        for start in range(end - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                drafts, period = tokens[start + n : start + n + k], end - (start + n)
                while len(drafts) < k:
                    drafts.append(drafts[len(drafts) - period])
                return drafts
    return []


def test_longest_suffix_wins_over_more_recent_shorter_match():
    p = NGramIndex(1, 3)
    p.extend([1, 2, 3, 9, 9, 7, 3, 5, 5, 1, 2, 3])
    # suffix [1,2,3] occurred at 0 -> followed by 9, 9; the shorter [3] occurred more recently (-> 5)
    assert p.propose(2) == [9, 9]


def test_most_recent_occurrence_first():
    p = NGramIndex(1, 2)
    p.extend([4, 5, 1, 4, 5, 2, 4, 5])
    assert p.propose(1) == [2]


def test_miss_and_min_length():
    p = NGramIndex(2, 3)
    p.extend([1, 2, 3, 4])
    assert p.propose(3) == []
    p.extend([1, 2])
    assert p.propose(3) == [3, 4, 1]


def test_a_short_loop_is_drafted_k_tokens_at_a_time():
    p = NGramIndex(1, 3)
    p.extend([5, 7, 7, 7])
    assert p.propose(4) == [7, 7, 7, 7]  # period 1, not the one 7 left before the end
    p.extend([1, 2, 1, 2])
    assert p.propose(5) == [1, 2, 1, 2, 1]  # period 2


def test_a_lookup_after_drafts_reads_them_as_context_without_indexing_them():
    p = NGramIndex(1, 2)
    p.extend([3, 4, 5, 6, 9, 3])
    assert p.propose(2, after=[4]) == [5, 6]  # [3, 4] recurs: what followed it
    assert p.propose(3, after=[4, 5, 6]) == [9, 3, 4]  # [5, 6] -> 9, 3, then the drafts [4]
    assert p.tokens == [3, 4, 5, 6, 9, 3] and p.propose(1) == [4]


def test_zero_k_and_empty_context():
    p = NGramIndex()
    assert p.propose(3) == []
    p.extend([1, 1, 1])
    assert p.propose(0) == []


def test_invalid_bounds():
    with pytest.raises(ValueError):
        NGramIndex(3, 2)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), max_size=60),
    k=st.integers(0, 7),
    n_min=st.integers(1, 3),
    extra=st.integers(0, 2),
)
def test_index_equals_the_definition(tokens, k, n_min, extra):
    p = NGramIndex(n_min, n_min + extra)
    # build incrementally, as the round loop does, checking at every length
    for i, t in enumerate(tokens):
        p.extend([t])
        assert p.propose(k) == brute_force(tokens[: i + 1], k, n_min, n_min + extra)


def test_reset_rebuilds_the_index():
    p = NGramIndex(1, 2)
    p.extend([1, 2, 1])
    p.reset([7, 8, 7])
    assert p.propose(1) == [8]
