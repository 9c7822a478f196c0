"""A request's repetition stop: the server's `--max-repeat` (ServedModel.max_repeat) unless the
request says `max_repeat` itself (0 turns it off), checked as every parameter is."""

from __future__ import annotations

import pytest

from app.serve.protocol import ApiError, ServedModel, parse_chat_request

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_the_servers_max_repeat_reaches_the_request_unless_it_says_its_own():
    models = {"m": ServedModel("m", "chat", max_repeat=7)}
    assert parse_chat_request(BODY, models).request.max_repeat == 7
    assert parse_chat_request(BODY | {"max_repeat": 0}, models).request.max_repeat == 0
    with pytest.raises(ApiError) as refused:
        parse_chat_request(BODY | {"max_repeat": 1}, models)
    assert refused.value.status == 400 and "max_repeat" in str(refused.value)
