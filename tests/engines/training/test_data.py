"""The trainer's data: a run stopped while the target answers keeps the answers so far and the
next run answers only the rest (ending with exactly the answers of a run never stopped);
features are kept in float16 and handed to training in float32; acceptance is measured on held-out
answers only, never on the user's text, and over their answer positions only."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from engines.mlx_chat.drafter import Drafter, DrafterArgs, TargetView
from engines.training import data as D
from engines.training import losses, preparation
from engines.training.batches import split
from engines.training.config import TrainConfig
from engines.training.evaluation import EVAL_DEPTH, evaluate
from engines.training.losses import chained_loss, depth_outputs
from engines.training.preparation import answer_starts, prepare
from tests.engines.mlx_chat import checkpoints
from tests.engines.training.trained import write_prompts
from tests.engines.chat import load_chat


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    target = checkpoints.make_tiny_llama(d / "llama")
    return load_chat(str(target)), target, write_prompts(d / "prompts.json", checkpoints.WORDS, n=40)


def run_config(llama, out, rounds=1) -> TrainConfig:
    _, _, prompts = llama
    return TrainConfig(out=out, prompts_file=str(prompts), answer_tokens=20, seq_len=48, steps=1,
                       answers_per_prompt=rounds, answer_temperature=1.5)


def run_prepare(llama, out, should_stop=lambda: False, rounds=1, on_progress=lambda p: None, target=None):
    engine, made, _ = llama
    return prepare(TargetView.of(engine.model), engine.tokenizer, str(target or made), run_config(llama, out, rounds),
                   on_progress, should_stop)


def test_a_run_stopped_while_answering_resumes_from_the_kept_answers(llama, tmp_path):
    whole, answers, _ = run_prepare(llama, tmp_path / "whole")
    assert answers == 40
    batches = []

    def stop_after_one_batch() -> bool:  # asked before each batch of 32 prompts, then once more
        batches.append(1)
        return len(batches) > 1

    with pytest.raises(KeyboardInterrupt):
        run_prepare(llama, tmp_path / "stopped", stop_after_one_batch)
    kept = json.loads((tmp_path / "stopped" / "data" / "answers.json").read_text())["sequences"]
    assert len(kept) == 32
    resumed, answers, _ = run_prepare(llama, tmp_path / "stopped")
    assert answers == 40
    assert mx.array_equal(resumed.tokens, whole.tokens).item()
    assert mx.array_equal(resumed.labels, whole.labels).item()


def test_states_are_kept_in_float16_and_trained_on_in_float32(llama, tmp_path):
    feats, _, _ = run_prepare(llama, tmp_path / "out")
    assert feats.hidden.dtype == feats.keys.dtype == feats.values.dtype == mx.float16
    rows = feats.rows([0, 1])
    assert rows.hidden.dtype == rows.keys.dtype == rows.values.dtype == mx.float32
    assert mx.array_equal(rows.hidden, feats.hidden[:2].astype(mx.float32)).item()


def test_held_out_rows_are_answers_only():
    train, held = split(100, 20, 20, 0.1, seed=0)
    assert len(held) == 2 and all(r < 20 for r in held)
    assert sorted(train + held) == list(range(100))
    train, held = split(100, 0, 0, 0.1, seed=0)  # no answers: text rows are held out
    assert len(held) == 10 and sorted(train + held) == list(range(100))


def test_held_out_prompts_are_unseen_in_training_whatever_the_answers_per_prompt():
    one_train, one_held = split(100, 20, 20, 0.1, seed=0)
    train, held = split(100, 60, 20, 0.1, seed=0)  # 3 answers per prompt: rows r, r + 20, r + 40
    assert held == one_held  # the greedy answers of the same prompts are held out
    assert not {r % 20 for r in train if r < 60} & set(held)  # no other answer to them is trained on
    assert sorted(train + held + [r + k for r in held for k in (20, 40)]) == list(range(100))


def test_further_answers_per_prompt_are_sampled_seeded_and_resumable(llama, tmp_path):
    greedy, _, _ = run_prepare(llama, tmp_path / "one")
    whole, answers, _ = run_prepare(llama, tmp_path / "two", rounds=2)
    assert answers == 80
    assert mx.array_equal(whole.tokens[:40], greedy.tokens).item()  # round 1 is the greedy answers
    first = lambda f, r: f.tokens[r, : int(f.starts[r])].tolist()
    assert all(first(whole, r + 40) == first(whole, r) for r in range(40))  # the same prompts again
    differ = sum(not mx.array_equal(whole.tokens[r + 40], whole.tokens[r]).item() for r in range(40))
    assert differ >= 30, differ  # sampled at T=1.5: nearly every second answer differs from the greedy one
    calls = []
    with pytest.raises(KeyboardInterrupt):  # stopped after the second batch: the first of round 2
        run_prepare(llama, tmp_path / "stopped", lambda: calls.append(1) or len(calls) > 3, rounds=2)
    kept = json.loads((tmp_path / "stopped" / "data" / "answers.json").read_text())["sequences"]
    assert len(kept) == 72
    resumed, _, _ = run_prepare(llama, tmp_path / "stopped", rounds=2)
    assert mx.array_equal(resumed.tokens, whole.tokens).item()  # the sampled rows seeded by their place
    notes = []  # a second answer per prompt asked where the greedy ones were made: only those are answered
    again, _, _ = run_prepare(llama, tmp_path / "one", rounds=2, on_progress=lambda p: notes.append(p.note))
    assert "the target writes 40 of 80 answers (2 per prompt)" in notes
    assert mx.array_equal(again.tokens, whole.tokens).item()


def test_shipped_answers_are_read_for_the_same_model_wherever_it_is(llama, tmp_path, monkeypatch):
    """Answers shipped for a model (scripts/ship_answers.py) stand in for answering when the
    model's bytes, the prompts and the settings are the same -- the model installed elsewhere
    included; one byte of the weights changed, the target answers again."""
    import shutil

    _, target, _ = llama
    whole, _, _ = run_prepare(llama, tmp_path / "made", rounds=2)
    folder = tmp_path / "shipped"
    monkeypatch.setattr(preparation, "shipped_answers_folder", lambda: folder)
    written = preparation.ship_answers(str(target), run_config(llama, tmp_path / "made", rounds=2), folder)
    assert written.parent == folder

    moved = shutil.copytree(target, tmp_path / "elsewhere" / "llama")  # another path and mtime: the same bytes
    notes = []
    read, answers, _ = run_prepare(llama, tmp_path / "fresh", rounds=2, target=moved, on_progress=lambda p: notes.append(p.note))
    assert answers == 80 and "80 of the 80 answers ship with Specscope" in notes
    assert not any(n and n.startswith("the target writes") for n in notes)
    assert mx.array_equal(read.tokens, whole.tokens).item() and mx.array_equal(read.labels, whole.labels).item()
    notes = []  # three per prompt asked: the shipped two, then only the third round answered
    run_prepare(llama, tmp_path / "three", rounds=3, target=moved, on_progress=lambda p: notes.append(p.note))
    assert "80 of the 120 answers ship with Specscope" in notes and "the target writes 40 of 120 answers (3 per prompt)" in notes

    weights = next(moved.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the same size: hashed, and refused
    weights.write_bytes(bytes(data))
    notes = []
    run_prepare(llama, tmp_path / "changed", rounds=2, target=moved, on_progress=lambda p: notes.append(p.note))
    assert "the target writes 80 of 80 answers (2 per prompt)" in notes


def test_answer_positions_start_after_each_prompt(llama, tmp_path):
    engine, _, prompts = llama
    feats, answers, sources = run_prepare(llama, tmp_path / "out")
    starts = feats.starts.tolist()  # set by prepare
    assert starts == answer_starts(engine.tokenizer, D.load_prompts(prompts), 48, feats.size).tolist()
    for row, prompt in enumerate(D.load_prompts(prompts)):
        ids = D.chat_ids(engine.tokenizer, prompt)[: 48 - 8]
        assert feats.tokens[row, : starts[row]].tolist() == ids
        assert starts[row] < int(feats.lengths[row])  # an answer follows


def test_held_out_acceptance_counts_answer_positions_only(llama, tmp_path):
    """Labels rigged so the drafter's depth-1 draft is right exactly at the prompt positions:
    acceptance over every position is well above 0, over the answers exactly 0."""
    engine, _, prompts = llama
    feats, _, _ = run_prepare(llama, tmp_path / "out")
    target = TargetView.of(engine.model)
    held = feats.rows(list(range(8)))
    drafter = Drafter(DrafterArgs.for_target(target, 64)).attach(target)
    (_, h), = list(depth_outputs(drafter, held, 1))
    drafted = drafter.vocab_ids[mx.argmax(drafter.sub_logits(h), axis=-1)]  # depth 1 at positions 1..L-1
    L = held.tokens.shape[1]
    starts, held.starts = held.starts, None  # first measured over every position
    in_prompt = mx.arange(1, L)[None, :] < starts[:, None]
    held.labels[:, 1:] = mx.where(in_prompt, drafted, drafted + 1)  # right in the prompt, wrong after it
    everywhere = evaluate(drafter, held, 4)
    held.starts = starts
    answers_only = evaluate(drafter, held, 4)
    assert everywhere[0] > 0.1 and answers_only[0] == 0.0, (everywhere, answers_only)


def test_held_out_acceptance_is_the_share_of_chains_right_to_each_depth(llama, tmp_path):
    """evaluate against the chains counted one by one: each position's label rigged to the
    depth-1, 2 or 3 draft there (or neither), so chains hold to depths 1, 2 and 3 at different
    rates; a chain starts at an answer position p >= 1 and its depth-d draft sits at p + d - 1."""
    engine, _, _ = llama
    feats, _, _ = run_prepare(llama, tmp_path / "out")
    target = TargetView.of(engine.model)
    held = feats.rows(list(range(7)))
    mx.random.seed(5)
    drafter = Drafter(DrafterArgs.for_target(target, 64)).attach(target)
    L = held.tokens.shape[1]
    drafts = {d: np.array(drafter.vocab_ids[mx.argmax(drafter.sub_logits(h), axis=-1)])  # row j: position j + d
              for d, h in depth_outputs(drafter, held, EVAL_DEPTH)}
    labels = np.array(held.labels)
    pick = np.random.default_rng(0).choice(4, size=labels.shape, p=[0.45, 0.3, 0.15, 0.1])
    for d in (1, 2, 3):
        at = np.nonzero(pick[:, d:] == d - 1)
        labels[:, d:][at] = drafts[d][at]
    held.labels = mx.array(labels)
    hits, starts = np.zeros(EVAL_DEPTH), 0
    for n in range(held.size):
        for p in range(max(1, int(held.starts[n])), int(held.lengths[n]) - EVAL_DEPTH + 1):
            starts += 1
            for d in range(1, EVAL_DEPTH + 1):
                if drafts[d][n, p - 1] != labels[n, p + d - 1]:
                    break
                hits[d - 1] += 1
    want = list(hits / starts)
    assert want[0] > 0.3 and want[1] > 0.05 and want[2] > 0.01  # every depth rigged is reached
    assert evaluate(drafter, held, 3) == pytest.approx(want, abs=1e-12)


def test_the_loss_leaves_out_chains_that_start_in_a_prompt(llama, tmp_path):
    """Changing the labels of prompt positions changes nothing the loss counts (chains of depth
    d that start in the answer read labels from the answer's first position + d - 1 on). With
    hard labels: they can be changed without touching the drafter's inputs (a soft label is the
    target's final state through its head, and that state is also what the drafter reads); the
    mask that leaves the chains out is the same for both."""
    engine, _, prompts = llama
    feats, _, _ = run_prepare(llama, tmp_path / "out")
    target = TargetView.of(engine.model)
    batch = feats.rows(list(range(4)))
    config = TrainConfig(out=tmp_path, depth=3, soft_labels=False)
    drafter = Drafter(DrafterArgs.for_target(target, 64))
    drafter.vocab_ids = mx.arange(64, dtype=mx.int32)
    drafter.attach(target)
    before = chained_loss(drafter, batch, config).item()
    L = batch.tokens.shape[1]
    in_prompt = mx.arange(L)[None, :] < batch.starts[:, None]
    batch.labels = mx.where(in_prompt, (batch.labels + 1) % 64, batch.labels)
    assert chained_loss(drafter, batch, config).item() == before
    batch.starts = None  # every chain counted: the same change moves the loss
    rigged = chained_loss(drafter, batch, config).item()
    batch.labels = mx.where(in_prompt, (batch.labels + 63) % 64, batch.labels)
    assert chained_loss(drafter, batch, config).item() != rigged


def test_rows_left_out_change_no_other_row(llama, tmp_path):
    """Training leaves out the rows of chains that start in a prompt (depth_outputs' `first`):
    every other row's states, at every depth, are those of the whole chain computed."""
    engine, _, _ = llama
    feats, _, _ = run_prepare(llama, tmp_path / "out")
    target = TargetView.of(engine.model)
    batch = feats.rows(list(range(4)))
    first = int(batch.starts.min()) - 1
    assert first > 2
    drafter = Drafter(DrafterArgs.for_target(target, 64)).attach(target)
    whole, part = list(depth_outputs(drafter, batch, 3)), list(depth_outputs(drafter, batch, 3, first=first))
    assert [d for d, _ in part] == [1, 2, 3]
    for (_, h), (_, h_part) in zip(whole, part):
        assert h_part.shape[1] == h.shape[1] - first
        assert mx.allclose(h[:, first:], h_part, atol=1e-5).item()


@pytest.fixture(scope="module")
def talker(tmp_path_factory):
    """A tiny target that can end its turn (EOS reachable): it writes prompts of its own."""
    d = tmp_path_factory.mktemp("talker")
    target = checkpoints.make_tiny_llama(d / "llama", reachable_eos=True)
    return load_chat(str(target)), target, write_prompts(d / "prompts.json", checkpoints.WORDS, n=8)


def prepare_own(talker, out, should_stop=lambda: False, on_progress=lambda p: None):
    engine, target, prompts = talker
    config = TrainConfig(out=out, prompts_file=str(prompts), own_prompts=40, answer_tokens=12, seq_len=96, steps=1,
                         answers_per_prompt=1)
    return prepare(TargetView.of(engine.model), engine.tokenizer, str(target), config, on_progress, should_stop)


def test_the_target_writes_prompts_of_its_own_answers_them_and_resumes(talker, tmp_path):
    engine, _, prompts = talker
    notes = []
    feats, answers, sources = prepare_own(talker, tmp_path / "whole", on_progress=lambda p: notes.append(p.note))
    written = json.loads((tmp_path / "whole" / "data" / "own_prompts.json").read_text())["prompts"]
    assert len(written) == len(set(written)) == 40 and sources["own_prompts"] == 40
    assert not set(written) & set(D.load_prompts(prompts))
    assert answers == 48 and sources["prompt_count"] == 48  # the 8 shipped, then the 40 written, answered
    assert "the target writes 40 prompts of its own" in notes
    for row, prompt in enumerate(written, start=8):  # each written prompt is a row's prompt
        ids = D.chat_ids(engine.tokenizer, prompt)[: 96 - 8]
        assert feats.tokens[row, : int(feats.starts[row])].tolist() == ids
    calls = []
    with pytest.raises(KeyboardInterrupt):  # stopped after the first batch of 32 attempts
        prepare_own(talker, tmp_path / "stopped", lambda: calls.append(1) or len(calls) > 1)
    kept = json.loads((tmp_path / "stopped" / "data" / "own_prompts.json").read_text())["prompts"]
    assert 0 < len(kept) < 40 and kept == written[: len(kept)]
    resumed, _, _ = prepare_own(talker, tmp_path / "stopped")
    assert mx.array_equal(resumed.tokens, feats.tokens).item()  # seeded by (seed, the prompts so far)


def test_the_soft_label_loss_and_its_gradient_are_the_cross_entropy_to_the_targets_distribution(llama, tmp_path):
    """The soft-label loss (chained_loss, soft_labels=True) equals -sum(teacher *
    log_softmax(drafts)) over each depth's rows of chains that start in an answer, the teacher
    being the target's own distribution at the same position, each row weighted by the teacher's
    largest probability (TrainConfig.confidence_weighting), with the same gradient: written out
    here apart from chained_loss's row skipping (`first`) and padding cut."""
    engine, _, _ = llama
    feats, _, _ = run_prepare(llama, tmp_path / "out")
    target = TargetView.of(engine.model)
    batch = feats.rows(list(range(4)))
    config = TrainConfig(out=tmp_path, depth=3, soft_labels=True)
    mx.random.seed(3)
    drafter = Drafter(DrafterArgs.for_target(target, 64))
    drafter.vocab_ids = mx.arange(64, dtype=mx.int32)
    drafter.freeze(keys=["vocab_ids"])
    drafter.attach(target)

    def written_out(_):
        L = batch.tokens.shape[1]
        teacher = mx.softmax(drafter.sub_logits(batch.hidden[..., -drafter.args.hidden_size:]), axis=-1)
        total = 0.0
        for d, h in depth_outputs(drafter, batch, config.depth):
            t = mx.arange(d, L)  # the positions of this depth's rows; the chain starts at t - d + 1
            keep = (t[None, :] < batch.lengths[:, None]) & ((t - d + 1)[None, :] >= batch.starts[:, None])
            loss = -(teacher[:, d:] * nn.log_softmax(drafter.sub_logits(h), axis=-1)).sum(-1)
            loss = loss * teacher[:, d:].max(-1)  # confidence weighting: the target's top probability there
            total = total + losses.DEPTH_DECAY ** (d - 1) * (loss * keep).sum() / keep.sum()
        return total / sum(losses.DEPTH_DECAY ** (d - 1) for d in range(1, config.depth + 1))

    loss, grads = nn.value_and_grad(drafter, lambda b: chained_loss(drafter, b, config))(batch)
    want, want_grads = nn.value_and_grad(drafter, written_out)(batch)
    assert abs(loss.item() - want.item()) < 1e-4 * abs(want.item())
    flat, want_flat = dict(tree_flatten(grads)), dict(tree_flatten(want_grads))
    assert flat.keys() == want_flat.keys() and flat
    for name, g in flat.items():
        scale = mx.abs(want_flat[name]).max().item()
        assert scale > 0 and mx.abs(g - want_flat[name]).max().item() < 1e-3 * scale, name


def test_the_kept_labels_loss_through_numpy_is_the_mlx_expression_in_value_and_gradient():
    """On the CPU the kept-labels loss runs through numpy with its own gradient (MLX's CPU exp
    is scalar): the same values and gradient as the MLX expression, under a row weighting with
    zeros (the padding and the prompts' rows)."""
    mx.random.seed(0)
    logits = 3 * mx.random.normal((2, 5, 50))
    ids = mx.argsort(mx.random.uniform(shape=(2, 5, 50)), axis=-1)[..., :8].astype(mx.uint16)
    probs = mx.softmax(mx.random.normal((2, 5, 8)), axis=-1).astype(mx.float16)
    weights = mx.random.uniform(shape=(2, 5)) * (mx.arange(5) < 4)

    def expression(x):
        picked = mx.take_along_axis(x, ids, axis=-1)
        return ((mx.logsumexp(x, axis=-1) - (probs * picked).sum(-1)) * weights).sum()

    assert mx.default_device() == mx.cpu  # the numpy path is taken
    value, grad = mx.value_and_grad(lambda x: (losses.kept_labels_loss(x, ids, probs) * weights).sum())(logits)
    want, want_grad = mx.value_and_grad(expression)(logits)
    assert abs(value.item() - want.item()) < 1e-5 * abs(want.item())
    assert mx.allclose(grad, want_grad, atol=1e-6).item() and mx.abs(want_grad).max().item() > 0.01


def test_the_layers_silu_and_attention_through_numpy_are_mlx_s_in_value_and_gradient(llama, tmp_path):
    """Training on the CPU swaps the drafter layer's SiLU and attention for numpy_ops' (MLX's CPU
    exp is scalar): each equals MLX's op in value and gradient -- attention with grouped kv
    heads and a boolean mask -- and so does a depth-2 chained loss and its gradient through the
    drafter. (It fails on a SiLU gradient of the first row only, what a one-input custom
    function gives when its vjp reads primals[0].)"""
    from engines.cpu import numpy_ops

    mx.random.seed(0)
    q, k, v = mx.random.normal((2, 6, 5, 8)), mx.random.normal((2, 2, 7, 8)), mx.random.normal((2, 2, 7, 8))
    mask = mx.arange(7)[None, :] <= (mx.arange(5) + 2)[:, None]
    weights = mx.random.normal((8,))

    def attention_grads(op):
        f = lambda q, k, v: (op(q, k, v, scale=0.3, mask=mask) * weights).sum()  # noqa: E731
        return mx.value_and_grad(f, argnums=(0, 1, 2))(q, k, v)

    (value, grads), (want, want_grads) = attention_grads(numpy_ops.attention), \
        attention_grads(mx.fast.scaled_dot_product_attention)
    assert abs(value.item() - want.item()) < 1e-5 * abs(want.item())
    assert all(mx.allclose(g, w, atol=1e-5).item() for g, w in zip(grads, want_grads))
    x = 4 * mx.random.normal((3, 100))
    silu_grad = lambda op: mx.value_and_grad(lambda x: (op(x) * mx.arange(100)).sum())(x)  # noqa: E731
    (value, grad), (want, want_grad) = silu_grad(numpy_ops.silu), silu_grad(nn.silu)
    assert abs(value.item() - want.item()) < 1e-5 * abs(want.item())
    assert mx.allclose(grad, want_grad, rtol=1e-5, atol=1e-4).item()

    engine, _, _ = llama
    feats, _, _ = run_prepare(llama, tmp_path / "out")
    target = TargetView.of(engine.model)
    drafter = Drafter(DrafterArgs.for_target(target, 64))
    drafter.vocab_ids = mx.arange(64, dtype=mx.int32)
    drafter.freeze(keys=["vocab_ids"])
    drafter.attach(target)
    config = TrainConfig(out=tmp_path, depth=2, soft_labels=False)
    batch = feats.rows(list(range(4)))
    loss_grad = lambda: nn.value_and_grad(drafter, lambda b: chained_loss(drafter, b, config))(batch)  # noqa: E731
    want, want_grads = loss_grad()
    drafter.silu, drafter.attention = numpy_ops.silu, numpy_ops.attention
    value, grads = loss_grad()
    assert abs(value.item() - want.item()) < 1e-5 * abs(want.item())
    want_grads = dict(tree_flatten(want_grads))
    for name, g in tree_flatten(grads):
        scale = mx.abs(want_grads[name]).max().item()
        assert scale > 0 and mx.abs(g - want_grads[name]).max().item() < 1e-4 * scale, name


def test_soft_labels_kept_once_are_the_targets_top_k_and_give_the_every_step_loss_when_k_is_the_vocabulary(llama, tmp_path):
    """losses.teacher_top_k keeps, per position, the target's k most likely draft tokens and
    their renormalised probabilities; with k = the whole draft vocabulary, chained_loss on the
    kept labels equals (value and gradient) the loss that recomputes the distribution each step,
    and with k = 4 it is the cross-entropy to the top-4 distribution written out."""
    engine, _, _ = llama
    feats, _, _ = run_prepare(llama, tmp_path / "out")
    target = TargetView.of(engine.model)
    mx.random.seed(3)
    drafter = Drafter(DrafterArgs.for_target(target, 64))
    drafter.vocab_ids = mx.arange(64, dtype=mx.int32)
    drafter.freeze(keys=["vocab_ids"])
    drafter.attach(target)
    config = TrainConfig(out=tmp_path, depth=2, soft_labels=True)
    grad = lambda b: nn.value_and_grad(drafter, lambda bb: chained_loss(drafter, bb, config))(b)  # noqa: E731
    every_step = grad(feats.rows(list(range(4))))

    feats.teacher_ids, feats.teacher_probs = losses.teacher_top_k(drafter, feats, 64, batch=3)
    batch = feats.rows(list(range(4)))
    assert batch.teacher_ids.shape == (4, batch.tokens.shape[1], 64)
    kept = grad(batch)
    assert abs(kept[0].item() - every_step[0].item()) < 1e-3 * abs(every_step[0].item())
    want = dict(tree_flatten(every_step[1]))
    for name, g in tree_flatten(kept[1]):
        scale = mx.abs(want[name]).max().item()
        assert scale > 0 and mx.abs(g - want[name]).max().item() < 2e-2 * scale, name

    feats.teacher_ids, feats.teacher_probs = losses.teacher_top_k(drafter, feats, 4, batch=4)
    batch = feats.rows(list(range(4)))
    full = mx.softmax(drafter.sub_logits(batch.hidden[..., -drafter.args.hidden_size:]), axis=-1)
    top = mx.sort(full, axis=-1)[..., -4:]  # the 4 largest probabilities, renormalised
    assert mx.allclose(mx.sort(batch.teacher_probs, axis=-1), top / top.sum(-1, keepdims=True), atol=2e-3).item()
    teacher = mx.put_along_axis(mx.zeros_like(full), batch.teacher_ids, batch.teacher_probs, axis=-1)
    L = batch.tokens.shape[1]
    total = 0.0
    for d, h in depth_outputs(drafter, batch, config.depth):
        t = mx.arange(d, L)
        keep = (t[None, :] < batch.lengths[:, None]) & ((t - d + 1)[None, :] >= batch.starts[:, None])
        loss = -(teacher[:, d:] * nn.log_softmax(drafter.sub_logits(h), axis=-1)).sum(-1)
        loss = loss * batch.teacher_probs[:, d:].max(-1)  # confidence weighting: the top kept probability
        total = total + losses.DEPTH_DECAY ** (d - 1) * (loss * keep).sum() / keep.sum()
    want = total / (1 + losses.DEPTH_DECAY)
    assert abs(grad(batch)[0].item() - want.item()) < 1e-4 * abs(want.item())
