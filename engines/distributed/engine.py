"""Over several ranks (`mx.distributed`): every rank holds its part of the target -- its shard
of every layer (tensor parallel: mlx-lm's `Model.shard(group)`) or a run of whole layers
(pipeline parallel: pipeline.py) -- rank 0 runs the whole batch loop, the others follow.

Rank 0 is a BatchEngine (engines/batch) whose caches are mirrored (mirror.py) and whose target
forward is first announced to the followers: the forward's rows -- each sequence's pending
token and its drafts -- with the cache ops since the last forward, in one broadcast (bus.py).
So the drafter runs on rank 0 only and its proposals reach the others inside the forward's own
message (the mlx-lm plan's "option A", at no extra message: n-gram and draft model alike); with
`--drafter-on every-rank` every rank runs the draft model too (option B, drafting.py). The
scheduler, the proposers, verification, the RNG, the controller and HTTP are rank 0's; a
follower never samples: what it needs of a verdict is how many slots each row keeps (settle).
In a pipeline rank 0 runs the last stage, so it also holds what an MTP drafter reads (the K/V
of the last layers and the final hidden state): MTP rows draft there as in one process.

A follower (`follow`) loads its part and a replica of rank 0's caches, and loops: receive,
replay the cache ops, run the forward. An idle rank 0 sends a heartbeat every second, so a
follower hears of a dead rank 0 within its timeout, and rank 0 of a dead follower within one
second even when no request is running.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import mlx.core as mx

from engines.batch.cache import BatchCache
from engines.batch.drafter import BatchDrafter
from engines.batch.engine import BatchEngine
from engines.distributed.bus import DEFAULT_TIMEOUT_S, Bus, RankLost, RankTimes, Watchdog
from engines.distributed.drafting import EVERY_RANK, RANK0, DrafterReplica, DraftsDiffer, MirroredDrafter
from engines.distributed.mirror import (HEARTBEAT, KV_ONLY, LOGITS, STOP, TIMES, MirroredCache, OpLog, Replica,
                                        checksum, forward_op, run_forward)
from engines.distributed.pipeline import Stage, Unpipelinable, check_pipelinable, make_stage, run_stage, tables_checksum
from engines.mlx_chat.engine import ChatEngine
from engines.mlx_chat.loading import LoadedModel, load_model, materialize
from engines.types import EngineError


NO_MTP = ("speculation unavailable: an MTP drafter reads the target's whole K/V and hidden state, which "
          "tensor parallel splits over the ranks (serve with --split pipeline); this request decodes plainly")
TENSOR, PIPELINE = "tensor", "pipeline"


class UnshardableModel(EngineError):
    """This architecture cannot be split over these ranks."""


def load_shard(path: str, group: mx.distributed.Group) -> LoadedModel:
    """This rank's shard of the target: loaded lazily, split by mlx-lm's own `shard` (the
    attention heads and the MLP's hidden units), then read (only this rank's part)."""
    loaded = load_model(path, lazy=True)
    check_shardable(loaded, group.size())
    loaded.model.shard(group)
    # One layer at a time: each full tensor read from the file is sliced and let go before the
    # next is read, so the rank's peak is its shard plus one layer, not the whole model.
    for layer in getattr(loaded.model, "layers", []):
        mx.eval(layer.parameters())
    mx.eval(loaded.model.parameters())
    materialize(loaded.model)  # what mlx-lm keeps beside the parameters (loading.materialize says why)
    return loaded


def load_part(path: str, group: mx.distributed.Group, split: str) -> tuple[LoadedModel, Stage | None]:
    """This rank's part of the target: its tensor-parallel shard, or its pipeline stage."""
    if split == TENSOR:
        return load_shard(path, group), None
    loaded = load_model(path, lazy=True)
    return loaded, make_stage(loaded.model, group)


