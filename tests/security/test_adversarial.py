"""Attacks on transport, identity, grants and input: exact status, reason, audit, no side effect."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from gateway.client.peer_client import PeerClient
from gateway.errors import GatewayError, GrantExpired, PayloadTooLarge, Unauthenticated
from gateway.runtime.agent import Agent
from gateway.transport.status import from_rpc_error
from gateway.wire.v1 import gateway_pb2
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    raw_channel,
    raw_invoke,
    spiffe,
    standard_registry,
    started,
    write_policy,
)

INVOKE = "/a2agw.v1.PeerGateway/Invoke"


async def test_expired_client_certificate_is_refused_by_tls(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    past = datetime.now(UTC) - timedelta(days=2)
    material = pki.odd_material(
        uris=[spiffe("bob")], not_before=past - timedelta(days=1), not_after=past
    )
    before = len(audit_rows(alice.config.audit_db))
    client = PeerClient(alice.config.id, alice.address, material)
    with pytest.raises(GatewayError) as info:
        await client.invoke("notes.write", {"note": "x"}, timeout=3.0)
    await client.close()
    assert info.value.reason == "PEER_UNAVAILABLE"  # the handshake itself fails
    assert len(audit_rows(alice.config.audit_db)) == before
    assert counter.calls == 0


async def test_payload_exactly_at_cap_passes_and_one_byte_over_is_refused(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    prefix, suffix = b'{"note":"', b'"}'
    at_cap = prefix + b"x" * (1024 - len(prefix) - len(suffix)) + suffix
    assert len(at_cap) == 1024
    async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as bob:
        await bob.invoke("notes.write", at_cap)
        with pytest.raises(PayloadTooLarge):
            await bob.invoke("notes.write", at_cap[:-2] + b'x"}')
    assert counter.calls == 1
    record = audit_rows(alice.config.audit_db)[-1]
    assert (record.reason, record.payload_size) == ("PAYLOAD_TOO_LARGE", 1025)


async def test_payload_far_over_the_server_ceiling_never_reaches_python(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    before = len(audit_rows(alice.config.audit_db))
    err = await raw_invoke(
        pki,
        alice,
        "bob",
        gateway_pb2.InvokeRequest(
            request_id="huge", capability="notes.write", payload=b"x" * (6 * 1024 * 1024)
        ),
    )
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(audit_rows(alice.config.audit_db)) == before
    assert counter.calls == 0


async def test_compressed_payload_is_measured_after_inflation(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    payload = b'{"note":"' + b"a" * 5000 + b'"}'  # ~60 bytes gzipped, 5 KB inflated
    err = await raw_invoke(
        pki,
        alice,
        "bob",
        gateway_pb2.InvokeRequest(request_id="zip-1", capability="notes.write", payload=payload),
        compression=grpc.Compression.Gzip,
    )
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert from_rpc_error(err).reason == "PAYLOAD_TOO_LARGE"
    assert audit_rows(alice.config.audit_db)[-1].payload_size == len(payload)
    bomb = await raw_invoke(
        pki,
        alice,
        "bob",
        gateway_pb2.InvokeRequest(
            request_id="zip-2", capability="notes.write", payload=b"\0" * (8 * 1024 * 1024)
        ),
        compression=grpc.Compression.Gzip,
    )
    assert bomb.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC core stops the bomb
    assert counter.calls == 0


@pytest.mark.parametrize(
    "payload",
    [
        b"[" * 5000 + b"]" * 5000,
        b'{"note":' + b'{"a":' * 3000 + b"1" + b"}" * 3001,
        b'{"note":"' + b"\\ud800" + b'"}',
        b'{"note":"ok","note":"dup"}' + b" " * 10 + b"garbage",
        b"",
        b"null",
        b'"just a string"',
        b'{"note":"\xc3\x28"}',
    ],
)
async def test_hostile_json_is_invalid_input(
    pki: Pki, alice: Agent, counter: WriteCounter, payload: bytes
) -> None:
    err = await raw_invoke(
        pki,
        alice,
        "bob",
        gateway_pb2.InvokeRequest(
            request_id="json-1", capability="notes.write", payload=payload[:1024]
        ),
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(err).reason == "INVALID_INPUT"
    assert audit_rows(alice.config.audit_db)[-1].reason == "INVALID_INPUT"
    assert counter.calls == 0


async def test_huge_string_within_cap_is_fine_and_not_logged(pki: Pki, alice: Agent) -> None:
    marker = "SECRET-MARKER-" + "z" * 900
    async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as bob:
        await bob.invoke("text.echo", {"text": marker})
    await alice.audit.flush()
    dumped = json.dumps([r.to_json_dict() for r in audit_rows(alice.config.audit_db)])
    assert "SECRET-MARKER" not in dumped


async def test_malformed_protobuf_bytes_are_rejected(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    async with raw_channel(pki, alice, "bob") as ch:
        invoke = ch.unary_unary(INVOKE, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await invoke(b"\xff\xff\xff\xff\x0f\x0a\x99", timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(info.value).reason == "INVALID_REQUEST"
    record = audit_rows(alice.config.audit_db)[-1]
    assert (record.decision, record.reason, record.peer_id) == (
        "refuse",
        "INVALID_REQUEST",
        spiffe("bob"),
    )
    assert counter.calls == 0
    async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as bob:
        assert (await bob.invoke("text.echo", {"text": "still up"})).output() == {
            "text": "still up"
        }


async def test_grant_that_expires_during_a_call_sequence(
    pki: Pki, tmp_path: Path, counter: WriteCounter
) -> None:
    expires = datetime.now(UTC) + timedelta(seconds=1.5)
    policy = write_policy(
        tmp_path / "policy.toml", [grant("bob", ["notes.write"], expires_at=expires.isoformat())]
    )
    agent = await started(
        agent_config(pki, tmp_path, "alice", policy), standard_registry(counter, tmp_path / "state")
    )
    outcomes: list[str] = []
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            for _ in range(60):  # bounded: at most ~3 s
                try:
                    await bob.invoke("notes.write", {"note": "n"})
                    outcomes.append("OK")
                except GrantExpired:
                    outcomes.append("GRANT_EXPIRED")
                    break
                await asyncio.sleep(0.05)
    finally:
        await agent.stop()
    assert outcomes[-1] == "GRANT_EXPIRED" and set(outcomes[:-1]) == {"OK"}
    assert counter.calls == len(outcomes) - 1
    assert audit_rows(agent.config.audit_db)[-1].reason == "GRANT_EXPIRED"


async def test_certificate_of_another_trust_domain_with_a_granted_path(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    # Signed by our CA but naming another trust domain: the id is not bob's.
    material = pki.odd_material(uris=["spiffe://evil.org/agent/bob"])
    client = PeerClient(alice.config.id, alice.address, material)
    with pytest.raises(GatewayError) as info:
        await client.invoke("notes.write", {"note": "x"})
    await client.close()
    assert info.value.reason == "UNKNOWN_PEER"
    assert audit_rows(alice.config.audit_db)[-1].peer_id == "spiffe://evil.org/agent/bob"
    assert counter.calls == 0


async def test_error_messages_do_not_reveal_ungranted_capabilities(pki: Pki, alice: Agent) -> None:
    messages = []
    for caller, capability in (
        ("mallory", "notes.write"),
        ("carol", "kv.put"),
        ("carol", "nothing.here"),
    ):
        async with PeerClient(alice.config.id, alice.address, pki.material(caller)) as client:
            with pytest.raises(GatewayError) as info:
                await client.invoke(capability, {"key": "k", "value": "v"})
        messages.append(info.value.message)
    assert messages[1] == messages[2]
    for message in messages:
        assert "kv.put" not in message and "1.0.0" not in message and "write" not in message


async def test_reflection_is_not_served(pki: Pki, alice: Agent) -> None:
    async with raw_channel(pki, alice, "bob") as ch:
        method = ch.unary_unary(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(b"", timeout=5)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_refused_describe_is_audited(pki: Pki, alice: Agent) -> None:
    client = PeerClient(alice.config.id, alice.address, pki.odd_material(uris=[]))
    with pytest.raises(Unauthenticated):
        await client.describe()
    await client.close()
    record = audit_rows(alice.config.audit_db)[-1]
    assert (record.decision, record.reason, record.peer_id, record.detail) == (
        "refuse",
        "UNAUTHENTICATED",
        "",
        "Describe",
    )


async def test_replayed_request_id_is_refused(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    async with PeerClient(alice.config.id, alice.address, pki.material("bob")) as bob:
        await bob.invoke("notes.write", {"note": "a"}, request_id="once-only")
        with pytest.raises(GatewayError) as info:
            await bob.invoke("notes.write", {"note": "a"}, request_id="once-only")
        # Another peer may use the same id: ids are scoped to the caller.
    async with PeerClient(alice.config.id, alice.address, pki.material("carol")) as carol:
        await carol.invoke("text.echo", {"text": "a"}, request_id="once-only")
    assert info.value.reason == "REPLAYED_REQUEST"
    assert counter.calls == 1
    await alice.audit.flush()
    records = audit_rows(alice.config.audit_db)[-3:]
    assert [(r.peer_id, r.reason) for r in records] == [
        (spiffe("bob"), "OK"),
        (spiffe("bob"), "REPLAYED_REQUEST"),
        (spiffe("carol"), "OK"),
    ]


async def test_replay_window_survives_a_restart(
    pki: Pki, tmp_path: Path, counter: WriteCounter, stores: dict[str, str]
) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["notes.write"])])
    config = agent_config(pki, tmp_path, "alice", policy, stores=stores)
    registry = standard_registry(counter, tmp_path / "state")
    for attempt in range(2):
        agent = await started(config, registry)
        try:
            async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
                if attempt == 0:
                    await bob.invoke("notes.write", {"note": "a"}, request_id="before-restart")
                else:
                    with pytest.raises(GatewayError) as info:
                        await bob.invoke("notes.write", {"note": "a"}, request_id="before-restart")
                    assert info.value.reason == "REPLAYED_REQUEST"
        finally:
            await agent.stop()
    assert counter.calls == 1
