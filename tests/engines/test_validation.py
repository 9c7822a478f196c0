"""The one parameter check (engines.validation) that the CLI, the GUI and the server call:
every bad value is one EngineError line naming the parameter; good values pass."""

import math

import pytest

from engines.types import EngineError, Request, Sampling, SpecConfig
from engines.validation import InvalidParameter, validate


def request(max_tokens=16, stop=(), spec=None, **sampling):
    return Request(prompt="hi", max_tokens=max_tokens, stop=list(stop), spec=spec or SpecConfig(),
                   sampling=Sampling(**sampling))


BAD = {
    "temp nan": (request(temperature=math.nan), "temperature"),
    "temp inf": (request(temperature=math.inf), "temperature"),
    "temp negative": (request(temperature=-0.5), "temperature"),
    "top_p zero": (request(top_p=0.0), "top_p"),
    "top_p above one": (request(top_p=1.5), "top_p"),
    "top_p nan": (request(top_p=math.nan), "top_p"),
    "top_k negative": (request(top_k=-1), "top_k"),
    "top_k fractional": (request(top_k=2.5), "top_k"),
    "min_p negative": (request(min_p=-0.1), "min_p"),
    "seed negative": (request(seed=-1), "seed"),
    "seed too large": (request(seed=2**64), "seed"),
    "stop empty": (request(stop=[""]), "stop"),
    "max_tokens zero": (request(max_tokens=0), "max_tokens"),
    "steps above range": (request(spec=SpecConfig(method="ngram", steps=8)), "steps"),
    "steps negative": (request(spec=SpecConfig(method="ngram", steps=-1)), "steps"),
    "skip streak negative": (request(spec=SpecConfig(skip_streak=-2)), "skip_streak"),
    "ngram min above max": (request(spec=SpecConfig(ngram_min=5, ngram_max=2)), "ngram_min"),
    "unknown method": (request(spec=SpecConfig(method="magic")), "spec"),
}


@pytest.mark.parametrize("req,name", BAD.values(), ids=BAD.keys())
def test_bad_parameter_is_one_line_naming_it(req, name):
    with pytest.raises(InvalidParameter) as e:
        validate(req)
    assert isinstance(e.value, EngineError)  # every caller already turns these into one line
    assert e.value.name == name and str(e.value).startswith(name)
    assert "\n" not in str(e.value)


def test_max_tokens_beyond_the_context():
    validate(request(max_tokens=4000), context_length=4096)
    with pytest.raises(InvalidParameter, match="context of 4096"):
        validate(request(max_tokens=5000), context_length=4096)


@pytest.mark.parametrize("req", [
    request(),
    request(temperature=0.7, top_p=0.9, top_k=40, seed=0, stop=["\n\n"]),
    request(seed=2**64 - 1, spec=SpecConfig(method="ngram", steps=7, adaptive=True, min_steps=1, max_steps=7)),
])
def test_good_parameters_pass(req):
    validate(req, context_length=8192)
