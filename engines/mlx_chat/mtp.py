"""Gemma 4 MTP: the glue between an mlx-lm Gemma 4 target and the assistant drafter.

What the drafter needs from the target (see gemma4_assistant.py for the drafter itself):
  - the target's scaled token embedding of the last token,
  - the target's final-norm hidden state at the last *accepted* position (never a rejected
    draft's: the reference's h_idx lesson),
  - K/V from the target's cache: the last full-attention layer with a cache for the drafter's
    full layers, the last sliding layer for its sliding layers,
  - the last token's position (held for every chained step).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models import gemma4_text

from engines.types import EngineError
from engines.mlx_chat.cache import cache_buffer  # noqa: F401  (its home was here; tests import it from mtp)
from engines.mlx_chat.gemma4_assistant import Model as Assistant
from engines.mlx_chat.proposers import LazyVerdict
from engines.speculative.proposer import Draft


def gemma4_text_model(model) -> gemma4_text.Model:
    """The mlx-lm Gemma 4 text model inside a target (`gemma4_text`, or the text part of
    `gemma4`)."""
    if isinstance(model, gemma4_text.Model):
        return model
    inner = getattr(model, "language_model", None)
    if isinstance(inner, gemma4_text.Model):
        return inner
    raise EngineError(
        f"--spec mtp needs a Gemma 4 target (gemma4 / gemma4_text); this model is "
        f"{getattr(model, 'model_type', type(model).__name__)}"
    )


@dataclass
class Gemma4Target:
    """A view of an mlx-lm Gemma 4 target with what MTP needs."""

    text: gemma4_text.Model
    kv_layer: dict[str, int]  # attention type -> index of the target layer whose cache it reads
    sliding_window: int

    @classmethod
    def of(cls, model) -> "Gemma4Target":
        text = gemma4_text_model(model)
        args = text.args
        with_cache = args.num_hidden_layers - args.num_kv_shared_layers  # layers that own a cache
        kv_layer = {}
        for i in range(with_cache):
            kv_layer[args.layer_types[i]] = i  # the last one of each type wins
        return cls(text=text, kv_layer=kv_layer, sliding_window=args.sliding_window)

    @property
    def kv_layers(self) -> dict[str, int]:
        """Attention kind -> index of the target cache the drafter's layers of that kind read."""
        return self.kv_layer

    @property
    def hidden_size(self) -> int:
        return self.text.args.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.text.args.vocab_size

    def embed(self, tokens: mx.array) -> mx.array:
        """Scaled input embedding, as the target scales it (Gemma: * sqrt(hidden))."""
        inner = self.text.model
        return inner.embed_tokens(tokens) * inner.embed_scale  # exactly as mlx-lm's target does

    def forward(self, tokens: mx.array, cache: list) -> tuple[mx.array, mx.array]:
        """The target forward that also returns the final-norm hidden states:
        (logits [1, L, vocab], hidden [1, L, hidden])."""
        text = self.text
        hidden = text.model(tokens, cache=cache)
        if text.tie_word_embeddings:
            logits = text.model.embed_tokens.as_linear(hidden)
        else:
            logits = text.lm_head(hidden)
        if text.final_logit_softcapping is not None:
            logits = gemma4_text.logit_softcap(text.final_logit_softcapping, logits)
        return logits, hidden

    def check_compatible(self, drafter: Assistant) -> None:
        check_compatible(self, drafter)

    def drafter_view(self, cache: list, last_kept: mx.array):
        """The drafter's K/V as (kv, masks): per attention type the whole K/V buffer of the
        layer it reads, and a boolean mask of the entries it sees once everything after
        position `last_kept` is rolled back: for full attention every position <= last_kept,
        for sliding attention the last `sliding_window` of them, i.e. the window the last
        kept token attended to (what a sliding-window cache holds).

        That window is a choice the published code does not pin down: transformers' assistant
        masks the sliding K/V it is handed with |q - kv| <= window (window + 1 positions when
        given more); llama.cpp applies its usual sliding-window mask at the query's position.
        All agree until the context passes the window; our parity test hands transformers
        exactly the K/V we read, before and past the window.

        Why buffers and masks rather than exact slices: last_kept may still be lazy (a verdict
        the host has not read: depth-2 overlap), and a buffer's shape changes only when the
        cache grows it, so the compiled drafter step is traced once per growth rather than
        once per token. Entries past the cache's offset (rejected drafts, unused capacity) are
        masked out."""
        kv, masks = {}, {}
        for kind, idx in self.kv_layer.items():
            keys, values, first = cache_buffer(cache[idx])
            positions = mx.arange(first, first + keys.shape[2], dtype=mx.int32)
            visible = positions <= last_kept
            if kind == "sliding_attention":
                visible = visible & (positions > last_kept - self.sliding_window)
            kv[kind], masks[kind] = (keys, values), visible
        return kv, masks


