"""Every reason code over real mTLS: exact status, reason, audit record, no side effect."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import (
    CapabilityNotGranted,
    DeadlineExceeded,
    GatewayError,
    GrantExpired,
    InvalidInput,
    InvalidRequest,
    PayloadTooLarge,
    PeerUnavailable,
    RiskNotGranted,
    Unauthenticated,
    UnknownPeer,
    VersionNotAvailable,
)
from gateway.runtime.agent import Agent
from gateway.transport.tls import channel_options
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.agents import Pki, WriteCounter, audit_rows, raw_invoke, spiffe


def client_for(pki: Pki, agent: Agent, name: str) -> PeerClient:
    return PeerClient(agent.config.id, agent.address, pki.material(name))


async def refused(
    client: PeerClient, capability: str, payload: bytes | dict, **kw: object
) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await client.invoke(capability, payload, **kw)  # type: ignore[arg-type]
    await client.close()
    return info.value


def last_record(agent: Agent) -> dict[str, object]:
    rows = audit_rows(agent.config.audit_db)
    assert rows, "no audit record was written"
    return rows[-1].to_json_dict()


async def test_allowed_call_returns_output_evidence_and_is_audited(pki: Pki, alice: Agent) -> None:
    async with client_for(pki, alice, "bob") as bob:
        result = await bob.invoke(
            "text.echo", {"text": "hello"}, constraint="^1", request_id="req-1"
        )
    assert result.output() == {"text": "hello"}
    assert result.served_version == "1.0.0"
    import hashlib

    assert result.evidence_sha256 == hashlib.sha256(result.payload).hexdigest()
    await alice.audit.flush()
    record = last_record(alice)
    assert (record["decision"], record["reason"], record["peer_id"], record["request_id"]) == (
        "allow",
        "OK",
        spiffe("bob"),
        "req-1",
    )
    assert record["served_version"] == "1.0.0"
    assert record["payload_size"] == len(b'{"text":"hello"}')
    assert "hello" not in json.dumps(record)


@pytest.mark.parametrize(
    ("caller", "capability", "payload", "kwargs", "error", "code", "reason"),
    [
        (
            "mallory",
            "notes.write",
            {"note": "x"},
            {},
            UnknownPeer,
            grpc.StatusCode.PERMISSION_DENIED,
            "UNKNOWN_PEER",
        ),
        (
            "dave",
            "text.echo",
            {"text": "x"},
            {},
            GrantExpired,
            grpc.StatusCode.PERMISSION_DENIED,
            "GRANT_EXPIRED",
        ),
        (
            "bob",
            "kv.delete",
            {"key": "x"},
            {},
            CapabilityNotGranted,
            grpc.StatusCode.PERMISSION_DENIED,
            "CAPABILITY_NOT_GRANTED",
        ),
        (
            "carol",
            "text.search",
            {"query": "x"},
            {},
            CapabilityNotGranted,
            grpc.StatusCode.PERMISSION_DENIED,
            "CAPABILITY_NOT_GRANTED",
        ),
        (
            "bob",
            "notes.write",
            {"note": "x"},
            {"constraint": "^2"},
            VersionNotAvailable,
            grpc.StatusCode.NOT_FOUND,
            "VERSION_NOT_AVAILABLE",
        ),
        (
            "carol",
            "notes.write",
            {"note": "x"},
            {},
            RiskNotGranted,
            grpc.StatusCode.PERMISSION_DENIED,
            "RISK_NOT_GRANTED",
        ),
        (
            "bob",
            "notes.write",
            b'{"note":"' + b"x" * 1100 + b'"}',
            {},
            PayloadTooLarge,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "PAYLOAD_TOO_LARGE",
        ),
        (
            "bob",
            "notes.write",
            {"note": "x", "extra": 1},
            {},
            InvalidInput,
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_INPUT",
        ),
        (
            "bob",
            "notes.write",
            {"note": 5},
            {},
            InvalidInput,
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_INPUT",
        ),
        (
            "bob",
            "notes.write",
            b"{not json",
            {},
            InvalidInput,
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_INPUT",
        ),
        (
            "bob",
            "notes.write",
            b'{"note":"\xff\xfe"}',
            {},
            InvalidInput,
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_INPUT",
        ),
        (
            "bob",
            "notes.write",
            {"note": "x"},
            {"constraint": ">>1"},
            InvalidRequest,
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_REQUEST",
        ),
        (
            "bob",
            "notes.write",
            {"note": "x"},
            {"request_id": "bad id\n"},
            InvalidRequest,
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_REQUEST",
        ),
    ],
)
async def test_refusal_has_reason_audit_record_and_no_side_effect(
    pki: Pki,
    alice: Agent,
    counter: WriteCounter,
    caller: str,
    capability: str,
    payload: bytes | dict,
    kwargs: dict,
    error: type[GatewayError],
    code: grpc.StatusCode,
    reason: str,
) -> None:
    err = await refused(client_for(pki, alice, caller), capability, payload, **kwargs)
    assert type(err) is error
    assert err.reason == reason
    record = last_record(alice)  # durable before the refusal reached us
    assert (record["decision"], record["reason"], record["peer_id"]) == (
        "refuse",
        reason,
        spiffe(caller),
    )
    assert record["capability"] == capability
    assert counter.calls == 0


async def test_refusal_status_code_on_the_wire(pki: Pki, alice: Agent) -> None:
    err = await raw_invoke(
        pki,
        alice,
        "mallory",
        gateway_pb2.InvokeRequest(request_id="r", capability="text.echo", payload=b'{"text":"x"}'),
    )
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_not_granted_answer_is_the_same_whether_or_not_capability_exists(
    pki: Pki, alice: Agent
) -> None:
    exists = await refused(client_for(pki, alice, "carol"), "text.search", {"query": "x"})
    missing = await refused(client_for(pki, alice, "carol"), "no.such.thing", {"query": "x"})
    assert (exists.reason, exists.message) == (missing.reason, missing.message)
    details = [r.detail for r in audit_rows(alice.config.audit_db)[-2:]]
    assert details == ["not in grant", "capability not registered"]


async def test_deadline_already_passed_is_refused_without_running(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    error = await raw_invoke(
        pki,
        alice,
        "bob",
        gateway_pb2.InvokeRequest(
            request_id="late-1",
            capability="notes.write",
            payload=b'{"note":"x"}',
            deadline_unix_ms=int((time.time() - 5) * 1000),
        ),
    )
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    from gateway.transport.status import from_rpc_error

    assert isinstance(from_rpc_error(error), DeadlineExceeded)
    record = last_record(alice)
    assert (record["reason"], record["request_id"]) == ("DEADLINE_EXCEEDED", "late-1")
    assert counter.calls == 0


@pytest.mark.parametrize(
    "uris",
    [
        [],
        ["spiffe://example.org/agent/bob", "spiffe://example.org/agent/x"],
        ["https://example.org/bob"],
    ],
)
async def test_certificate_without_exactly_one_spiffe_id_is_unauthenticated(
    pki: Pki, alice: Agent, counter: WriteCounter, uris: list[str]
) -> None:
    client = PeerClient(alice.config.id, alice.address, pki.odd_material(uris=uris))
    err = await refused(client, "notes.write", {"note": "x"})
    assert type(err) is Unauthenticated
    record = last_record(alice)
    assert (record["decision"], record["reason"], record["peer_id"]) == (
        "refuse",
        "UNAUTHENTICATED",
        "",
    )
    assert counter.calls == 0


async def test_client_from_another_ca_cannot_connect(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    before = len(audit_rows(alice.config.audit_db))
    foreign = pki.foreign_material("bob")
    # Trust alice's CA for the server side, but present a certificate from another CA.
    from gateway.transport.tls import TlsMaterial

    material = TlsMaterial(
        ca_pem=pki.ca.certificate_pem(), cert_pem=foreign.cert_pem, key_pem=foreign.key_pem
    )
    err = await refused(
        PeerClient(alice.config.id, alice.address, material),
        "notes.write",
        {"note": "x"},
        timeout=3.0,
    )
    assert type(err) is PeerUnavailable
    assert len(audit_rows(alice.config.audit_db)) == before  # never reached Python
    assert counter.calls == 0


async def test_client_without_certificate_cannot_connect(pki: Pki, alice: Agent) -> None:
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca.certificate_pem())
    async with grpc.aio.secure_channel(
        alice.address, creds, options=channel_options(alice.config.id)
    ) as channel:
        stub = gateway_pb2_grpc.PeerGatewayStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Invoke(gateway_pb2.InvokeRequest(request_id="r"), timeout=3.0)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_identity_claims_in_metadata_and_payload_are_ignored(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    err = await raw_invoke(
        pki,
        alice,
        "mallory",
        gateway_pb2.InvokeRequest(
            request_id="spoof", capability="notes.write", payload=b'{"note":"x"}'
        ),
        metadata=(("x-spiffe-id", spiffe("bob")), ("x-peer-id", spiffe("bob"))),
    )
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert last_record(alice)["peer_id"] == spiffe("mallory")
    assert counter.calls == 0
