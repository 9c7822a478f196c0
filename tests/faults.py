"""Faults injected into real components (never mocks): shared by the CLI and window tests."""

from __future__ import annotations


def break_ngram_drafter_on_third_call(monkeypatch) -> None:
    """A real n-gram drafter that raises on its third proposal, as a drafter failing mid-run
    would."""
    from engines.speculative.ngram import NGramProposer

    original, calls = NGramProposer.propose, []

    def breaks_on_the_third_call(self, ctx, k):
        calls.append(k)
        if len(calls) == 3:
            raise ValueError("drafter broke")
        return original(self, ctx, k)

    monkeypatch.setattr(NGramProposer, "propose", breaks_on_the_third_call)
