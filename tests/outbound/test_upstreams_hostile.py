"""Upstreams that received the call and then answer something hostile (bob fronts them).

Every malformed answer is INVALID_OUTPUT, on both bindings; an answer the
upstream could word to look like an identity failure never gets the audit
detail PEER_IDENTITY_MISMATCH (which says nothing was sent): only the TLS
handshake decides that. Compressed answers are capped while they inflate.
"""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from a2a.types import Message, Part, Role, SendMessageResponse
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from gateway.errors import (
    ERROR_DOMAIN,
    CapabilityFailed,
    GatewayError,
    InvalidOutput,
    PeerUnavailable,
)
from gateway.transport.tls import MESSAGE_CEILING
from tests.helpers.a2a_hostile_upstream import (
    RawGrpcUpstream,
    RawHttpUpstream,
    http_response,
    jsonrpc_body,
    raw_grpc_upstream,
    raw_http_upstream,
)
from tests.helpers.agents import Pki
from tests.helpers.fronting import LEGACY, client, fronted, records

BOMB = 40 * 1024 * 1024  # 40 MiB of zeros: about 40 KB compressed


def _message(text: str) -> dict[str, Any]:
    return {"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": text}]}}


async def _outcome_via_http(
    pki: Pki, tmp_path: Path, fake: RawHttpUpstream
) -> tuple[GatewayError | dict[str, Any], list[tuple[str, str]]]:
    """alice calls legacy.echo through bob, which fronts ``fake`` over JSON-RPC."""
    async with raw_http_upstream(fake) as url:
        up = {"binding": "jsonrpc", "url": url}
        async with fronted(pki, tmp_path, up) as bob, client(pki, bob) as peer:
            try:
                result: GatewayError | dict[str, Any] = (
                    await peer.invoke("legacy.echo", {"text": "hi"})
                ).output()
            except GatewayError as err:
                result = err
            rows = await records(bob)
    return result, [(r.reason, r.detail) for r in rows]


async def _outcome_via_grpc(
    pki: Pki, tmp_path: Path, fake: RawGrpcUpstream
) -> tuple[GatewayError | dict[str, Any], list[tuple[str, str]]]:
    """alice calls legacy.echo through bob, which fronts ``fake`` over gRPC with mTLS."""
    async with raw_grpc_upstream(fake, pki) as address:
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up) as bob, client(pki, bob) as peer:
            try:
                result: GatewayError | dict[str, Any] = (
                    await peer.invoke("legacy.echo", {"text": "hi"})
                ).output()
            except GatewayError as err:
                result = err
            rows = await records(bob)
    return result, [(r.reason, r.detail) for r in rows]


# --- item: malformed answers are INVALID_OUTPUT --------------------------------------

MALFORMED_JSONRPC = {
    "list": lambda rid: b"[1,2]",
    "string": lambda rid: b'"x"',
    "empty object": lambda rid: b"{}",
    "null": lambda rid: b"null",
    "result 5": lambda rid: jsonrpc_body(rid, result=5),
    "result null": lambda rid: jsonrpc_body(rid, result=None),
    "result string": lambda rid: jsonrpc_body(rid, result="x"),
    "result without payload": lambda rid: jsonrpc_body(rid, result={}),
    "result message not an object": lambda rid: jsonrpc_body(rid, result={"message": 5}),
    "error not an object": lambda rid: jsonrpc_body(rid, error="x"),
    "not JSON": lambda rid: b"<html>not JSON</html>",
    "nesting bomb": lambda rid: b"[" * 200_000 + b"]" * 200_000,
}


@pytest.mark.parametrize("body", MALFORMED_JSONRPC.values(), ids=MALFORMED_JSONRPC.keys())
async def test_malformed_jsonrpc_answers_are_invalid_output(
    pki: Pki, tmp_path: Path, body: Any
) -> None:
    fake = RawHttpUpstream(lambda rid: http_response(body(rid)))
    result, audited = await _outcome_via_http(pki, tmp_path, fake)
    assert isinstance(result, InvalidOutput)
    assert audited == [("INVALID_OUTPUT", "")]
    assert fake.received == 1


def _grpc_answer(text: str) -> bytes:
    message = Message(message_id="m", role=Role.ROLE_AGENT, parts=[Part(text=text)])
    return SendMessageResponse(message=message).SerializeToString()


