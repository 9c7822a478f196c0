"""Speculative-decoding counters read from a server's Prometheus /metrics text.

vLLM names them `vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total` and `..._num_accepted_tokens_per_pos_total{position}`;
llama.cpp (b11434) exports the same names under `llamacpp:`, `specscope serve` under
`specscope:`, SGLang under `sglang:` where its version has them. Parsed with prometheus_client's
own text parser. A counter the server does not export is None, never 0."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

SPEC_PREFIXES = ("vllm:", "llamacpp:", "specscope:", "sglang:")


@dataclass
class SpecCounters:
    drafts: float | None = None  # verification steps that carried drafts
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    accepted_per_pos: dict[int, float] = field(default_factory=dict)

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        """What happened between two scrapes (one request on an otherwise idle server)."""

        def delta(a, b):
            return None if a is None or b is None else a - b

        return SpecCounters(
            drafts=delta(self.drafts, before.drafts),
            draft_tokens=delta(self.draft_tokens, before.draft_tokens),
            accepted_tokens=delta(self.accepted_tokens, before.accepted_tokens),
            accepted_per_pos={p: v - before.accepted_per_pos.get(p, 0.0) for p, v in self.accepted_per_pos.items()},
        )


def parse_spec_counters(text: str) -> SpecCounters:
    counters = SpecCounters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            prefix = next((p for p in SPEC_PREFIXES if name.startswith(p)), None)
            if prefix is None:
                continue
            short = name[len(prefix):]
            if short == "spec_decode_num_drafts_total":
                counters.drafts = _add(counters.drafts, sample.value)
            elif short == "spec_decode_num_draft_tokens_total":
                counters.draft_tokens = _add(counters.draft_tokens, sample.value)
            elif short == "spec_decode_num_accepted_tokens_total":
                counters.accepted_tokens = _add(counters.accepted_tokens, sample.value)
            elif short == "spec_decode_num_accepted_tokens_per_pos_total" and "position" in sample.labels:
                pos = int(sample.labels["position"])
                counters.accepted_per_pos[pos] = counters.accepted_per_pos.get(pos, 0.0) + sample.value
    return counters


def _add(total: float | None, value: float) -> float:
    # vLLM labels its counters per engine / model: a server's total is their sum.
    return value if total is None else total + value


@dataclass
class ServerLoad:
    """What a server is doing, from two scrapes of its /metrics `seconds` apart: requests in its
    batch and waiting now, the mean latency of its steps and the tokens it generated per second
    in between. None where the server does not export the counter (llama.cpp has no step
    histogram; only `specscope serve` has all four)."""

    running: float | None
    waiting: float | None
    step_latency_s: float | None
    tokens_per_s: float | None
    mean_batch: float | None
    # tensor parallel (`specscope serve --ranks N`): each rank's share of its time in forwards
    # (the rest it waits for rank 0), and rank 0's broadcast per step, over the interval
    rank_busy: list[float] | None = None
    broadcast_s: float | None = None


@dataclass
class LoadCounters:
    running: float | None = None
    waiting: float | None = None
    steps: float | None = None  # step latency histogram: count and sum
    step_seconds: float | None = None
    batch_rows: float | None = None  # batch size histogram: sum (rows over all steps)
    tokens: float | None = None  # tokens predicted, in total
    rank_compute: dict[int, float] = field(default_factory=dict)  # tensor parallel: per rank, totals
    rank_wait: dict[int, float] = field(default_factory=dict)
    broadcasts: float | None = None  # rank 0's broadcast histogram: count and sum
    broadcast_seconds: float | None = None


LOAD_NAMES = {  # sample name without its prefix -> LoadCounters field (vLLM / llama.cpp / ours)
    "num_requests_running": "running", "requests_processing": "running",
    "num_requests_waiting": "waiting", "requests_deferred": "waiting",
    "step_latency_seconds_count": "steps", "step_latency_seconds_sum": "step_seconds",
    "batch_size_sum": "batch_rows", "tokens_predicted_total": "tokens", "generation_tokens_total": "tokens",
    "rank_broadcast_seconds_count": "broadcasts", "rank_broadcast_seconds_sum": "broadcast_seconds",
}
RANK_NAMES = {"rank_compute_seconds": "rank_compute", "rank_wait_seconds": "rank_wait"}  # labelled by rank


def parse_load_counters(text: str) -> LoadCounters:
    counters = LoadCounters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            prefix = next((p for p in SPEC_PREFIXES if sample.name.startswith(p)), None)
            name = LOAD_NAMES.get(sample.name[len(prefix):]) if prefix else None
            if name is not None and getattr(counters, name) is None:  # the first name found wins
                setattr(counters, name, sample.value)
            per_rank = RANK_NAMES.get(sample.name[len(prefix):]) if prefix else None
            if per_rank is not None and "rank" in sample.labels:
                getattr(counters, per_rank)[int(sample.labels["rank"])] = sample.value
    return counters


def server_load(before: LoadCounters, after: LoadCounters, seconds: float) -> ServerLoad:
    def delta(field_name: str) -> float | None:
        a, b = getattr(after, field_name), getattr(before, field_name)
        return None if a is None or b is None else a - b

    steps = delta("steps")
    broadcasts = delta("broadcasts")
    return ServerLoad(
        running=after.running,
        waiting=after.waiting,
        step_latency_s=delta("step_seconds") / steps if steps else None,
        tokens_per_s=delta("tokens") / seconds if delta("tokens") is not None and seconds > 0 else None,
        mean_batch=delta("batch_rows") / steps if steps and delta("batch_rows") is not None else None,
        rank_busy=_rank_busy(before, after),
        broadcast_s=delta("broadcast_seconds") / broadcasts if broadcasts else None,
    )


def _rank_busy(before: LoadCounters, after: LoadCounters) -> list[float] | None:
    """Per rank: the share of its time in forwards (compute / (compute + wait)) between the two
    scrapes; None without ranks, or before every rank has moved."""
    ranks = sorted(after.rank_compute)
    if not ranks:
        return None
    shares = []
    for r in ranks:
        compute = after.rank_compute[r] - before.rank_compute.get(r, 0.0)
        wait = after.rank_wait.get(r, 0.0) - before.rank_wait.get(r, 0.0)
        if compute + wait <= 0:
            return None
        shares.append(compute / (compute + wait))
    return shares
