"""How the chat engine runs MTP rounds: a ChatEngine's `mtp_options`, given at load
(`ChatEngine.load(..., mtp_options=MtpOptions(...))`) or set on the engine between requests.
Every switch is on by default and turns off for the benchmarks' A/B runs and the tests that
check both ways; each applies from the next request (its proposer and cache are made then). In
the batch's loop (a lone request is a batch of one) `pipeline` and `overlap` are one mechanism:
MTP steps launch on the last step's verdicts still in the graph unless either is off
(engines/batch/engine.py, `_verifies_ahead`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MtpOptions:
    # Rounds launch before the last verdict is read: the next round's verify goes in on this
    # one's verdict still in the graph, on slot caches (cache.SlotKVCache) -- full-attention
    # targets only. Off: each round is launched after the last verdict, on caches that roll back
    # (bench/mtp_launch_early.py measures the difference).
    pipeline: bool = True
    # Depth-2 overlap: the drafter chains the next round's drafts on the verdict still in the
    # graph (the reference's LLAMA_PIPELINE_DEPTH2; bench/mtp_overlap.py).
    overlap: bool = True
    # The drafter's step runs mx.compile'd; off runs it eagerly (bench/mtp_overlap.py).
    compiled: bool = True
