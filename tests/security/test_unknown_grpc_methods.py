"""A gRPC method the agent does not serve is refused UNIMPLEMENTED, and audited.

Found by the Java 1.0 interop work: its gRPC transport calls a pre-1.0 draft
service (``a2a.v1.A2AService``), which gRPC itself answered UNIMPLEMENTED
before any code of ours ran: no audit record, where the HTTPS port audits
every unknown path. Probes of the port (reflection, guessed services) were
invisible to operators the same way.
"""

from __future__ import annotations

import grpc
import pytest
from grpc import aio

from gateway.runtime.agent import Agent
from gateway.server.unknown_methods import OPERATION, shown_method
from gateway.transport.status import from_rpc_error
from gateway.transport.tls import channel_options
from tests.helpers.agents import Pki, WriteCounter, audit_rows, spiffe

UNARY = "/a2a.v1.A2AService/SendMessage"
STREAMED = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def channel_of(pki: Pki, name: str, agent: Agent) -> aio.Channel:
    return aio.secure_channel(
        agent.address,
        pki.material(name).channel_credentials(),
        options=channel_options(agent.config.id),
    )


async def test_unknown_methods_are_refused_with_their_reason_and_audited(
    pki: Pki, alice: Agent, counter: WriteCounter
) -> None:
    before = len(audit_rows(alice.config.audit_db))
    async with channel_of(pki, "bob", alice) as channel:
        with pytest.raises(aio.AioRpcError) as unary:
            await channel.unary_unary(UNARY)(b"\x0a\x03abc", timeout=10)
        call = channel.stream_stream(STREAMED)(timeout=10)
        await call.write(b"")
        with pytest.raises(aio.AioRpcError) as streamed:
            await call.read()
        # The agent still serves what it does serve, on the same channel.
        health = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert await health(b"", timeout=10) == b"\x08\x01"  # SERVING
    for answer in (unary.value, streamed.value):
        assert answer.code() is grpc.StatusCode.UNIMPLEMENTED
        assert from_rpc_error(answer).reason == "UNKNOWN_METHOD"
    assert "/a2a.v1.A2AService/SendMessage" in (unary.value.details() or "")
    await alice.audit.flush()
    added = audit_rows(alice.config.audit_db)[before:]
    assert [(r.peer_id, r.decision, r.reason, r.detail) for r in added] == [
        (spiffe("bob"), "refuse", "UNKNOWN_METHOD", f"{OPERATION}: {UNARY}"),
        (spiffe("bob"), "refuse", "UNKNOWN_METHOD", f"{OPERATION}: {STREAMED}"),
    ]
    assert counter.calls == 0


async def test_an_unknown_peer_probing_methods_is_refused_as_unknown(
    pki: Pki, alice: Agent
) -> None:
    before = len(audit_rows(alice.config.audit_db))
    async with channel_of(pki, "mallory", alice) as channel:
        with pytest.raises(aio.AioRpcError) as refused:
            await channel.unary_unary(UNARY)(b"", timeout=10)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert from_rpc_error(refused.value).reason == "UNKNOWN_PEER"
    await alice.audit.flush()
    added = audit_rows(alice.config.audit_db)[before:]
    assert [(r.peer_id, r.decision, r.reason) for r in added] == [
        (spiffe("mallory"), "refuse", "UNKNOWN_PEER")
    ]


@pytest.mark.parametrize(
    ("method", "shown"),
    [
        ("/lf.a2a.v1.A2AService/Nope", "/lf.a2a.v1.A2AService/Nope"),
        ("/x/\x1b[31mred", "(not a method path)"),
        ("no-slash", "(not a method path)"),
        ("/" + "a" * 150 + "/B", ("/" + "a" * 150 + "/B")[:96]),
    ],
)
def test_the_record_names_only_plain_method_paths(method: str, shown: str) -> None:
    assert shown_method(method) == shown
