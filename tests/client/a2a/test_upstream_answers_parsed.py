"""A JSON-RPC upstream's answer is parsed once: by its shape check, handed on to the SDK."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.client.a2a.upstream_answers import UnreadableAnswer, check_jsonrpc_answer
from gateway.client.a2a.upstream_http import BoundedTransport, CheckedResponse
from tests.helpers.a2a_hostile_upstream import RawHttpUpstream, http_response, raw_http_upstream

TASK_ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","status":{}}}}'


async def _through_transport(raw: bytes) -> httpx.Response:
    fake = RawHttpUpstream(lambda rid: raw)
    async with raw_http_upstream(fake) as url:
        transport = BoundedTransport(httpx.AsyncHTTPTransport(retries=0))
        async with httpx.AsyncClient(transport=transport) as client:
            return await client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "x"})


def test_the_check_returns_what_it_parsed() -> None:
    assert check_jsonrpc_answer(TASK_ANSWER) == json.loads(TASK_ANSWER)
    error = b'{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"no"}}'
    assert check_jsonrpc_answer(error) == json.loads(error)
    with pytest.raises(UnreadableAnswer):
        check_jsonrpc_answer(b'{"jsonrpc":"2.0","id":1,"result":{"neither":{}}}')


async def test_a_checked_answer_is_handed_on_parsed_not_parsed_again() -> None:
    answer = await _through_transport(http_response(TASK_ANSWER))
    assert isinstance(answer, CheckedResponse)
    assert answer.status_code == 200 and answer.content == TASK_ANSWER
    parsed = answer.json()
    assert parsed == json.loads(TASK_ANSWER)
    assert answer.json() is parsed  # the check's object, not a second parse


async def test_an_unchecked_answer_is_parsed_as_usual() -> None:
    answer = await _through_transport(http_response(b"<html>busy</html>", status="503 Busy"))
    assert answer.status_code == 503
    with pytest.raises(ValueError):
        answer.json()
    ok = await _through_transport(http_response(TASK_ANSWER))
    reparsed = ok.json(parse_float=str)  # options: a parse of its own
    assert reparsed == ok.json() and reparsed is not ok.json()