def check_compatible(target: Gemma4Target, drafter: Assistant) -> None:
    """Raise EngineError with one clear line if the drafter cannot serve this target."""
    if drafter.backbone_hidden_size != target.hidden_size:
        raise EngineError(
            f"MTP drafter does not fit this target: it was built for a backbone of width "
            f"{drafter.backbone_hidden_size}, the target's hidden size is {target.hidden_size}"
        )
    if drafter.vocab_size != target.vocab_size:
        raise EngineError(
            f"MTP drafter does not fit this target: vocabulary {drafter.vocab_size} vs {target.vocab_size}"
        )
    missing = set(drafter.layer_types) - set(target.kv_layer)
    if missing:
        raise EngineError(f"MTP drafter reads {sorted(missing)} K/V that this target does not have")
    targs, dargs = target.text.args, drafter.text
    want = {"sliding_attention": targs.head_dim, "full_attention": targs.global_head_dim or targs.head_dim}
    have = {"sliding_attention": dargs.head_dim, "full_attention": dargs.global_head_dim or dargs.head_dim}
    for kind in set(drafter.layer_types):
        if want[kind] != have[kind]:
            raise EngineError(
                f"MTP drafter does not fit this target: {kind} head size {have[kind]} vs {want[kind]}"
            )


# -- the MTP proposer: what the round loop in engine.py calls ----------------------------------


@dataclass
class Chain:
    """A draft chain in progress for one target state. Every array may still be lazy: step
    i+1 embeds step i's token in the graph, so k steps are one graph and one wait -- or none,
    when the chain was anticipated (depth-2 overlap) and goes straight into the next verify."""

    position: mx.array  # [] int32: of the token the first step embeds (not yet in the target's cache)
    context: list[int]  # the loop's ctx.tokens (append-only) when the chain began
    kv: dict[str, tuple[mx.array, mx.array]]  # the target K/V snapshot the drafter reads
    masks: dict[str, mx.array]  # which of those entries it sees
    token: mx.array  # [1] the token the next step embeds
    h: mx.array  # [backbone_hidden] the next step's h_prev
    tokens: list[mx.array]  # drafted so far, [1] each
    qs: list[mx.array]  # the drafter's distributions [V], T>0 only
    after: LazyVerdict | None = None  # anticipated: built on this verdict, before the host read it
    ready: bool = False  # anticipated, and that round has since been settled (commit)

    def outputs(self) -> list[mx.array]:
        return [*self.tokens, *self.qs, self.h]


