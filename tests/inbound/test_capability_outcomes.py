"""After admission: timeouts, bad output, failures, idempotency, and failing closed on audit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import field_serializer

from capabilities import CallContext, CapabilityRegistry, ContractModel, capability
from gateway.client.peer_client import PeerClient
from gateway.errors import (
    AuditUnavailable,
    CapabilityFailed,
    CapabilityNotGranted,
    CapabilityTimeout,
    GatewayError,
    IdempotencyConflict,
    InvalidOutput,
    OutputTooLarge,
)
from gateway.runtime.agent import Agent
from tests.helpers.agents import (
    Pki,
    WriteCounter,
    agent_config,
    audit_rows,
    grant,
    started,
    write_policy,
)


class Size(ContractModel):
    n: int


class Blob(ContractModel):
    data: str


class Count(ContractModel):
    count: int


@capability("test.slow", "1.0.0", risk="read", timeout=0.2)
async def slow(inp: Size, ctx: CallContext) -> Blob:
    """Sleeps past its own timeout."""
    await asyncio.sleep(5)
    return Blob(data="")


@capability("test.liar", "1.0.0", risk="read")
async def liar(inp: Size, ctx: CallContext) -> Count:
    """Returns output that violates its contract."""
    return {"count": "many", "secret": "s3cr3t"}  # type: ignore[return-value]


class Unreadable(ContractModel):
    data: str

    @field_serializer("data")
    def _fails(self, value: str) -> str:
        raise ValueError("internal path /etc/secret")


@capability("test.unreadable", "1.0.0", risk="read")
async def unreadable(inp: Size, ctx: CallContext) -> Blob:
    """Returns a model that raises when it is turned into JSON."""
    return Unreadable(data="x")  # type: ignore[return-value]


@capability("test.big", "1.0.0", risk="read")
async def big(inp: Size, ctx: CallContext) -> Blob:
    """Returns n bytes of data."""
    return Blob(data="x" * inp.n)


@capability("test.crash", "1.0.0", risk="read")
async def crash(inp: Size, ctx: CallContext) -> Blob:
    """Raises with a message that must not reach the caller."""
    raise RuntimeError("internal path /etc/secret")


@capability("test.nested", "1.0.0", risk="read")
async def nested(inp: Size, ctx: CallContext) -> Blob:
    """Fails the way a refused nested peer call fails."""
    raise CapabilityNotGranted("capability not granted to this peer")


@pytest.fixture
async def agent(
    pki: Pki, tmp_path: Path, counter: WriteCounter, stores: dict[str, str]
) -> AsyncIterator[Agent]:
    registry = CapabilityRegistry()
    for cap in (slow, liar, unreadable, big, crash, nested, counter.capability()):
        registry.register(cap)
    policy = write_policy(
        tmp_path / "policy.toml",
        [
            grant(
                "bob",
                [
                    "test.slow",
                    "test.liar",
                    "test.unreadable",
                    "test.big",
                    "test.crash",
                    "test.nested",
                    "notes.write",
                ],
                max_payload_bytes=1000,
            )
        ],
    )
    agent = await started(agent_config(pki, tmp_path, "alice", policy, stores=stores), registry)
    yield agent
    await agent.stop()


@pytest.fixture
async def bob(pki: Pki, agent: Agent) -> AsyncIterator[PeerClient]:
    async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as client:
        yield client


@pytest.mark.parametrize(
    ("capability_name", "payload", "error"),
    [
        ("test.slow", {"n": 1}, CapabilityTimeout),
        ("test.liar", {"n": 1}, InvalidOutput),
        ("test.unreadable", {"n": 1}, InvalidOutput),
        ("test.big", {"n": 5000}, OutputTooLarge),
        ("test.crash", {"n": 1}, CapabilityFailed),
    ],
)
async def test_failures_after_admission(
    agent: Agent,
    bob: PeerClient,
    capability_name: str,
    payload: dict[str, Any],
    error: type[GatewayError],
) -> None:
    with pytest.raises(GatewayError) as info:
        await bob.invoke(capability_name, payload)
    assert type(info.value) is error
    assert "secret" not in info.value.message and "s3cr3t" not in info.value.message
    record = audit_rows(agent.config.audit_db)[-1]
    assert (record.decision, record.reason, record.served_version) == (
        "allow",
        error.reason,
        "1.0.0",
    )


async def test_repeated_idempotency_key_runs_the_write_once(
    agent: Agent, bob: PeerClient, counter: WriteCounter
) -> None:
    first = await bob.invoke("notes.write", {"note": "a"}, idempotency_key="task-1:step-1:0")
    again = await bob.invoke("notes.write", {"note": "a"}, idempotency_key="task-1:step-1:0")
    assert counter.calls == 1
    assert (first.remembered, again.remembered) == (False, True)
    assert again.payload == first.payload and again.evidence_sha256 == first.evidence_sha256
    await agent.audit.flush()
    assert [r.detail for r in audit_rows(agent.config.audit_db)[-2:]] == ["", "idempotent replay"]


async def test_concurrent_duplicates_wait_for_the_first(
    agent: Agent, bob: PeerClient, counter: WriteCounter
) -> None:
    results = await asyncio.gather(
        *[bob.invoke("notes.write", {"note": "a"}, idempotency_key="same-key") for _ in range(8)]
    )
    assert counter.calls == 1
    assert sorted(r.remembered for r in results) == [False] + [True] * 7


async def test_idempotency_key_with_other_payload_conflicts(
    agent: Agent, bob: PeerClient, counter: WriteCounter
) -> None:
    await bob.invoke("notes.write", {"note": "a"}, idempotency_key="k")
    with pytest.raises(IdempotencyConflict):
        await bob.invoke("notes.write", {"note": "b"}, idempotency_key="k")
    assert counter.calls == 1


async def test_idempotency_survives_restart(
    pki: Pki, tmp_path: Path, counter: WriteCounter, stores: dict[str, str]
) -> None:
    registry = CapabilityRegistry()
    registry.register(counter.capability())
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["notes.write"])])
    config = agent_config(pki, tmp_path, "alice", policy, stores=stores)
    for _ in range(2):
        agent = await started(config, registry)
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as client:
            await client.invoke("notes.write", {"note": "a"}, idempotency_key="durable")
        await agent.stop()
    assert counter.calls == 1


async def test_agent_refuses_work_it_cannot_audit(
    agent: Agent, bob: PeerClient, counter: WriteCounter
) -> None:
    await agent.audit.close()
    with pytest.raises(AuditUnavailable):
        await bob.invoke("notes.write", {"note": "a"})
    assert counter.calls == 0


class Probe(ContractModel):
    note: str


class Seen(ContractModel):
    admitted_before_running: bool


def _admission_probe(db: Path) -> object:
    @capability("test.audited_write", "1.0.0", risk="write")
    async def audited_write(inp: Probe, ctx: CallContext) -> Seen:
        """Looks in the audit log, from inside the side effect, for its own admission."""
        rows = audit_rows(db)
        return Seen(
            admitted_before_running=any(
                r.request_id == ctx.request_id and r.reason == "ADMITTED" for r in rows
            )
        )

    return audited_write


async def test_write_is_audited_before_it_runs(pki: Pki, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["test.audited_write"])])
    config = agent_config(pki, tmp_path, "alice", policy)
    registry = CapabilityRegistry()
    registry.register(_admission_probe(config.audit_db))  # type: ignore[arg-type]
    agent = await started(config, registry)
    try:
        async with PeerClient(agent.config.id, agent.address, pki.material("bob")) as bob:
            result = await bob.invoke("test.audited_write", {"note": "n"}, request_id="w-1")
        assert result.output() == {"admitted_before_running": True}
        await agent.audit.flush()
        assert [(r.request_id, r.decision, r.reason) for r in audit_rows(config.audit_db)] == [
            ("w-1", "allow", "ADMITTED"),
            ("w-1", "allow", "OK"),
        ]
    finally:
        await agent.stop()


async def test_refusal_inside_a_capability_is_not_passed_off_as_our_own(
    agent: Agent, bob: PeerClient
) -> None:
    with pytest.raises(GatewayError) as info:
        await bob.invoke("test.nested", {"n": 1})
    assert type(info.value) is CapabilityFailed
    assert "answered CAPABILITY_NOT_GRANTED" in info.value.message
    record = audit_rows(agent.config.audit_db)[-1]
    assert (record.decision, record.reason, record.detail) == (
        "allow",
        "CAPABILITY_FAILED",
        "CAPABILITY_NOT_GRANTED",
    )
