"""GLM-OCR sequences read together (engines/glm_ocr/batch.py) on the tiny trained fixture: pages
with plain, MTP (k = 2 and 4) and n-gram drafting side by side in one batch, joining at different
steps, each get exactly their lone runs' tokens (T = 0) and the same drafts proposed and
accepted, round by round; a row that finishes or is cancelled leaves and the others go on; a
seeded request at T > 0 samples the same in a batch as alone, which rows sharing one RNG would
not (shown by making them share one). Core ML and its twin read one sequence at a time."""

import numpy as np
import pytest
import torch

from engines.types import EngineError, Request, Sampling, SpecConfig
from engines.glm_ocr import batch as batch_module
from engines.glm_ocr.batch import OcrBatch, Sampler
from engines.glm_ocr.engine import OcrEngine

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def engine(trained_glm_ocr):
    torch.set_num_threads(1)
    e = OcrEngine.load(trained_glm_ocr[0], runtime="torch", cache_length=320)
    e.repetition = None  # random tiny models loop; the guard has its own test
    return e


@pytest.fixture(scope="module")
def images(trained_glm_ocr):
    return trained_glm_ocr[1]  # image 2's page ends after two tokens: a row that finishes early


def request(image, method="off", steps=0, max_tokens=MAX_TOKENS, **kw) -> Request:
    return Request(kind="ocr", image=str(image), max_tokens=max_tokens, spec=SpecConfig(method=method, steps=steps), **kw)


def tokens(rounds) -> list[int]:
    return [t for r in rounds for t in r.tokens]


def drafts(rounds) -> list[tuple[int, int]]:
    """Each round's drafts proposed and accepted."""
    return [(r.proposed, r.accepted) for r in rounds]


def read_together(batch: OcrBatch, plan: dict[int, list[Request]], stops: dict[int, object] | None = None):
    """Submit plan[n]'s requests before step n, step until the batch is idle. Returns the rounds
    of each request in plan order, and the batch's size after each step."""
    stops = stops or {}
    seqs, rounds, sizes, n = [], {}, [], 0
    while n <= max(plan) or batch.busy:
        for req in plan.get(n, []):
            seqs.append(batch.submit(req, stops.get(len(seqs))))
        for seq, rnd in batch.step():
            rounds.setdefault(seq.id, []).append(rnd)
        sizes.append(batch.size)
        n += 1
    return [rounds[s.id] for s in seqs], sizes


def test_rows_joining_at_different_steps_get_their_lone_tokens_and_drafts(engine, images, monkeypatch):
    together_asked = []  # the MTP rows of each step, drafting together (engine.MtpGroup)
    propose_rows = engine.mtp_group.propose_rows
    monkeypatch.setattr(engine.mtp_group, "propose_rows",
                        lambda cache, asks: together_asked.append(len(asks)) or propose_rows(cache, asks))
    plan = {0: [request(images[0]), request(images[1], "mtp", 2), request(images[3], "mtp", 4)],
            2: [request(images[0], "ngram", 3), request(images[1], "mtp", 4)],
            5: [request(images[3], "ngram", 3), request(images[0], "mtp", 2), request(images[2], "mtp", 4)]}
    together, sizes = read_together(OcrBatch(engine), plan)
    requests = [r for step in sorted(plan) for r in plan[step]]
    mtp = [0, 0]
    for req, got in zip(requests, together):
        alone = list(engine.generate(req))
        assert tokens(got) == tokens(alone)
        assert drafts(got) == drafts(alone)
        if req.spec.method == "mtp":
            mtp = [mtp[0] + sum(r.accepted for r in got), mtp[1] + sum(r.proposed for r in got)]
    assert max(sizes) == 7  # seven rows after a step of eight (image 2's page ends in the step it joins)
    assert max(together_asked) == 5
    # the trained MTP layer's drafts: accepted often, not always (rejections roll rows back)
    assert 0.3 * mtp[1] < mtp[0] < mtp[1], mtp


