"""Stop strings that begin in one round and end in the next, for any chat proposer: the text
that comes out ends right before the stop string, contains no part of it, and is the same --
tokens too -- with and without speculation (shared by the mlx_chat and gemma4 tests)."""

from __future__ import annotations

from typing import Callable

from engines.speculative.rounds import Round

Run = Callable[[list[str]], list[Round]]  # stop strings -> the rounds of one run


def text_of(rounds: list[Round]) -> str:
    return "".join(r.text for r in rounds)


def tokens_of(rounds: list[Round]) -> list[int]:
    return [t for r in rounds for t in r.tokens]


def stop_strings(text: str) -> list[str]:
    """Stop strings of 1 to 4 words (the tiny tokenizers' tokens are words) at several places,
    and two that end inside a single word."""
    words = text.split()
    stops = [" " + " ".join(words[j : j + n]) for n in (1, 2, 3, 4) for j in (3, 8, 13) if j + n <= len(words)]
    inner = [w for w in words[2:] if len(w) >= 4]
    stops += [inner[0][1:3], inner[-1][1:-1]] if inner else []
    return stops


def boundaries(rounds: list[Round]) -> list[int]:
    """Character offsets where one round's text ends and the next one's begins."""
    ends, at = [], 0
    for r in rounds[:-1]:
        at += len(r.text)
        ends.append(at)
    return ends


def check_stop_strings(plain: Run, speculative: dict[str, Run]) -> None:
    full = plain([])
    text = text_of(full)
    straddled = {name: 0 for name in speculative}
    for stop in stop_strings(text):
        want = text[: text.index(stop)]
        runs = {"off": plain([stop]), **{name: run([stop]) for name, run in speculative.items()}}
        for name, rounds in runs.items():
            assert text_of(rounds) == want, (name, stop)  # shown text is never taken back
            assert rounds[-1].finish == "stop", (name, stop)
        assert len({tuple(tokens_of(r)) for r in runs.values()}) == 1, stop  # the same tokens
        for name, run in speculative.items():  # did a round boundary of the full run cut it?
            start = text.index(stop)
            straddled[name] += any(start < b < start + len(stop) for b in boundaries(run([])))
    assert all(straddled.values()), straddled  # every proposer had stop strings across rounds
