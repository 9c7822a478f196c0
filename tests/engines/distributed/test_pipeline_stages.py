"""The pipeline's stages in one process (no ranks launched): each stage is built as its rank
builds it -- a lazily loaded model whose other layers are dropped before a weight is read,
Gemma 4's per-layer embedding cut to the stage's columns -- with its own cache, and the hidden
state handed from one to the next. Through a prompt and decode steps, the last stage's logits
must equal the whole model's bit for bit (what makes `--ranks 2` answer as one process does);
and a stage holds only its layers."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from mlx.utils import tree_flatten  # noqa: E402

from engines.batch.cache import BatchCache  # noqa: E402
from engines.distributed.pipeline import Absent, Unpipelinable, check_pipelinable, embed, make_stage, plan  # noqa: E402
from engines.mlx_chat.loading import load_model  # noqa: E402
from tests.engines.mlx_chat.gemma4.checkpoints import EDGE_TARGET, build_target  # noqa: E402
from tests.engines.mlx_chat.gemma4.conftest import dense_pair  # noqa: E402,F401  (the tiny Gemma 4 pair)
from tests.engines.mlx_chat.conftest import gemma3_dir  # noqa: E402,F401

STEPS = [[5, 9, 13, 7, 22, 30, 31, 40, 41, 42, 43, 44, 45, 46], [3, 4], [17], [8, 2, 11]]


@pytest.fixture(scope="module")
def edge_target(tmp_path_factory):
    """The E2B-like target: per-layer inputs, and layers 4-5 reuse the K/V of layers 2-3."""
    return str(build_target(tmp_path_factory.mktemp("edge") / "target", EDGE_TARGET))


def whole_model(path: str) -> list[mx.array]:
    model = load_model(path).model
    cache, out = BatchCache(model, 1), []
    for tokens in STEPS:
        cache.begin(len(tokens))
        out.append(model(mx.array([tokens], dtype=mx.uint32), cache=cache.layers))
        mx.eval(out[-1])
        cache.settle([len(tokens)])
    return out


def through_stages(path: str, ranks: int, skip_hidden: bool = False) -> tuple[list[mx.array], list]:
    """Every rank's stage, in the order they run (rank 1, ..., rank N-1, rank 0)."""
    stages = [make_stage(load_model(path, lazy=True).model, None, rank, ranks) for rank in range(ranks)]
    order = stages[1:] + stages[:1]
    caches = [BatchCache(s.model, 1) for s in order]
    out = []
    for tokens in STEPS:
        x, h = mx.array([tokens], dtype=mx.uint32), None
        for stage, cache in zip(order, caches):
            cache.begin(len(tokens))
            if skip_hidden and stage.next is None:  # the broken variant: rank 0 starts from the tokens
                h = embed(stage.model, x)
            h, _ = stage(cache, x, h)
        mx.eval(h)
        out.append(h)
        for cache in caches:
            cache.settle([len(tokens)])
    return out, order


@pytest.fixture(params=["dense", "edge", "llama", "gemma3"])
def model_path(request):
    fixture = {"dense": "dense_pair", "edge": "edge_target", "llama": "llama", "gemma3": "gemma3_dir"}[request.param]
    value = request.getfixturevalue(fixture)
    return str(value.target) if request.param == "dense" else str(value)


def test_the_stages_give_the_whole_model_s_logits_bit_for_bit(model_path):
    expected = whole_model(model_path)
    got, stages = through_stages(model_path, 2)
    assert all(mx.array_equal(e, g).item() for e, g in zip(expected, got))
    # each stage holds only its layers (and no head before the last)
    for stage in stages:
        layers = stage.inner.layers
        held = [i for i, layer in enumerate(layers) if not isinstance(layer, Absent)]
        assert held == list(range(stage.lo, stage.hi))
        names = [k for k, _ in tree_flatten(stage.model.parameters())]
        assert not any(k.startswith(f"model.layers.{i}.") for i in range(len(layers)) if i not in held for k in names)


def test_a_last_stage_that_ignores_the_hidden_state_it_receives_is_caught(dense_pair):
    """Must fail: rank 0 embeds the tokens itself instead of continuing rank 1's hidden state."""
    path = str(dense_pair.target)
    got, _ = through_stages(path, 2, skip_hidden=True)
    assert not all(mx.array_equal(e, g).item() for e, g in zip(whole_model(path), got))


def test_the_gemma4_stages_keep_what_the_assistant_reads_on_rank_zero(dense_pair, edge_target):
    """Rank 0 runs from the first layer the assistant reads (the last sliding and full layers
    with a cache, which the KV-shared layers reuse too) to the end; the per-layer embedding is
    cut to each stage's layers."""
    dense = make_stage(load_model(str(dense_pair.target), lazy=True).model, None, 0, 2)
    assert (dense.lo, dense.hi) == (2, 4)  # s f | s f: the assistant reads layers 2 and 3
    edge = [make_stage(load_model(edge_target, lazy=True).model, None, r, 2) for r in (0, 1)]
    assert [(s.lo, s.hi) for s in edge] == [(2, 6), (0, 2)]  # layers 4-5 reuse 2-3's K/V
    d = EDGE_TARGET.hidden_size_per_layer_input
    assert [s.inner.embed_tokens_per_layer.weight.shape[1] for s in edge] == [4 * d, 2 * d]


def test_the_plan():
    assert plan(30, 29, 2) == [(15, 30), (0, 15)]  # SmolLM2: a fair half each
    assert plan(35, 13, 2) == [(13, 35), (0, 13)]  # Gemma 4 E2B: the assistant reads layers 13 and 14
    assert plan(12, 11, 3) == [(8, 12), (0, 4), (4, 8)]
    with pytest.raises(Unpipelinable, match="a layer per rank"):
        plan(2, 1, 3)


def test_what_has_no_stages_is_one_line(llama):
    model = load_model(llama, lazy=True).model
    check_pipelinable(model, 2)
    model.model_type = "olmo"  # an architecture the stages do not know
    with pytest.raises(Unpipelinable, match="'olmo' model cannot be split into pipeline stages"):
        check_pipelinable(model, 2)


def test_a_drafter_reading_layers_off_rank_zero_is_one_line(tmp_path):
    """A drafter trained with fused features reads lower target layers; a pipeline runs them on
    rank 1, so `serve --ranks 2` refuses it at start; a drafter reading only the last layer's
    state and K/V is served."""
    from engines.distributed.engine import check_drafter_layers
    from engines.mlx_chat.drafter import Drafter, DrafterArgs, TargetView
    from engines.types import EngineError
    from tests.engines.mlx_chat import checkpoints

    path = str(checkpoints.make_tiny_llama(tmp_path / "llama"))
    model = load_model(path).model
    rank0 = make_stage(load_model(path, lazy=True).model, None, 0, 2)
    fused = Drafter(DrafterArgs.for_target(TargetView.of(model, [0]), 64))
    with pytest.raises(EngineError, match=r"reads target layers \[0\], and rank 0 runs layers 1\.\.1"):
        check_drafter_layers(fused, "DIR", rank0)
    check_drafter_layers(Drafter(DrafterArgs.for_target(TargetView.of(model), 64)), "DIR", rank0)