class MTPProposer:
    """MTP drafting for the round loop (see proposers.py for the protocol): the Gemma 4
    assistant on a Gemma 4 target, or a drafter trained here (drafter.py) on its target --
    both are stepped from (token embedding, h_prev, position, K/V view).

    propose(ctx, k)     chains the drafter k times from the target's state: the last accepted
                        token, the target's hidden state at the position before it (ctx.hidden,
                        set by the loop from the last *accepted* position), and its cache K/V.
                        If the chain was anticipated it is only cut or extended to k, and
                        handed back unevaluated: the verify reads it in the graph.
    anticipate(ctx, v)  depth-2 overlap: right after a verify is launched, chain the next
                        round's drafts on its verdict *in the graph*: the accepted count, the
                        target's token and hidden state at the accepted position, the position
                        that follows, and a mask that hides the K/V of drafts the rollback will
                        drop. MLX runs the chain right behind the verify while the host reads
                        the verdict, rolls back and reports; k is last round's (k_hint).
    commit(ctx)         the next round goes on from the anticipated chain: its round is settled,
                        or (slot caches, `launches_ahead`) the next round is launched on its
                        verdict still in the graph.
    A chain reads the MLX arrays the cache held when it was built; cache writes make new
    arrays (see proposers.py), so the loop may write the cache while a chain runs.
    """

    name = "mtp"
    needs_hidden = True

    def __init__(self, drafter: Assistant, target: Gemma4Target, overlap: bool = True, compiled: bool = True):
        target.check_compatible(drafter)  # Gemma4Target + assistant, or drafter.TargetView + Drafter
        self.drafter = drafter
        self.target = target
        self.drafts_ahead = overlap  # depth-2 overlap: the loop calls anticipate()
        # the loop may launch the next verify on an anticipated chain before reading the verdict
        # (engine.py, cache.SlotKVCache): a target view that reads the slot caches' holes. The
        # loop sets it False when it does not (no slot caches for this target)
        self.launches_ahead = overlap and getattr(target, "reads_slot_caches", False)
        self.drafter_step = drafter.compiled_step() if compiled else drafter.step
        self.pending: Chain | None = None
        self.k_hint = 0  # drafts asked last round: the guess for an anticipated chain
        self.overlap_hits = 0  # rounds whose chain had been anticipated

    # -- protocol ----------------------------------------------------------------------------
    def start(self, ctx) -> None:
        self.pending, self.k_hint = None, 0
        if ctx.hidden is None:
            raise EngineError("MTP needs the target's hidden state; the round loop did not provide it")

    def propose(self, ctx, k: int) -> Draft:
        chain, self.pending = self.pending, None
        overlapped = chain is not None and chain.ready
        if overlapped:
            self.overlap_hits += 1
        else:
            chain = self._begin(ctx)
        self._extend(chain, k, ctx.sampling)
        self.k_hint = k
        tokens = mx.concatenate(chain.tokens[:k]).astype(mx.uint32)
        q = mx.stack(chain.qs[:k]) if chain.qs else None
        return Draft(tokens, q, overlapped=overlapped)

    def anticipate(self, ctx, verdict: LazyVerdict) -> None:
        self.pending = None
        if self.k_hint and verdict.hidden is not None:
            chain = self._begin_after(ctx, verdict)
            self._extend(chain, self.k_hint, ctx.sampling)
            if not self.launches_ahead:  # else it runs with the next verify, which reads it
                # (MLX's CPU stream takes ~50 ops ahead of the device: an eval here waits for this verify)
                mx.async_eval(*chain.outputs())
            self.pending = chain

    def commit(self, ctx) -> None:
        if self.pending is not None:
            self.pending.ready = True

    def chain_ahead(self) -> bool:
        """Whether a chain was anticipated on the launched round's verdict (the next round can
        be launched on it now)."""
        return self.pending is not None

    # -- the chain ---------------------------------------------------------------------------
    def _begin(self, ctx) -> Chain:
        """A chain on the settled state: the host knows the last token and its position."""
        position = mx.array(ctx.position, dtype=mx.int32)
        return self._chain(ctx, position, mx.array(ctx.tokens[-1:], dtype=mx.uint32), ctx.hidden)

    def _begin_after(self, ctx, verdict: LazyVerdict) -> Chain:
        """A chain on the state a launched round's verdict will leave (all of it lazy)."""
        return self._chain(ctx, verdict.next_position, verdict.token, verdict.hidden, after=verdict)

    def _chain(self, ctx, position: mx.array, token: mx.array, hidden: mx.array,
               after: LazyVerdict | None = None) -> Chain:
        """A chain from `token` at `position`, the target's K/V before it, and the target's
        hidden state that produced it."""
        kv, masks = self.target.drafter_view(ctx.target_cache, position - 1)
        return Chain(position, ctx.tokens, kv, masks, token, hidden.reshape(-1), tokens=[], qs=[], after=after)

    def _extend(self, chain: Chain, k: int, sampling) -> None:
        """Draft until the chain holds k tokens: argmax in the graph at T=0; at T>0 a sample
        from the drafter's full distribution q (same temperature / top-k / top-p as the
        target), kept for rejection sampling."""
        from engines.mlx_chat.sampling import sample, target_probs

        while len(chain.tokens) < k:
            step = self._step(chain)
            if sampling.greedy:
                token = mx.argmax(step.logits, axis=-1, keepdims=True)
            else:
                q = target_probs(step.logits, sampling)
                token = sample(q).reshape(1)
                chain.qs.append(q)
            chain.tokens.append(token)
            chain.token, chain.h = token, step.h_next

    def target_forward(self, tokens: mx.array, cache: list) -> tuple[mx.array, mx.array]:
        """The loop's target forward while MTP runs: logits and final-norm hidden states, for
        gemma4_text and for the text part of gemma4 alike."""
        return self.target.forward(tokens, cache)

    def _step(self, chain: Chain):
        """One drafter forward from the chain's current token and h_prev."""
        embedding = self.target.embed(chain.token)[0]
        return self.drafter_step(embedding, chain.h, chain.position, chain.kv, chain.masks)


