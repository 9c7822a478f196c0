"""Chained MTP drafts (issue 17): the engine's acceptance at every depth 1..7 equals that of an
independent loop written on transformers' modules under the convention of
docs/glm-ocr-mtp-convention.md (tests/engines/glm_ocr/reference_loop.py), within 3 percentage
points, with the tests' MTP layer trained for chains -- and both stay lossless.

A convention the engine got wrong (positions, the hidden state a chain continues from, the
image rows of the MTP cache, what a rejection leaves behind) changes the drafts and with them
the acceptance at depth; the two loops share no code, only the checkpoint."""

import pytest
from PIL import Image

from engines.types import Request, SpecConfig
from engines.glm_ocr.engine import OcrEngine
from tests.engines.glm_ocr.reference_loop import ReferenceLoop

MAX_TOKENS = 48
IMAGES = 2


@pytest.fixture(scope="module")
def loops(trained_glm_ocr):
    path, images = trained_glm_ocr
    engine = OcrEngine.load(path, runtime="torch", cache_length=320)
    engine.repetition = None  # the reference loop has no repetition guard
    reference = ReferenceLoop(path)
    plain = {image: reference.run(Image.open(image), 0, MAX_TOKENS).tokens for image in images[:IMAGES]}
    return engine, reference, plain


def engine_run(engine, image, steps):
    request = Request(kind="ocr", image=str(image), max_tokens=MAX_TOKENS, spec=SpecConfig(method="mtp", steps=steps))
    rounds = list(engine.generate(request))
    return [t for r in rounds for t in r.tokens], [(r.proposed, r.accepted) for r in rounds if not r.prefill]


@pytest.mark.parametrize("steps", range(1, 8))
def test_acceptance_at_each_depth_equals_the_reference_loop(loops, steps):
    engine, reference, plain = loops
    ours, theirs = [0, 0], [0, 0]
    for image, expected in plain.items():
        tokens, rounds = engine_run(engine, image, steps)
        ref = reference.run(Image.open(image), steps, MAX_TOKENS)
        assert tokens == expected and ref.tokens == expected  # both lossless
        for total, counts in ((ours, rounds), (theirs, ref.rounds)):
            total[0] += sum(p for p, _ in counts)
            total[1] += sum(a for _, a in counts)
    assert ours[0] > 0 and theirs[0] > 0
    rate, reference_rate = ours[1] / ours[0], theirs[1] / theirs[0]
    print(f"steps {steps}: engine {ours[1]}/{ours[0]} = {rate:.3f}, reference {theirs[1]}/{theirs[0]} = {reference_rate:.3f}")
    assert abs(rate - reference_rate) <= 0.03, (ours, theirs)
