"""Stop strings across rounds with n-gram and draft-model speculation: see tests/engines/stop_cases.py.
On the code before engines/speculative/stops.py this failed: plain decoding showed the head of
a multi-token stop string, speculation (the whole string in one burst) did not."""

from engines.types import Request, SpecConfig
from tests.engines.stop_cases import check_stop_strings

PROMPT = "the cat is big and the dog is small . the cat is big and the dog is small ."


def runner(engine, spec):
    return lambda stop: list(engine.generate(Request(prompt=PROMPT, max_tokens=40, stop=stop, spec=spec)))


def test_stop_strings_across_rounds(engines):
    engine = engines["llama"]
    check_stop_strings(
        runner(engine, SpecConfig()),
        {
            "ngram": runner(engine, SpecConfig(method="ngram", steps=4)),
            "draft": runner(engine, SpecConfig(method="draft", steps=3)),
        },
    )
