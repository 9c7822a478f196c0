"""Stop strings held back across rounds (engines/speculative/stops.py): the text that comes out
never contains any part of a stop string, however the pieces are grouped into rounds."""

import itertools

import pytest

from engines.speculative.stops import TextStream, drafted_spans, earliest_stop, held_back


def stream_out(pieces, stop, cuts):
    """Feed `pieces` (one per token) in rounds that end after the indices in `cuts`; return
    the released texts per round, and the index of the token that completed a stop string."""
    stream, out, completed = TextStream(stop), [], None
    for i, piece in enumerate(pieces):
        if stream.add(piece, from_draft=False):
            completed = i
            out.append(stream.release(final=True)[0])
            break
        if i in cuts or i == len(pieces) - 1:
            out.append(stream.release(final=i == len(pieces) - 1)[0])
    return out, completed


def test_helpers():
    assert earliest_stop("one two three", ["three", "two thr"]) == 4  # the earliest start wins
    assert earliest_stop("abc", ["END"]) is None
    assert held_back("abc E", ["END"]) == 1 and held_back("abc EN", ["END"]) == 2
    assert held_back("abc", ["END"]) == 0 and held_back("abc", []) == 0
    assert held_back("xaa", ["aab"]) == 2  # the longest suffix that could still become one
    assert drafted_spans([True, True, False, True]) == [(0, 2), (3, 4)]


PIECES = ["Hello", " wor", "ld", ".", " E", "N", "D", " more", " text"]


@pytest.mark.parametrize("stop", [["END"], [" END"], ["D more"], [". E"], ["ld. EN"], ["llo"], ["o"]])
def test_the_same_text_whatever_the_rounds(stop):
    """Every grouping of the tokens into rounds (plain: one per round; speculation: several)
    releases the same text, ending right before the stop string, with no part of it."""
    full = "".join(PIECES)
    want = full[: full.index(stop[0])]
    results = set()
    for n_cuts in range(len(PIECES)):
        for cuts in itertools.combinations(range(len(PIECES) - 1), n_cuts):
            out, completed = stream_out(PIECES, stop, set(cuts))
            assert "".join(out) == want  # shown text is never taken back: no part of the stop
            results.add(completed)
    assert len(results) == 1  # the same token completes it in every grouping


def test_text_that_only_looks_like_a_stop_string_is_released_at_the_end():
    stream = TextStream(["END"])
    assert not stream.add("the EN", False)
    assert stream.release(final=False)[0] == "the "  # "EN" may still become "END"
    assert not stream.add("d", False)
    assert stream.release(final=False)[0] == "ENd"  # it did not
    assert not stream.add(" E", False)
    assert stream.release(final=True)[0] == " E"  # the run ended: nothing is held back


def test_drafted_characters_follow_the_held_back_text():
    stream = TextStream(["XYZ"])
    stream.add("ab", True)
    stream.add("X", False)  # target's token, held back
    assert stream.release(final=False) == ("ab", [(0, 2)])
    stream.add("cd", True)
    assert stream.release(final=False) == ("Xcd", [(1, 3)])


def test_a_stop_string_inside_one_token():
    stream = TextStream(["ll"])
    assert stream.add("hello", False)
    assert stream.release(final=True)[0] == "he"


def test_empty_stop_strings_are_ignored():
    stream = TextStream([""])
    assert not stream.add("abc", False)
    assert stream.release(final=False)[0] == "abc"