def choose_split(path: str, ranks: int, split: str = "auto", mtp: bool = False) -> str:
    """TENSOR or PIPELINE for this model over `ranks`, from its architecture and head counts
    (its weights are not read); one line naming what can be done otherwise. auto: tensor
    parallel where mlx-lm can split the heads and no MTP drafter is served (it reads a whole
    layer's K/V, which tensor parallel splits), else a pipeline."""
    loaded = load_model(path, lazy=True)
    if split == TENSOR or (split == "auto" and not mtp):
        try:
            check_shardable(loaded, ranks)
            return TENSOR
        except UnshardableModel:
            if split == TENSOR:
                raise
    try:
        check_pipelinable(loaded.model, ranks)
    except Unpipelinable as e:
        if split == "auto" and not mtp:  # say why tensor parallel cannot, too
            try:
                check_shardable(loaded, ranks)
            except UnshardableModel as tensor:
                raise UnshardableModel(f"{tensor}; {str(e).split(': ', 1)[1]}") from None
        raise
    return PIPELINE


def check_shardable(loaded: LoadedModel, ranks: int) -> None:
    model = loaded.model
    if not hasattr(model, "shard"):
        raise UnshardableModel(
            f"--ranks {ranks}: mlx-lm cannot split a {loaded.model_type!r} model over ranks by heads (tensor "
            "parallel needs an architecture whose mlx-lm module has shard(): llama, mistral, qwen2, qwen3, deepseek, ...)")
    args = getattr(model, "args", None)
    heads = getattr(args, "num_attention_heads", None)
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    if heads is not None and (heads % ranks or kv_heads % ranks):
        raise UnshardableModel(
            f"--ranks {ranks}: tensor parallel splits the attention heads, and this {loaded.model_type} model has "
            f"{heads} query / {kv_heads} KV heads (not divisible by {ranks})")


def load_rank_zero(path: str, draft_model: str | None, group: mx.distributed.Group,
                   split: str = TENSOR) -> tuple[ChatEngine, Stage | None]:
    """Rank 0's ChatEngine: its part of the target, and the drafter whole (rank 0 drafts): a
    draft model, or in a pipeline an MTP drafter."""
    loaded, stage = load_part(path, group, split)
    engine = ChatEngine(loaded, draft_path=draft_model)
    if draft_model:
        from engines.mlx_chat.mtp import is_assistant_dir, preload_drafter

        if not is_assistant_dir(draft_model):
            engine.draft_model(draft_model)
        elif stage is not None:  # loaded now: its memory counts, and a wrong one is said at start
            preload_drafter(engine, draft_model)
            check_drafter_layers(engine.mtp_drafters[draft_model], draft_model, stage)
    return engine, stage


def check_drafter_layers(drafter, path: str, stage: Stage) -> None:
    """A drafter trained here with fused features reads lower target layers, which a pipeline
    runs on other ranks (rank 0's stage hands over only the final state): one line at start."""
    layers = getattr(getattr(drafter, "args", None), "feature_layers", None) or []
    if any(not stage.lo <= i < stage.hi for i in layers):
        raise EngineError(f"the drafter {path} reads target layers {layers}, and rank 0 runs layers {stage.lo}.."
                          f"{stage.hi - 1} of this pipeline: serve it in one process, or train it with "
                          f"--feature-layers none")


@dataclass
class StepCost:
    """One step on rank 0: its wall time, the time in its forwards (the split layers' own
    all_sums run inside them and count here), and the time broadcasting to the followers.
    Every Round of the step carries it (Round.ranks)."""

    ranks: int
    wall_s: float
    compute_s: float
    broadcast_s: float
    forwards: int


