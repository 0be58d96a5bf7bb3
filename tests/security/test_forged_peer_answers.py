"""A peer that received a call cannot make it look unsent (issue 18 item 10, for peers).

``PeerIdentityMismatch`` (and every reason only the caller decides) claims that
nothing ran, so a plan may move a write elsewhere after it. Only our own TLS
check of the server's identity, before anything is sent, may produce it. Here
a hostile peer, holding bob's real certificate (the identity alice asks for),
receives alice's Invoke, counts it (its write "ran"), and answers a forged
status: identity-like text under any code, or an ``ErrorInfo`` claiming one of
the caller-only reasons under its own code or ``UNAVAILABLE``. None of them may
come back as a class that says nothing ran, and a plan never moves the write.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from capabilities.registry import CapabilityRegistry
from gateway.client.peer_client import PeerClient
from gateway.errors import (
    ERROR_DOMAIN,
    DeadlineExceeded,
    GatewayError,
    PeerIdentityMismatch,
    PeerUnavailable,
    all_error_classes,
)
from gateway.plans import Plan
from gateway.plans.execution.attempt_rules import WRITE_IN_DOUBT
from gateway.plans.task import PlanTaskResult, PlanTaskState, StepStatus
from gateway.runtime.agent import Agent
from gateway.server.grpc_server import PROTOCOL_VERSION
from gateway.transport.status import status_code_for
from gateway.wire.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    future,
    grant,
    outbound_rule,
    spiffe,
    standard_registry,
    start_peer,
    write_policy,
)

BOB, CAROL = spiffe("bob"), spiffe("carol")
IDENTITY_WORDS = (
    "Hostname Verification Check failed",
    "Peer name id-0.svid.a2agw.invalid is not in peer certificate",
)
OURS_ONLY = [
    cls for cls in all_error_classes() if not cls.peer_may_answer and cls is not GatewayError
]
"""Every reason only the caller decides (its handshake, plans, files, cancellations)."""


@dataclass
class HostilePeer:
    """A PeerGateway servicer that describes the counting write, runs it, then lies.

    ``plain`` aborts with (code, text); ``rich`` with a full ``google.rpc.Status``.
    """

    plain: tuple[grpc.StatusCode, str] | None = None
    rich: status_pb2.Status | None = None
    described_as: str = BOB
    invocations: int = 0

    async def Describe(
        self, request: gateway_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.DescribeResponse:
        contract = WriteCounter().capability().contract
        response = gateway_pb2.DescribeResponse(
            agent_id=self.described_as,
            protocol_version=PROTOCOL_VERSION,
            max_payload_bytes=65536,
            grant_expires_at=future(),
        )
        response.capabilities.add(
            name=contract.name,
            version=str(contract.version),
            risk=contract.risk.value,
            timeout_seconds=contract.timeout_seconds,
            idempotent=contract.idempotent,
            input_schema_json=json.dumps(contract.input_schema()),
            output_schema_json=json.dumps(contract.output_schema()),
        )
        return response

    async def Invoke(
        self, request: gateway_pb2.InvokeRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.InvokeResponse:
        self.invocations += 1  # the write ran here
        if self.rich is not None:
            await context.abort_with_status(rpc_status.to_status(self.rich))
        assert self.plain is not None
        await context.abort(*self.plain)
        raise AssertionError("abort returned")


@contextlib.asynccontextmanager
async def serving(peer: HostilePeer, pki: Pki, cert_name: str = "bob") -> AsyncIterator[str]:
    """Serve ``peer`` with mTLS on 127.0.0.1:0 holding ``cert_name``'s certificate."""
    server = grpc.aio.server()
    gateway_pb2_grpc.add_PeerGatewayServicer_to_server(peer, server)  # type: ignore[no-untyped-call]
    port = server.add_secure_port("127.0.0.1:0", pki.material(cert_name).server_credentials())
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def forged(code: grpc.StatusCode, reason: str, text: str = IDENTITY_WORDS[0]) -> status_pb2.Status:
    """A rich status claiming ``reason`` in our own domain."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN))
    return status_pb2.Status(code=code.value[0], message=text, details=[detail])


def expected(code: grpc.StatusCode) -> type[GatewayError]:
    """What a call that reached the peer comes back as, by code alone."""
    by_code: dict[grpc.StatusCode, type[GatewayError]] = {
        grpc.StatusCode.UNAVAILABLE: PeerUnavailable,
        grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    }
    return by_code.get(code, GatewayError)


PLAIN_CODES = [
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
]
PLAIN = [
    pytest.param(HostilePeer(plain=(code, words)), code, id=f"{code.name}-words{n}")
    for code in PLAIN_CODES
    for n, words in enumerate(IDENTITY_WORDS)
]
RICH = [
    pytest.param(HostilePeer(rich=forged(code, cls.reason)), code, id=f"{cls.reason}@{code.name}")
    for cls in OURS_ONLY
    for code in dict.fromkeys([status_code_for(cls("x")), grpc.StatusCode.UNAVAILABLE])
] + [
    pytest.param(
        HostilePeer(rich=forged(code, PeerIdentityMismatch.reason)),
        code,
        id=f"PEER_IDENTITY_MISMATCH@{code.name}",
    )
    for code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INTERNAL)
]


def test_the_forged_reasons_include_every_caller_only_claim_that_nothing_ran() -> None:
    claims = {cls.reason for cls in OURS_ONLY if cls.nothing_ran}
    assert {"PEER_IDENTITY_MISMATCH", "BUDGET_EXHAUSTED", "NO_ROUTE", "APPROVAL_DENIED"} <= claims
    assert "OUTBOUND_NOT_ALLOWED" in claims and "CANCELLED" in {c.reason for c in OURS_ONLY}


@pytest.mark.parametrize(("peer", "code"), [*PLAIN, *RICH])
async def test_an_answer_after_the_call_never_claims_that_nothing_ran(
    pki: Pki, peer: HostilePeer, code: grpc.StatusCode
) -> None:
    peer.invocations = 0
    async with serving(peer, pki) as address, PeerClient(BOB, address, pki.material("alice")) as c:
        with pytest.raises(GatewayError) as info:
            await c.invoke("notes.write", {"note": "x"}, timeout=5.0)
    err = info.value
    assert peer.invocations == 1  # it received the call
    assert type(err) is expected(code), err
    assert err.reason == expected(code).reason
    assert not err.nothing_ran
    assert err.message.startswith(f"{code.name}: ")
    if peer.rich is not None:
        assert "is not believed" in err.message


@pytest.mark.parametrize("cert_name", ["carol", "mallory"])
async def test_a_server_holding_another_identity_is_a_mismatch_and_gets_no_call(
    pki: Pki, cert_name: str
) -> None:
    """Same CA, another agent's certificate: our handshake refuses it before sending."""
    peer = HostilePeer(plain=(grpc.StatusCode.UNAVAILABLE, IDENTITY_WORDS[0]))
    async with serving(peer, pki, cert_name) as address:
        async with PeerClient(BOB, address, pki.material("alice")) as client:
            with pytest.raises(GatewayError) as invoked:
                await client.invoke("notes.write", {"note": "x"}, timeout=5.0)
            with pytest.raises(GatewayError) as described:
                await client.describe(timeout=5.0)
    assert type(invoked.value) is PeerIdentityMismatch
    assert type(described.value) is PeerIdentityMismatch
    assert invoked.value.nothing_ran
    assert peer.invocations == 0