def test_a_finished_or_cancelled_row_leaves_and_the_others_go_on(engine, images):
    cancel = []
    plan = {0: [request(images[0], "mtp", 4, max_tokens=10), request(images[1], "mtp", 2),
                request(images[3], "ngram", 3), request(images[0], "mtp", 2)]}
    batch = OcrBatch(engine)
    stops = {1: lambda: bool(cancel)}
    seqs = [batch.submit(req, stops.get(i)) for i, req in enumerate(plan[0])]
    rounds = {s.id: [] for s in seqs}
    for n in range(100):
        if n == 4:
            cancel.append(True)
        for seq, rnd in batch.step():
            rounds[seq.id].append(rnd)
        if n == 4:  # the cancelled row's Round says so, and its row is gone within the step
            assert rounds[seqs[1].id][-1].finish == "cancelled" and seqs[1] not in batch.running
        if not batch.busy:
            break
    assert not batch.busy and batch.size == 0
    short, cancelled, *others = [rounds[s.id] for s in seqs]
    assert short[-1].finish == "length" and tokens(short) == tokens(engine.generate(plan[0][0]))
    alone = tokens(engine.generate(plan[0][1]))
    assert 0 < len(tokens(cancelled)) < len(alone) and tokens(cancelled) == alone[: len(tokens(cancelled))]
    for req, got in zip(plan[0][2:], others):
        assert tokens(got) == tokens(engine.generate(req)) and got[-1].finish in ("length", "stop")


def test_a_page_done_at_its_first_token_or_cancelled_while_waiting_takes_no_row(engine, images):
    batch = OcrBatch(engine, max_batch=1)
    running = batch.submit(request(images[0], "mtp", 2, max_tokens=6))
    one = batch.submit(request(images[1], max_tokens=1))
    gone = batch.submit(request(images[3]), should_stop=lambda: True)
    reported = {s.id: [] for s in (running, one, gone)}
    while batch.busy:
        for seq, rnd in batch.step():
            reported[seq.id].append(rnd)
        assert batch.size <= 1
    assert [r.finish for r in reported[gone.id]] == ["cancelled"] and not reported[gone.id][0].tokens
    assert [r.finish for r in reported[one.id]] == ["length"] and len(reported[one.id][0].tokens) == 1
    assert tokens(reported[running.id]) == tokens(engine.generate(request(images[0], "mtp", 2, max_tokens=6)))


def sampled(image, seed) -> Request:
    return request(image, "mtp", 3, max_tokens=24, sampling=Sampling(temperature=0.5, top_k=3, seed=seed))


def seeded_rows_match(engine, images) -> bool:
    """Three seeded sampled requests and a greedy one, joining at different steps: does each
    get, in the batch, the tokens it gets alone?"""
    plan = {0: [sampled(images[0], 1), request(images[1], "mtp", 2, max_tokens=24)],
            1: [sampled(images[1], 2)], 3: [sampled(images[3], 3)]}
    together, _ = read_together(OcrBatch(engine), plan)
    requests = [r for step in sorted(plan) for r in plan[step]]
    return all(tokens(got) == tokens(engine.generate(req)) for req, got in zip(requests, together))


def test_a_seeded_request_samples_the_same_in_a_batch_as_alone(engine, images):
    assert seeded_rows_match(engine, images)
    again = [tokens(engine.generate(sampled(images[0], 1))) for _ in range(2)]
    assert again[0] == again[1] and len(again[0]) > 8


def test_rows_sharing_one_rng_would_not(engine, images, monkeypatch):
    """The check above has the power to see a shared RNG: with every row drawing from one
    generator (seeded from the first request), some seeded request's tokens change."""
    shared = []

    def one_rng(request):
        sampler = Sampler(request.sampling)
        if not shared:
            shared.append(sampler.rng)
        sampler.rng = shared[0]
        return sampler

    monkeypatch.setattr(batch_module, "row_sampler", one_rng)
    assert not seeded_rows_match(engine, images)


def test_generate_is_a_batch_of_one(engine, images):
    req = request(images[3], "mtp", 4)
    got, alone = list(OcrBatch(engine).generate(req)), list(engine.generate(req))
    assert tokens(got) == tokens(alone) and drafts(got) == drafts(alone)
    assert got[0].prefill and got[-1].finish == alone[-1].finish
    with pytest.raises(EngineError):
        OcrBatch(engine).submit(request(images[0], "mtp", 9))  # steps above the contract's 7: refused at submit