@dataclass(eq=False)
class RankZeroEngine(BatchEngine):
    """The batch loop on rank 0 of a tensor-parallel target (see the module's docstring)."""

    launches_ahead: bool = False  # the ranks mirror forwards of tokens the host has read
    verifies_ahead: bool = False

    bus: Bus | None = None
    log: OpLog = field(default_factory=OpLog)
    timeout_s: float = DEFAULT_TIMEOUT_S
    check: bool = False  # the divergence check: every forward's argmax checksum compared across ranks
    checked: int = 0  # forwards checked identical on every rank
    on_lost: Callable[[RankLost], None] | None = None  # the server's: answer 503 and exit
    stage: Stage | None = None  # a pipeline's last stage (None: tensor parallel)
    last_step: StepCost | None = None
    times: list[RankTimes] = field(default_factory=list)  # every rank's totals, gathered at most once a second
    times_every_s: float = 1.0
    drafter_on: str = RANK0  # EVERY_RANK: the draft model drafts on every rank (drafting.py)
    _forwards: int = 0
    _compute_s: float = 0.0
    _draft_s: float = 0.0  # in the draft model (BatchDrafter), and the draft tokens it made
    _drafted: int = 0
    _times_at: float = 0.0
    _lost: bool = False

    def __post_init__(self):
        super().__post_init__()
        self.watchdog = Watchdog(self.timeout_s, self._expired).start()
        if self.drafter_on == EVERY_RANK:  # the server's draft model, its every op logged for the followers
            path = self.chat.draft_path
            self.drafters[path] = MirroredDrafter(self.chat.draft_model(path).model, log=self.log)

    @property
    def ranks(self) -> int:
        return self.bus.size

    def model_info(self) -> dict:
        return {**super().model_info(), "ranks": self.ranks}

    # -- the hooks BatchEngine calls ----------------------------------------------------------
    def new_cache(self, rows: int) -> BatchCache:
        return MirroredCache(self.model, rows, self.log)

    def _proposer(self, request):
        if request.spec.enabled and request.spec.method == "mtp" and self.stage is None:
            return None, NO_MTP
        if request.spec.enabled and request.spec.compose_ngram and request.spec.method in ("draft", "mtp"):
            # the followers mirror the draft model's own rows only (MirroredDrafter.announce)
            proposer, note = super()._proposer(replace(request, spec=replace(request.spec, compose_ngram=False)))
            return proposer, note or (f"composed drafting is not available across ranks: this request drafts with "
                                      f"{request.spec.method} alone")
        return super()._proposer(request)

    def _draft_together(self, group, asks: list, target_cache) -> dict:
        """The draft model's rows draft together; under option B every rank at once: rank 0 first
        sends what they need (the ops so far and this step's pending tokens), then drafts."""
        if isinstance(group, MirroredDrafter):
            group.announce([(seq.proposer, k, key) for _, seq, k, key in asks], [b for b, _, _, _ in asks])
            self.bus.send(self.log.take())
        t0 = time.perf_counter()
        drafts = super()._draft_together(group, asks, target_cache)
        self._draft_s += time.perf_counter() - t0
        self._drafted += sum(d.size for d in drafts.values())
        return drafts

    def _forward(self, cache: MirroredCache, rows: list[list[int]], seqs=()) -> tuple[mx.array | None, None]:
        """Announce the forward (and the cache ops before it), then run it with the followers.
        A prefill chunk's logits are never read (BatchEngine._admit drops them): only its KV is
        evaluated, on every rank, and None is returned -- a caller that came to read them would
        fail at once here, where evaluating them later would start a collective on rank 0
        alone and hang every rank until the watchdog."""
        width = max(len(r) for r in rows)
        padded = [r + [r[-1]] * (width - len(r)) for r in rows]
        evaluate = KV_ONLY if (cache is not self.cache and len(rows) == 1 and width > 1) else LOGITS
        check = self.check and evaluate == LOGITS
        gather = self._times_due()
        self.bus.send(forward_op(self.log, cache, padded, evaluate, check))
        t0 = time.perf_counter()
        tokens, hidden = mx.array(padded, dtype=mx.uint32), None
        if self.stage is None:
            logits = run_forward(self.model, cache, tokens, evaluate)
        else:  # the last stage: the hidden states too, for MTP rows (they are the final norm's output)
            logits, hidden = run_stage(self.stage, cache, tokens, evaluate)
        self._compute_s += time.perf_counter() - t0
        self._forwards += 1
        if check:
            value = checksum(logits) if self.stage is None else tables_checksum(cache)
            if not self.bus.same_on_every_rank(value):
                raise RankLost(f"the ranks diverged: forward {self._forwards} gave different "
                               + ("logits" if self.stage is None else "caches"))
            self.checked += 1
        if gather:
            self._gather_times()
        if evaluate == KV_ONLY:
            return None, None
        return logits, (hidden if any(s.needs_hidden for s in seqs) else None)

    def _times_due(self) -> bool:
        """Ask for every rank's times (they ride in the next message) at most once a second."""
        if time.monotonic() - self._times_at < self.times_every_s:
            return False
        self._times_at = time.monotonic()
        self.log.add(TIMES, 0)
        return True

    def _gather_times(self) -> None:
        self.times = self.bus.gather_times(RankTimes(self._forwards, self._compute_s, self.bus.comm_s,
                                                     self._draft_s, self._drafted))

    # -- the step, bounded ---------------------------------------------------------------------
    def step(self):
        t0, sent0, computed0, forwards0 = time.perf_counter(), self.bus.comm_s, self._compute_s, self._forwards
        out = self._bounded(super().step, "a step")
        self.last_step = StepCost(self.ranks, time.perf_counter() - t0, self._compute_s - computed0,
                                  self.bus.comm_s - sent0, self._forwards - forwards0)
        cost = asdict(self.last_step)
        for _, rnd in out:
            rnd.ranks = cost
        return out

    def idle(self) -> None:
        """No step to run: a heartbeat (with any cache drops pending), so a dead follower is
        seen now and the followers know rank 0 lives."""
        def beat():
            gather = self._times_due()
            self.bus.send(self.log.take() + [HEARTBEAT, 0, 0])
            if gather:
                self._gather_times()

        self._bounded(beat, "a heartbeat")

    def shutdown(self) -> None:
        """The followers exit their loops."""
        self._bounded(lambda: self.bus.send(self.log.take() + [STOP, 0, 0]), "stop")

    def _bounded(self, work, what: str):
        if self._lost:
            raise RankLost("a rank was lost")
        self.watchdog.arm(what)
        try:
            return work()
        except RuntimeError as e:
            if "[ring]" not in str(e) and "peer" not in str(e):
                raise
            self._lose(RankLost(f"{self.bus.describe_loss()} ({e})"))
            raise self._error from None
        except RankLost as e:
            self._lose(e)
            raise
        finally:
            self.watchdog.disarm()

    def _expired(self, what: str) -> None:
        self._lose(RankLost(f"{self.bus.describe_loss(self.timeout_s)} (rank 0 waited in {what})"))

    def _lose(self, error: RankLost) -> None:
        if self._lost:
            return
        self._lost, self._error = True, error
        if self.on_lost is not None:
            self.on_lost(error)  # the server's 503s and its line first: they need no other rank
        self.bus.end_local_peers()


