"""/metrics for `specscope serve`: Prometheus text from prometheus_client.

Speculation counters use vLLM's names (spec_decode_num_drafts_total, ..._num_draft_tokens_total,
..._num_accepted_tokens_total, ..._num_accepted_tokens_per_pos_total{position}) under a
`specscope:` prefix, which llama.cpp's server (b11434) also uses under `llamacpp:`. The request
counters take llama.cpp's names (prompt_tokens_total, tokens_predicted_total, their *_seconds_total,
requests_processing, requests_deferred). The batch adds vLLM's num_requests_running and
num_requests_waiting, and per step the batch size and the step's latency (histograms). The JSON
view of speculation (`spec_decode()`, served at /v1/spec_decode/metrics) follows the mlx-lm
server plan's P1.9 keys. Each server has its own registry, so two servers in one
process (the tests) do not share counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
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
        self.requests_running = Gauge(PREFIX + "num_requests_running", "Sequences in the batch now", registry=r)
        self.requests_waiting = Gauge(PREFIX + "num_requests_waiting", "Requests waiting for a row of the batch", registry=r)
        self.batch_size = Histogram(PREFIX + "batch_size", "Sequences per batch step", registry=r,
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32))
        self.step_seconds = Histogram(PREFIX + "step_latency_seconds", "Wall time of one batch step", registry=r,
                                      buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0))
        # tensor parallel (--ranks): rank 0's broadcast per step, and every rank's running totals
        self.rank_broadcast = Histogram(PREFIX + "rank_broadcast_seconds",
                                        "Tensor parallel: rank 0's time per step in broadcasts to the other ranks",
                                        registry=r, buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1))
        self.rank_compute = Gauge(PREFIX + "rank_compute_seconds", "Tensor parallel: seconds in forwards, per rank "
                                  "(the sharded layers' all_sums included)", ("rank",), registry=r)
        self.rank_wait = Gauge(PREFIX + "rank_wait_seconds", "Tensor parallel: seconds waiting on rank 0's messages "
                               "(rank 0: sending them), per rank", ("rank",), registry=r)
        self.rank_forwards = Gauge(PREFIX + "rank_forwards", "Tensor parallel: forwards run, per rank", ("rank",), registry=r)
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prompt cache")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prompt cache (not read again)")
        self.spec = SpecDecodeStats()

    def observe_step(self, batch_size: int, seconds: float) -> None:
        if batch_size:
            self.batch_size.observe(batch_size)
            self.step_seconds.observe(seconds)

    def observe_ranks(self, broadcast_s: float, times: list) -> None:
        """A tensor-parallel step: rank 0's broadcast time, and the latest totals of every rank
        (engines/distributed RankTimes)."""
        self.rank_broadcast.observe(broadcast_s)
        for rank, t in enumerate(times):
            self.rank_compute.labels(rank=str(rank)).set(t.compute_s)
            self.rank_wait.labels(rank=str(rank)).set(t.wait_s)
            self.rank_forwards.labels(rank=str(rank)).set(t.forwards)

    def count_round(self, rnd: Round) -> None:
        """Called once per round as it is produced, so /metrics moves while a response streams."""
        if rnd.proposed:
            self.drafts.inc()
            self.draft_tokens.inc(rnd.proposed)
            self.accepted_tokens.inc(rnd.accepted)
            for position, accepted in enumerate(rnd.accept_flags):
                if accepted:
                    self.accepted_per_pos.labels(position=str(position)).inc()
        self.spec.add(rnd)
        self.tokens_predicted.inc(len(rnd.tokens))
        (self.prompt_seconds if rnd.prefill else self.tokens_predicted_seconds).inc(rnd.wall_s)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class SpecDecodeStats:
    """The JSON of /v1/spec_decode/metrics (the mlx-lm server plan's P1.9 keys), from the
    Rounds as they are produced. A fallback step is a decode round that drafted nothing."""

    EMA = 0.1  # weight of the newest drafting round in acceptance_rate_ema

    def __init__(self):
        self.steps = self.fallback_steps = self.proposed = self.accepted = self.bonus = self.tokens = 0
        self.asked = 0  # drafts asked over all steps: the batch controller's cap, where it capped
        self.ema: float | None = None
        self.current_k = 0

    def add(self, rnd: Round) -> None:
        if rnd.prefill:
            return
        self.steps += 1
        self.tokens += len(rnd.tokens)
        self.current_k = rnd.steps or 0
        self.asked += self.current_k
        if not rnd.proposed:
            self.fallback_steps += 1
            return
        self.proposed += rnd.proposed
        self.accepted += rnd.accepted
        self.bonus += 1 if rnd.accepted == rnd.proposed else 0
        rate = rnd.accepted / rnd.proposed
        self.ema = rate if self.ema is None else (1 - self.EMA) * self.ema + self.EMA * rate

    def as_dict(self) -> dict:
        return {
            "acceptance_rate_ema": round(self.ema, 4) if self.ema is not None else None,
            "acceptance_rate_overall": round(self.accepted / self.proposed, 4) if self.proposed else None,
            "avg_tokens_per_step": round(self.tokens / self.steps, 3) if self.steps else None,
            "total_steps": self.steps,
            "total_fallback_steps": self.fallback_steps,
            "total_proposed": self.proposed,
            "total_accepted": self.accepted,
            "total_bonus_tokens": self.bonus,
            "current_k": self.current_k,
            "total_asked": self.asked,
        }