def test_core_ml_twin_reads_one_sequence_at_a_time(trained_glm_ocr, images):
    twin = OcrEngine.load(trained_glm_ocr[0], runtime="coreml-twin", cache_length=320)
    twin.repetition = None
    batch = OcrBatch(twin, max_batch=8)
    assert batch.max_batch == 1
    plan = {0: [request(images[0], "mtp", 2, max_tokens=16), request(images[1], "mtp", 4, max_tokens=16)]}
    together, sizes = read_together(batch, plan)
    assert max(sizes) == 1
    for req, got in zip(plan[0], together):
        alone = list(twin.generate(req))
        assert tokens(got) == tokens(alone) and drafts(got) == drafts(alone)
        assert np.mean([r.accepted for r in got[1:]]) > 0


def test_a_batched_forward_of_ragged_rows_is_each_rows_own_forward(engine, images):
    """runtime_fast.BatchKV: two prompts prefilled alone and joined; one forward of a 3-input
    row beside a 1-input row (right-padded) gives each row the hidden states its own forward
    gives, and after the rows keep 2 and 1 inputs the next forward still does (the padding's
    and the dropped input's slots are overwritten, never read)."""
    from engines.glm_ocr.positions import text_rope
    from engines.glm_ocr.runtime_fast import BatchKV

    rt, text = engine.runtime, engine.config.text
    prompts = [engine.sequence(request(image))[1] for image in images[:2]]
    kv, alone = BatchKV(), []
    for prompt in prompts:
        _, cache = rt.prefill(prompt.embeds, *text_rope(prompt.positions.rows(0, len(prompt.ids)), text))
        kv.join(cache, len(prompt.ids))
        alone.append(cache)
    starts = [len(p.ids) for p in prompts]
    for inputs, kept in (([[5, 6, 7], [9]], [2, 1]), ([[11], [12, 13]], [1, 2])):
        width = max(map(len, inputs))
        ropes = [text_rope(p.positions.rows(s, width), text) for p, s in zip(prompts, starts)]
        padded = [r + [r[-1]] * (width - len(r)) for r in inputs]
        got = rt.decode_rows(kv, rt.embeddings[np.asarray(padded)], np.stack([c for c, _ in ropes]),
                             np.stack([s for _, s in ropes]))
        for b, (row, prompt, start, cache) in enumerate(zip(inputs, prompts, starts, alone)):
            cos, sin = text_rope(prompt.positions.rows(start, len(row)), text)
            own = rt.decode(rt.embeddings[np.asarray(row)], start, cos, sin, cache)
            assert np.allclose(got[b, : len(row)], own, atol=1e-5)
        kv.settle(kept)
        starts = [s + k for s, k in zip(starts, kept)]
    kv.select([1])
    assert kv.rows == 1 and kv.lengths == [starts[1]]


@pytest.mark.slow
def test_published_shapes_regions_read_together_get_their_lone_tokens(tmp_path):
    """The published shapes (random weights, float32; tests/engines/glm_ocr/published_shape.py):
    four regions of a text page -- plain, MTP at 2 and 4, n-gram -- two joining later, each get
    the tokens of their lone runs. About a minute and 6 GB."""
    from PIL import Image

    from tests.engines.glm_ocr.checkpoints import cache_root
    from tests.engines.glm_ocr.published_shape import fixture_page, make_published_shape_glm_ocr

    path = make_published_shape_glm_ocr(cache_root() / "glm-ocr-published-shape")
    page = Image.open(fixture_page(tmp_path / "page.png"))
    crops = []
    for i, box in enumerate([(0, 0, 448, 112), (0, 112, 448, 168), (0, 168, 224, 336), (224, 168, 448, 336)]):
        crops.append(tmp_path / f"region-{i}.png")
        page.crop(box).save(crops[-1])
    engine = OcrEngine.load(path, runtime="torch", dtype="float32", cache_length=1024)
    engine.config.eos_token_ids = []  # random weights: a fixed number of tokens each
    engine.repetition = None
    plan = {0: [request(crops[0], max_tokens=8), request(crops[1], "mtp", 2, max_tokens=8)],
            2: [request(crops[2], "mtp", 4, max_tokens=8), request(crops[3], "ngram", 3, max_tokens=8)]}
    together, sizes = read_together(OcrBatch(engine), plan)
    assert max(sizes) == 4
    for req, got in zip([r for step in sorted(plan) for r in plan[step]], together):
        alone = list(engine.generate(req))
        assert tokens(got) == tokens(alone) and len(tokens(got)) == 8
        assert drafts(got) == drafts(alone)