def follow(model, bus: Bus, timeout_s: float = DEFAULT_TIMEOUT_S, say=None, stage: Stage | None = None,
           draft_model=None) -> int:
    """A follower's whole life: replay rank 0's messages until it says stop. Returns the exit
    code; a lost rank 0 (or a silence longer than `timeout_s`) is one line on stderr. `stage`:
    this rank's pipeline stage (None: a tensor-parallel shard). `draft_model`: this rank's own
    copy of the draft model (--drafter-on every-rank)."""
    say = say or (lambda line: print(f"specscope serve: rank {bus.rank}: {line}", file=sys.stderr, flush=True))

    def silent(what: str) -> None:
        say(f"rank 0 sent nothing for {timeout_s:.0f} s ({bus.describe_loss(timeout_s)}); exiting")
        bus.end_local_peers()  # a stopped rank 0 would keep mlx.launch waiting forever
        os._exit(1)

    watchdog = Watchdog(timeout_s, silent).start()
    replica = Replica(model, DrafterReplica(BatchDrafter(draft_model)) if draft_model is not None else None)
    times = RankTimes()
    while not replica.stopped:
        watchdog.arm("rank 0")
        try:
            for f in replica.apply(bus.receive()):
                t0 = time.perf_counter()
                if stage is None:
                    logits = run_forward(model, f.cache, f.tokens, f.evaluate)
                else:
                    run_stage(stage, f.cache, f.tokens, f.evaluate)
                times.compute_s += time.perf_counter() - t0
                times.forwards += 1
                if f.check:
                    bus.same_on_every_rank(checksum(logits) if stage is None else tables_checksum(f.cache))
            if replica.times_asked:
                replica.times_asked = False
                times.wait_s = bus.comm_s
                if replica.drafter is not None:
                    times.draft_s, times.drafted = replica.drafter.draft_s, replica.drafter.drafted
                bus.gather_times(times)
        except DraftsDiffer as e:  # the ranks diverged: this rank's exit breaks the ring, rank 0 answers 503
            say(f"the ranks diverged: {e}; exiting")
            return 1
        except RuntimeError as e:
            say(f"{bus.describe_loss()} ({e}); exiting")
            bus.end_local_peers()
            return 1
        finally:
            watchdog.disarm()
    return 0
