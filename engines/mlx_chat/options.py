"""How the chat engine runs MTP rounds: a ChatEngine's `mtp_options`, given at load
(`ChatEngine.load(..., mtp_options=MtpOptions(...))`) or set on the engine between requests.
Both switches are on by default and turn off for the benchmarks' A/B runs and the tests that
check both ways; each applies from the next request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MtpOptions:
    # MTP steps launch on the last step's verdicts still in the graph: each row's chain drafted
    # from its lazy verdict and the verify queued behind it (engines/batch/engine.py,
    # `_verifies_ahead`). Off: each step launches after its verdicts are read
    # (bench/chat_batch_of_one.py measures the difference).
    ahead: bool = True
    # The drafter's step runs mx.compile'd; off runs it eagerly.
    compiled: bool = True
