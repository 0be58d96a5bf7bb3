"""Real JWT-SVIDs from a real SPIRE agent, verified with the JWT bundle from the Workload API.

alice takes her X.509-SVID and the example.org JWT bundle from her SPIRE
agent (``jwks = "workload-api"``). bob fetches JWT-SVIDs from his own SPIRE
agent with py-spiffe and calls alice over gRPC with his X.509-SVID: his own
JWT-SVID for alice's audience is taken (bound: its ``sub`` is his
certificate's SPIFFE ID); alice's JWT-SVID shown with bob's certificate is
refused ``TOKEN_NOT_BOUND``; bob's JWT-SVID for another audience is refused
``TOKEN_AUDIENCE_MISMATCH``. Each refusal is audited under bob, nothing runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
from spiffe import WorkloadApiClient

from gateway.config import AgentConfig
from gateway.transport.tls import channel_options
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.a2a_support import gateway_reason
from tests.spire.conftest import Spire
from tests.spire.test_workload_api import start_agent, workload_config
from tests.support import WriteCounter, audit_rows, grant, spiffe

ALICE, BOB = spiffe("alice"), spiffe("bob")


def with_jwt_svids(config: AgentConfig) -> AgentConfig:
    identity: dict[str, Any] = {
        "tokens": {
            "issuers": [
                {
                    "name": "spire",
                    "kind": "jwt-svid",
                    "trust_domain": "example.org",
                    "jwks": "workload-api",
                }
            ]
        }
    }
    return AgentConfig.model_validate({**config.model_dump(), "identity": identity})


def jwt_svid(socket: str, audience: str) -> str:
    with WorkloadApiClient(socket) as client:
        return str(client.fetch_jwt_svid(audience={audience}, timeout=20).token)


async def test_jwt_svids_from_spire_are_bound_to_the_x509_svid(
    spire: Spire, tmp_path: Path
) -> None:
    counter = WriteCounter()
    config = workload_config(
        tmp_path, ALICE, spire.alice_node.address, [grant("bob", ["text.echo", "notes.write"])]
    )
    alice = await start_agent(with_jwt_svids(config), counter)
    bob = await start_agent(workload_config(tmp_path, BOB, spire.bob_node.address, []))
    try:
        own = await asyncio.to_thread(jwt_svid, spire.bob_node.address, ALICE)
        elsewhere = await asyncio.to_thread(jwt_svid, spire.bob_node.address, spiffe("carol"))
        alices = await asyncio.to_thread(jwt_svid, spire.alice_node.address, ALICE)
        material = bob.live_tls.current
        channel = grpc.aio.secure_channel(
            alice.address, material.channel_credentials(ALICE), options=channel_options(ALICE)
        )
        reasons = []
        async with channel:
            stub = gateway_pb2_grpc.PeerGatewayStub(channel)
            for n, (capability, token) in enumerate(
                [("text.echo", own), ("notes.write", alices), ("notes.write", elsewhere)]
            ):
                request = gateway_pb2.InvokeRequest(
                    request_id=f"jwt-{n}",
                    capability=capability,
                    payload=b'{"note": "x"}' if capability == "notes.write" else b'{"text": "hi"}',
                )
                try:
                    await stub.Invoke(
                        request, metadata=(("authorization", f"Bearer {token}"),), timeout=20
                    )
                    reasons.append("OK")
                except grpc.aio.AioRpcError as err:
                    reasons.append(gateway_reason(err))
        assert reasons == ["OK", "TOKEN_NOT_BOUND", "TOKEN_AUDIENCE_MISMATCH"]
        assert counter.calls == 0
        await alice.audit.flush()
        rows = [(r.peer_id, r.capability, r.reason) for r in audit_rows(alice.config.audit_db)]
        assert rows[-3:] == [
            (BOB, "text.echo", "OK"),
            (BOB, "notes.write", "TOKEN_NOT_BOUND"),
            (BOB, "notes.write", "TOKEN_AUDIENCE_MISMATCH"),
        ]
        for token in (own, alices, elsewhere):
            assert token.split(".")[2].encode() not in alice.config.audit_db.read_bytes()
    finally:
        await bob.stop()
        await alice.stop()