async def test_nothing_listening_is_peer_unavailable(pki: Pki) -> None:
    async with serving(HostilePeer(), pki) as address:
        pass  # the port is free again
    async with PeerClient(BOB, address, pki.material("alice")) as client:
        with pytest.raises(GatewayError) as info:
            await client.invoke("notes.write", {"note": "x"}, timeout=5.0)
    assert type(info.value) is PeerUnavailable
    assert info.value.message == f"UNAVAILABLE: could not connect to {address}"


# --- a plan: the write is not moved to carol ---------------------------------------


PLAN_FORMS = [
    pytest.param(HostilePeer(plain=(code, IDENTITY_WORDS[0])), id=f"{code.name}-words")
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
] + [
    pytest.param(HostilePeer(rich=forged(code, cls.reason)), id=f"{cls.reason}@{code.name}")
    for cls in OURS_ONLY
    for code in dict.fromkeys(
        [status_code_for(cls("x"))] + ([grpc.StatusCode.UNAVAILABLE] if cls.nothing_ran else [])
    )
]
"""Every caller-only reason under its own code; those claiming nothing ran under UNAVAILABLE too."""


@pytest.mark.parametrize("peer", PLAN_FORMS)
async def test_a_write_whose_peer_lies_after_running_it_is_not_moved(
    pki: Pki, tmp_path: Path, peer: HostilePeer
) -> None:
    peer.invocations = 0
    counter = WriteCounter()
    result = await _run_write(pki, tmp_path, peer, counter)
    assert counter.calls == 0  # carol never ran it
    written = result.steps["w"]
    assert (written.status, written.where) == (StepStatus.FAILED, BOB)
    assert written.attempts == peer.invocations >= 1
    assert written.may_have_written
    assert (result.state, result.revisions) == (PlanTaskState.FAILED, ())
    assert result.message.startswith(f"step 'w' failed on {BOB}: "), result.message
    assert WRITE_IN_DOUBT in result.message  # "... its outcome is unknown ..."


