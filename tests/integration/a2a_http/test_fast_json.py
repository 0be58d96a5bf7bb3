"""The SDK's HTTP routes read and write JSON faster, and exactly as before.

``gateway/server/a2a_http/fast_json.py`` swaps the classes the a2a-sdk's route
modules answer with and the request the edge hands them: responses must be the
bytes Starlette's ``JSONResponse`` writes (or fail the same way), request
bodies the values ``json.loads`` makes (or fail the same way), and the SDK must
still have the names swapped (an SDK upgrade that renames them fails here,
not silently slower).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from a2a.server.routes import jsonrpc_dispatcher, rest_dispatcher
from starlette.responses import JSONResponse

from gateway.runtime.agent import Agent
from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH
from gateway.server.a2a_http.fast_json import CompactJsonResponse, json_value
from tests.a2a_http_support import V1_HEADERS, https_client, jsonrpc, message_params
from tests.support import Pki

ODD_VALUES: list[Any] = [
    {"text": "x" * 70_000},
    {"é": "ü€😀", "ctl": "\x00\x1f\x7f\u2028", "order": {"b": 1, "a": 2}},
    {"float": 1e-07, "big": 1e16, "tenth": 0.1, "neg": -0.0},
    {"huge": 2**64, "small": -(2**63) - 1, "max": 2**63 - 1},
    {1: "int key"},
    [{"nested": [[[[]]]]}, None, True, False, ""],
    {"tuple": (1, 2)},
]


@pytest.mark.parametrize("value", ODD_VALUES, ids=range(len(ODD_VALUES)))
def test_a_response_body_is_what_jsonresponse_writes(value: Any) -> None:
    assert CompactJsonResponse(value).body == JSONResponse(value).body


@pytest.mark.parametrize("value", [{"x": math.nan}, {"x": math.inf}, {"x": "\ud800"}])
def test_a_response_fails_as_jsonresponse_does(value: Any) -> None:
    with pytest.raises(Exception) as ours:
        CompactJsonResponse(value)
    with pytest.raises(Exception) as theirs:
        JSONResponse(value)
    assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


BODIES: list[bytes] = [
    *(json.dumps(value, ensure_ascii=False).encode() for value in ODD_VALUES[:4]),
    b"123456789012345678901234567890",  # orjson would make it a float
    b'{"n": 123456789012345678901234567890, "s": "x"}',
    b'{"x": NaN, "y": Infinity, "z": -Infinity}',  # json accepts them, orjson does not
    b'"\\ud800"',  # a lone surrogate: json keeps it
    b"\xef\xbb\xbf{}",  # a BOM: json.loads of bytes skips it
    b'{"a": 1, "a": 2}',
    b'{"a": 1, "b": 0, "a": 2}',  # a repeated key keeps its first place
    b'{"e": "\\ud83d\\ude00", "\\u00e9": "\\u2028"}',  # escaped pairs and non-ASCII keys
    b"1e400",
    b'  {"spaced" : [ 1 , 2 ] }  ',
]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_a_request_body_is_the_value_json_loads_makes(body: bytes) -> None:
    ours, theirs = json_value(body), json.loads(body)
    assert repr(ours) == repr(theirs)  # repr: NaN != NaN, and 1 == 1.0 would hide a float


@pytest.mark.parametrize(
    "body", [b"", b"{", b"not json", b'{"a": 1,}', b"\xff\xfe", b"[" * 100_000, b'"\x01"']
)
def test_a_request_body_fails_as_json_loads_does(body: bytes) -> None:
    with pytest.raises(Exception) as ours:
        json_value(body)
    with pytest.raises(Exception) as theirs:
        json.loads(body)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


def test_random_request_bodies_decode_alike() -> None:
    rng = random.Random(5)
    leaves = [0, -1, 2**70, 1.5, 1e300, "s", "é😀", True, None, "", 10**18, -(10**19)]
    for _ in range(500):
        value = {str(n): [rng.choice(leaves) for _ in range(rng.randint(0, 4))] for n in range(3)}
        body = json.dumps(value).encode()
        assert repr(json_value(body)) == repr(json.loads(body))


def test_the_sdk_routes_answer_through_the_fast_classes(alice: Agent) -> None:
    assert alice.https_url  # the edge has built its app
    assert jsonrpc_dispatcher.JSONResponse is CompactJsonResponse  # type: ignore[attr-defined]
    rest_class = rest_dispatcher.A2AJSONResponse  # type: ignore[attr-defined]
    assert rest_class.render is not JSONResponse.render


async def test_answers_on_both_bindings_are_jsonresponse_bytes(pki: Pki, alice: Agent) -> None:
    params = message_params("text.echo", {"text": "é" * 5000})
    async with https_client(pki, "carol") as client:  # bob's cap is 1 KB
        rpc = await client.post(
            alice.https_url + JSONRPC_PATH, json=jsonrpc("SendMessage", params), headers=V1_HEADERS
        )
        params["message"]["messageId"] = "m-rest"
        rest = await client.post(
            alice.https_url + REST_PATH + "/message:send", json=params, headers=V1_HEADERS
        )
    for response in (rpc, rest):
        assert response.status_code == 200
        assert response.content == JSONResponse(json.loads(response.content)).body
    assert rpc.json()["result"]["task"]["artifacts"][0]["parts"][0]["data"] == {"text": "é" * 5000}
    # The SDK's A2AJSONResponse made it (its bytes above), relabelled as spec 1.0.0 says.
    assert rest_dispatcher.A2AJSONResponse.media_type == "application/a2a+json"  # type: ignore[attr-defined]
    assert rest.headers["content-type"] == "application/json"
