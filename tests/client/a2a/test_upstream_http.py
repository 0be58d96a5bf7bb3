"""Answers of a JSON-RPC upstream: decoded within the ceiling, exactly at its edge.

The transport is exercised over real HTTP (a bare server on 127.0.0.1); the
decoding function is checked on its own at the boundary for every coding it
undoes.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import httpx
import pytest

from gateway.client.a2a.upstream_answers import UnreadableAnswer, check_jsonrpc_answer
from gateway.client.a2a.upstream_http import BoundedTransport, decoded
from tests.helpers.a2a_hostile_upstream import RawHttpUpstream, http_response, raw_http_upstream

LIMIT = 64 * 1024


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


CODINGS: dict[str, tuple[Callable[[bytes], bytes], list[str]]] = {
    "identity": (lambda data: data, []),
    "gzip": (gzip.compress, ["gzip"]),
    "x-gzip": (gzip.compress, ["x-gzip"]),
    "deflate (zlib)": (zlib.compress, ["deflate"]),
    "deflate (raw)": (_raw_deflate, ["deflate"]),
    "gzip, gzip": (lambda data: gzip.compress(gzip.compress(data)), ["gzip", "gzip"]),
    "deflate, gzip": (lambda data: gzip.compress(zlib.compress(data)), ["deflate", " GZIP "]),
}


@pytest.mark.parametrize(("encode", "codings"), CODINGS.values(), ids=CODINGS.keys())
def test_decoding_stops_at_the_limit(encode: Callable[[bytes], bytes], codings: list[str]) -> None:
    at_limit = b"a" * LIMIT
    assert decoded(encode(at_limit), codings, LIMIT) == at_limit
    with pytest.raises(UnreadableAnswer, match="size limit"):
        decoded(encode(at_limit + b"a"), codings, LIMIT)


@pytest.mark.parametrize(
    ("body", "codings"),
    [
        (b"not gzip at all", ["gzip"]),
        (gzip.compress(b"x" * 100)[:-8], ["gzip"]),  # truncated trailer
        (gzip.compress(b"x") + b"trailing", ["gzip"]),
        (b"x", ["br"]),
        (b"x", ["zstd"]),
        (b"x", ["gzip", "gzip", "gzip"]),
    ],
    ids=["corrupt", "truncated", "trailing bytes", "br", "zstd", "three layers"],
)
def test_undecodable_bodies_are_refused(body: bytes, codings: list[str]) -> None:
    with pytest.raises(UnreadableAnswer):
        decoded(body, codings, LIMIT)


async def _through_transport(raw: bytes) -> httpx.Response:
    fake = RawHttpUpstream(lambda rid: raw)
    async with raw_http_upstream(fake) as url:
        transport = BoundedTransport(httpx.AsyncHTTPTransport(retries=0), limit=LIMIT)
        async with httpx.AsyncClient(transport=transport) as client:
            return await client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "x"})


def _answer_of_size(size: int) -> bytes:
    frame = b'{"jsonrpc":"2.0","id":1,"result":{"message":{"parts":[{"text":""}]}}}'
    text = b"a" * (size - len(frame))
    return frame.replace(b'"text":""', b'"text":"' + text + b'"')


async def test_the_transport_hands_on_an_inflated_answer_of_exactly_the_limit() -> None:
    body = _answer_of_size(LIMIT)
    answer = await _through_transport(
        http_response(gzip.compress(body), headers={"Content-Encoding": "gzip"})
    )
    assert answer.status_code == 200
    assert answer.content == body
    assert "content-encoding" not in answer.headers  # httpx must not decode it again


async def test_the_transport_refuses_an_inflated_answer_one_byte_over() -> None:
    body = _answer_of_size(LIMIT + 1)
    with pytest.raises(UnreadableAnswer, match="size limit"):
        await _through_transport(
            http_response(gzip.compress(body), headers={"Content-Encoding": "gzip"})
        )


async def test_an_error_status_is_decoded_but_not_shape_checked() -> None:
    answer = await _through_transport(
        http_response(
            gzip.compress(b"<html>busy</html>"),
            status="503 Busy",
            headers={"Content-Encoding": "gzip"},
        )
    )
    assert (answer.status_code, answer.content) == (503, b"<html>busy</html>")


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t"}}}',
        b'{"jsonrpc":"2.0","id":1,"result":{"message":{}}}',
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"no"}}',
    ],
)
def test_jsonrpc_answers_of_the_right_shape_pass(body: bytes) -> None:
    check_jsonrpc_answer(body)
