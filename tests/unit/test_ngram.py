import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.speculative.ngram import NGramProposer


def brute_force(tokens, k, n_min, n_max):
    """The definition: longest suffix n_max..n_min, most recent earlier occurrence first."""
    end = len(tokens)
    for n in range(n_max, n_min - 1, -1):
        if end < n:
            continue
        suffix = tokens[end - n :]
        for start in range(end - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_longest_suffix_wins_over_more_recent_shorter_match():
    p = NGramProposer(1, 3)
    p.extend([1, 2, 3, 9, 9, 7, 3, 5, 5, 1, 2, 3])
    # suffix [1,2,3] occurred at 0 -> followed by 9, 9; the shorter [3] occurred more recently (-> 5)
    assert p.propose(2) == [9, 9]


def test_most_recent_occurrence_first():
    p = NGramProposer(1, 2)
    p.extend([4, 5, 1, 4, 5, 2, 4, 5])
    assert p.propose(1) == [2]


def test_miss_and_min_length():
    p = NGramProposer(2, 3)
    p.extend([1, 2, 3, 4])
    assert p.propose(3) == []
    p.extend([1, 2])
    assert p.propose(3) == [3, 4, 1]


def test_zero_k_and_empty_context():
    p = NGramProposer()
    assert p.propose(3) == []
    p.extend([1, 1, 1])
    assert p.propose(0) == []


def test_invalid_bounds():
    with pytest.raises(ValueError):
        NGramProposer(3, 2)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), max_size=60),
    k=st.integers(0, 7),
    n_min=st.integers(1, 3),
    extra=st.integers(0, 2),
)
def test_index_equals_the_definition(tokens, k, n_min, extra):
    p = NGramProposer(n_min, n_min + extra)
    # build incrementally, as the round loop does, checking at every length
    for i, t in enumerate(tokens):
        p.extend([t])
        assert p.propose(k) == brute_force(tokens[: i + 1], k, n_min, n_min + extra)


def test_reset_rebuilds_the_index():
    p = NGramProposer(1, 2)
    p.extend([1, 2, 1])
    p.reset([7, 8, 7])
    assert p.propose(1) == [8]
