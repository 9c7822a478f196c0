"""/metrics for `specscope serve`: Prometheus text from prometheus_client.

Speculation counters use vLLM's names (spec_decode_num_drafts_total, ..._num_draft_tokens_total,
..._num_accepted_tokens_total, ..._num_accepted_tokens_per_pos_total{position}) under a
`specscope:` prefix, which llama.cpp's server (b11434) also uses under `llamacpp:`. The request
counters take llama.cpp's names (prompt_tokens_total, tokens_predicted_total, their *_seconds_total,
requests_processing, requests_deferred). Each server has its own registry, so two servers in one
process (the tests) do not share counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the route)

from engines.speculative.rounds import Round

PREFIX = "specscope:"


class ServeMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            # prometheus_client appends _total itself
            return Counter(PREFIX + name, doc, labels, registry=r)

        self.drafts = counter("spec_decode_num_drafts", "Speculative: verification steps that carried drafts")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Speculative: draft tokens proposed")
        self.accepted_tokens = counter("spec_decode_num_accepted_tokens", "Speculative: draft tokens accepted")
        self.accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                        "Speculative: accepted draft tokens per draft position", ("position",))
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed")
        self.prompt_seconds = counter("prompt_seconds", "Time spent on prompts (prefill rounds)")
        self.tokens_predicted = counter("tokens_predicted", "Tokens generated")
        self.tokens_predicted_seconds = counter("tokens_predicted_seconds", "Time spent generating (decode rounds)")
        self.requests = counter("requests", "Chat completion requests answered, by outcome", ("outcome",))
        self.requests_processing = Gauge(PREFIX + "requests_processing", "Requests on the engine now", registry=r)
        self.requests_deferred = Gauge(PREFIX + "requests_deferred", "Requests waiting for the engine", registry=r)

    def count_round(self, rnd: Round) -> None:
        """Called once per round as it is produced, so /metrics moves while a response streams."""
        if rnd.proposed:
            self.drafts.inc()
            self.draft_tokens.inc(rnd.proposed)
            self.accepted_tokens.inc(rnd.accepted)
            for position, accepted in enumerate(rnd.accept_flags):
                if accepted:
                    self.accepted_per_pos.labels(position=str(position)).inc()
        self.tokens_predicted.inc(len(rnd.tokens))
        (self.prompt_seconds if rnd.prefill else self.tokens_predicted_seconds).inc(rnd.wall_s)

    def text(self) -> bytes:
        return generate_latest(self.registry)