def load_drafter(path: str):
    """The MTP drafter at `path` -- a drafter trained here (drafter.py) or a Gemma 4
    assistant -- with one-line EngineErrors for what a user can get wrong."""
    from pathlib import Path

    from engines.mlx_chat import drafter as trained
    from engines.mlx_chat.gemma4_assistant import load_assistant

    if trained.is_drafter_dir(path):
        return trained.load_drafter(path)
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise EngineError(f"MTP drafter not found: {path} (expected a Gemma 4 assistant directory)")
    try:
        drafter = load_assistant(p)
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise EngineError(f"cannot load the MTP drafter in {path}: {first}") from e
    from engines.mlx_chat.loading import materialize

    materialize(drafter)  # its full-attention layers' RoPE `_freqs`: a server drafts in another thread
    return drafter


def is_assistant_dir(path: str) -> bool:
    """Whether `path` holds an MTP drafter rather than a language model: a Gemma 4 assistant
    (config.json model_type gemma4_assistant) or a drafter trained here (specscope_drafter)."""
    import json
    from pathlib import Path

    from engines.mlx_chat.drafter import MODEL_TYPE

    cfg = Path(path).expanduser() / "config.json"
    try:
        return json.loads(cfg.read_text()).get("model_type") in ("gemma4_assistant", MODEL_TYPE)
    except (OSError, ValueError, AttributeError):
        return False


def preload_drafter(engine, path: str) -> None:
    """Load the assistant with the engine (ChatEngine.load(..., draft_model=ASSISTANT_DIR))."""
    engine.__dict__.setdefault("mtp_drafters", {})[path] = load_drafter(path)


def make_mtp_proposer(engine, request) -> MTPProposer:
    """Called by ChatEngine for `--spec mtp`. Drafters are loaded once per engine and kept
    in `engine.mtp_drafters` (path -> drafter; tests may put a drafter of their own there)."""
    path = request.spec.draft_model or engine.draft_path
    if not path:
        raise EngineError("--spec mtp needs an MTP drafter: the Gemma 4 assistant or a drafter trained with `specscope drafter train` (--draft-model DIR)")
    drafters = engine.__dict__.setdefault("mtp_drafters", {})
    if path not in drafters:
        drafters[path] = load_drafter(path)
    from engines.mlx_chat.drafter import Drafter, TargetView

    drafter = drafters[path]
    if isinstance(drafter, Drafter):  # a drafter trained here reads the target through TargetView
        if drafter.target is None or drafter.target.model is not engine.model:
            drafter.attach(TargetView.of(engine.model))
        target = drafter.target  # the view that returns the layers this drafter reads
    else:  # the Gemma 4 assistant (or a test's wrapper of one)
        target = Gemma4Target.of(engine.model)
    options = engine.mtp_options  # depth-2 overlap and the compiled step: on unless an A/B run turns them off
    # `engine.mtp_proposer` (a class or factory with MTPProposer's signature) lets the benchmark
    # and the tests run a replaying drafter through the real loop.
    factory = engine.__dict__.get("mtp_proposer", MTPProposer)
    return factory(drafter, target, overlap=options.overlap, compiled=options.compiled)
