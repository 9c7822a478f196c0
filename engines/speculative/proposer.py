"""Proposers: who drafts the tokens the target verifies -- one protocol for every drafter of
every engine (n-gram lookup, a draft model, the Gemma 4 assistant, GLM-OCR's MTP layer,
composed drafting).

What the round loop calls, in order:

    start(ctx)          once, after the prefill: ctx.tokens = prompt + first token, ctx.hidden the
                        target's final hidden state that produced the first token (when the
                        proposer reads it: `needs_hidden`).
    propose(ctx, k)     -> Draft: up to k token ids and, when they were sampled, the drafter's
                        distributions q [k, V] for rejection sampling (None: a point mass --
                        n-gram lookup, greedy drafting). Fewer than k (or none) is fine: the
                        round verifies what it got.
    commit(ctx)         after every round that leaves the run going (plain rounds too), once the
                        target's cache holds the accepted tokens: ctx.tokens gains the round's
                        emitted tokens (its accepted drafts, then the target's own token, which
                        is not yet in the target's cache); ctx.hidden is the target's hidden
                        state that produced that last token.

Optional, asked for by attributes:
    group               a drafter shared by many sequences of a batch (the batch's draft model,
                        its MTP drafter): the loop asks it once per step for the drafts of all
                        its rows that draft (DraftGroup.propose_rows), not each row on its own.
    leave()             the sequence left the batch: its row in the group is freed.
    observe(step)       composed drafting prices its sources by the rounds' own times.
    propose_after       (on the group) drafts chained on a launched step's verdicts still in
                        the graph, so the next step launches before they are read (MTP).

Every proposer only proposes (vLLM v1's split): the loop's verifier decides, the loop rolls
the target back, and a proposer rolls back what it keeps of its own (a draft model's cache).
A proposer that raises stops speculation for its sequence only: the sequence decodes plainly
from there on and its next Round says why (Sequence.stop_speculating).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # engines.types imports this package (repetition.py): no import at run time
    from engines.types import Sampling


@dataclass
class Context:
    """What a proposer reads of its sequence. Engines add their own: the chat target's model
    and cache (engines/mlx_chat), GLM-OCR's verified hidden rows (engines/glm_ocr)."""

    tokens: list[int]  # prompt + emitted tokens; tokens[-1] is not yet in the target's cache
    sampling: Sampling
    hidden: Any = None  # the target's final hidden state that produced tokens[-1] (needs_hidden)

    @property
    def position(self) -> int:
        """Position of tokens[-1] (the next token the target will read)."""
        return len(self.tokens) - 1


@dataclass
class Draft:
    tokens: Any  # [k] ids: a list, or an mx.array that may still be lazy (chat's model drafters)
    q: Any = None  # [k, V] the drafter's probabilities, or None (a point mass)
    overlapped: bool = False  # drafted ahead in the graph: the loop feeds it on without waiting
    source: str | None = None  # composed drafting: which drafter made it

    @property
    def size(self) -> int:
        return len(self.tokens)

    def ids(self) -> list[int]:
        return self.tokens if isinstance(self.tokens, list) else self.tokens.tolist()


EMPTY = Draft([])


class Proposer(Protocol):
    name: str
    needs_hidden: bool  # the loop keeps ctx.hidden for it

    def start(self, ctx: Context) -> None: ...

    def propose(self, ctx: Context, k: int) -> Draft: ...

    def commit(self, ctx: Context) -> None: ...


class DraftGroup(Protocol):
    def propose_rows(self, target_cache: Any, asks: list[tuple[int, Any, int, Any]]) -> list[Draft]:
        """The drafts of several sequences at once: per ask (its row in the target's batch, the
        Sequence, k, its RNG key or None), in the order asked. `target_cache`: the batch's, for a
        drafter that reads the target's K/V (MTP)."""