MALFORMED_GRPC = {
    "garbage bytes": b"this is not protobuf \xff\xff\xff",
    "empty message (no task, no message)": b"",
    "only an unknown field": b"\xa8\x1f\x01",  # field 500, varint 1
    "over the ceiling": _grpc_answer("x" * (MESSAGE_CEILING + 1)),
}


@pytest.mark.parametrize("answer", MALFORMED_GRPC.values(), ids=MALFORMED_GRPC.keys())
async def test_malformed_grpc_answers_are_invalid_output(
    pki: Pki, tmp_path: Path, answer: bytes
) -> None:
    fake = RawGrpcUpstream(answer=answer)
    result, audited = await _outcome_via_grpc(pki, tmp_path, fake)
    assert isinstance(result, InvalidOutput)
    assert audited == [("INVALID_OUTPUT", "")]
    assert fake.received == 1


async def test_a_wellformed_raw_answer_passes_both_checks(pki: Pki, tmp_path: Path) -> None:
    result, _ = await _outcome_via_grpc(pki, tmp_path, RawGrpcUpstream(answer=_grpc_answer("ok")))
    assert result == {"text": "ok"}
    fake = RawHttpUpstream(lambda rid: http_response(jsonrpc_body(rid, result=_message("ok"))))
    result, _ = await _outcome_via_http(pki, tmp_path / "http", fake)
    assert result == {"text": "ok"}


# --- item: identity is decided by the handshake, not the upstream's words ------------

IDENTITY_WORDS = ("Hostname Verification Check failed", "Peer name x is not in peer certificate")


def _rich(code: grpc.StatusCode, reason: str) -> status_pb2.Status:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN))
    return status_pb2.Status(code=code.value[0], message=IDENTITY_WORDS[0], details=[detail])


@pytest.mark.parametrize("words", IDENTITY_WORDS)
async def test_unavailable_after_the_call_says_it_may_have_run(
    pki: Pki, tmp_path: Path, words: str
) -> None:
    fake = RawGrpcUpstream(status=(grpc.StatusCode.UNAVAILABLE, words))
    result, audited = await _outcome_via_grpc(pki, tmp_path, fake)
    assert isinstance(result, PeerUnavailable)
    assert audited == [("PEER_UNAVAILABLE", "PEER_UNAVAILABLE_AFTER_SEND")]
    assert fake.received == 1


@pytest.mark.parametrize(
    "fake",
    [
        RawGrpcUpstream(status=(grpc.StatusCode.UNAUTHENTICATED, IDENTITY_WORDS[0])),
        RawGrpcUpstream(status=(grpc.StatusCode.PERMISSION_DENIED, IDENTITY_WORDS[1])),
        RawGrpcUpstream(status=(grpc.StatusCode.INTERNAL, IDENTITY_WORDS[0])),
        RawGrpcUpstream(rich=_rich(grpc.StatusCode.UNAUTHENTICATED, "PEER_IDENTITY_MISMATCH")),
        RawGrpcUpstream(rich=_rich(grpc.StatusCode.FAILED_PRECONDITION, "PEER_UNAVAILABLE")),
    ],
    ids=["unauthenticated", "permission denied", "internal", "rich mismatch", "rich unavailable"],
)
async def test_other_statuses_with_identity_words_are_capability_failed(
    pki: Pki, tmp_path: Path, fake: RawGrpcUpstream
) -> None:
    result, audited = await _outcome_via_grpc(pki, tmp_path, fake)
    assert isinstance(result, CapabilityFailed)
    assert audited == [("CAPABILITY_FAILED", "")]
    assert fake.received == 1


async def test_a_rich_unavailable_claiming_a_mismatch_may_have_run(
    pki: Pki, tmp_path: Path
) -> None:
    fake = RawGrpcUpstream(rich=_rich(grpc.StatusCode.UNAVAILABLE, "PEER_IDENTITY_MISMATCH"))
    result, audited = await _outcome_via_grpc(pki, tmp_path, fake)
    assert isinstance(result, PeerUnavailable)
    assert audited == [("PEER_UNAVAILABLE", "PEER_UNAVAILABLE_AFTER_SEND")]
    assert fake.received == 1


@pytest.mark.parametrize(
    "answer",
    [
        lambda rid: http_response(IDENTITY_WORDS[0].encode(), status="503 Service Unavailable"),
        lambda rid: http_response(
            jsonrpc_body(rid, error={"code": -32603, "message": IDENTITY_WORDS[0]})
        ),
    ],
    ids=["http 503", "jsonrpc error"],
)
async def test_jsonrpc_answers_with_identity_words_are_capability_failed(
    pki: Pki, tmp_path: Path, answer: Any
) -> None:
    fake = RawHttpUpstream(answer)
    result, audited = await _outcome_via_http(pki, tmp_path, fake)
    assert isinstance(result, CapabilityFailed)
    assert audited == [("CAPABILITY_FAILED", "")]
    assert fake.received == 1