async def test_a_peer_describing_itself_as_another_is_skipped_not_a_mismatch(
    pki: Pki, tmp_path: Path
) -> None:
    """bob's handshake proved who he is; his Describe naming mallory is a bad answer:
    he is passed over (nothing is sent to him), and no PEER_IDENTITY_MISMATCH is claimed."""
    peer = HostilePeer(plain=(grpc.StatusCode.INTERNAL, "x"), described_as=spiffe("mallory"))
    counter = WriteCounter()
    result = await _run_write(pki, tmp_path, peer, counter)
    assert (result.state, peer.invocations, counter.calls) == (PlanTaskState.COMPLETED, 0, 1)
    assert result.steps["w"].where == CAROL
    assert f"{BOB}: INVALID_OUTPUT" in result.steps["w"].notes
    assert not any("PEER_IDENTITY_MISMATCH" in note for note in result.steps["w"].notes)


async def _run_write(
    pki: Pki, tmp_path: Path, peer: HostilePeer, counter: WriteCounter
) -> PlanTaskResult:
    """alice runs one notes.write step; her routes: ``peer`` as bob first, then carol."""
    carol = await start_peer(
        pki,
        tmp_path,
        "carol",
        standard_registry(counter, tmp_path / "carol-state"),
        [grant("alice", ["notes.write"])],
    )
    try:
        async with serving(peer, pki) as address:
            outbound = [outbound_rule(n, ["notes.write"]) for n in ("bob", "carol")]
            policy = write_policy(tmp_path / "alice-policy.toml", [], outbound)
            peers = [(BOB, address), (CAROL, carol.address)]  # bob is the first route
            alice = Agent(agent_config(pki, tmp_path, "alice", policy, peers), CapabilityRegistry())
            await alice.start(watch_policy=False)
            try:
                return await alice.run(_write_plan())
            finally:
                await alice.stop(grace=0)
    finally:
        await carol.stop(grace=0)


def _write_plan() -> Plan:
    return Plan.model_validate(
        {
            "goal": "store a note",
            "max_risk": "write",
            "budget": {"max_elapsed_seconds": 20},
            "steps": [{"id": "w", "capability": "notes.write", "input": {"note": "x"}}],
        }
    )