async def test_jsonrpc_connection_closed_after_the_request_may_have_run(
    pki: Pki, tmp_path: Path
) -> None:
    fake = RawHttpUpstream(lambda rid: None)  # reads the request, closes unanswered
    result, audited = await _outcome_via_http(pki, tmp_path, fake)
    assert isinstance(result, PeerUnavailable)
    assert audited == [("PEER_UNAVAILABLE", "PEER_UNAVAILABLE_AFTER_SEND")]
    assert fake.received == 1


# --- item: compressed answers are capped while inflating -----------------------------


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


ENCODERS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "gzip": (lambda data: gzip.compress(data, 9), "gzip"),
    "x-gzip": (lambda data: gzip.compress(data, 9), "x-gzip"),
    "deflate (zlib)": (lambda data: zlib.compress(data, 9), "deflate"),
    "deflate (raw)": (_raw_deflate, "deflate"),
    "gzip twice": (lambda data: gzip.compress(gzip.compress(data, 9), 9), "gzip, gzip"),
}


@pytest.mark.parametrize(("encode", "coding"), ENCODERS.values(), ids=ENCODERS.keys())
async def test_compression_bombs_are_invalid_output(
    pki: Pki, tmp_path: Path, encode: Callable[[bytes], bytes], coding: str
) -> None:
    body = encode(bytes(BOMB))
    assert len(body) < 100 * 1024  # the bomb is small on the wire
    fake = RawHttpUpstream(lambda rid: http_response(body, headers={"Content-Encoding": coding}))
    tracemalloc.start()
    try:
        result, audited = await _outcome_via_http(pki, tmp_path, fake)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(result, InvalidOutput)
    assert audited == [("INVALID_OUTPUT", "")]
    assert fake.received == 1
    # Inflating stops at the ceiling: far below the bomb's 40 MiB.
    assert peak < 4 * MESSAGE_CEILING, f"{peak} bytes allocated at the peak"


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, gzip, gzip", "made-up"])
async def test_encodings_that_are_not_decoded_here_are_refused(
    pki: Pki, tmp_path: Path, coding: str
) -> None:
    answer = jsonrpc_body(1, result=_message("ok"))
    fake = RawHttpUpstream(lambda rid: http_response(answer, headers={"Content-Encoding": coding}))
    result, audited = await _outcome_via_http(pki, tmp_path, fake)
    assert isinstance(result, InvalidOutput)
    assert audited == [("INVALID_OUTPUT", "")]


@pytest.mark.parametrize(
    ("encode", "coding"),
    [(gzip.compress, "gzip"), (zlib.compress, "deflate"), (_raw_deflate, "deflate")],
    ids=["gzip", "deflate (zlib)", "deflate (raw)"],
)
async def test_a_compressed_wellformed_answer_is_read(
    pki: Pki, tmp_path: Path, encode: Any, coding: str
) -> None:
    def answer(rid: object) -> bytes:
        body = encode(jsonrpc_body(rid, result=_message("compressed anyway")))
        return http_response(body, headers={"Content-Encoding": coding})

    result, audited = await _outcome_via_http(pki, tmp_path, RawHttpUpstream(answer))
    assert result == {"text": "compressed anyway"}
    assert audited == [("OK", "")]


async def test_a_real_mismatch_at_the_handshake_is_peer_identity_mismatch_unsent(
    pki: Pki, tmp_path: Path
) -> None:
    fake = RawGrpcUpstream(answer=_grpc_answer("never"))
    async with raw_grpc_upstream(fake, pki, "mallory") as address:  # same CA, other SPIFFE ID
        up = {"id": LEGACY, "binding": "grpc", "address": address}
        async with fronted(pki, tmp_path, up) as bob, client(pki, bob) as peer:
            for _ in range(2):  # the second finds the channel failed: still decided by a handshake
                with pytest.raises(PeerUnavailable):
                    await peer.invoke("legacy.echo", {"text": "for legacy only"})
            rows = await records(bob)
    assert fake.received == 0
    assert [(r.reason, r.detail) for r in rows] == [
        ("PEER_UNAVAILABLE", "PEER_IDENTITY_MISMATCH")
    ] * 2
